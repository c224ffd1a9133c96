"""The parameters the Prefect UI's launch form sends as it opens (Deployments > Run > Quick run or Custom run,
submitted unchanged): the deployment's own parameter values over every default of its parameter schema, filled in
recursively (each nested object's properties get their defaults too, as the form shows them)."""

import copy


def form_parameters(schema: dict, parameters: dict) -> dict:
    """What the form submits for a deployment whose parameter schema is `schema` (its `parameter_openapi_schema`) and
    whose parameters are `parameters`."""
    definitions = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    return _fill(schema, copy.deepcopy(parameters), definitions)


def _resolve(schema: dict, definitions: dict) -> dict:
    """`schema` with its `$ref` (and pydantic's one-item `allOf` around a described `$ref`) replaced by the target."""
    while "$ref" in schema or len(schema.get("allOf", [])) == 1:
        if "$ref" in schema:
            target = definitions[schema.pop("$ref").rsplit("/", 1)[-1]]
        else:
            [target] = schema.pop("allOf")
        schema = {**target, **schema}
    return schema


def _fill(schema: dict, value, definitions: dict):
    """`value` with every default of `schema` it lacks filled in, at every depth (objects, array items, the object
    branch of an optional object)."""
    schema = _resolve(dict(schema), definitions)
    if value is None:
        value = copy.deepcopy(schema.get("default"))
    if isinstance(value, dict):
        for branch in schema.get("anyOf", []):
            if "properties" in (branch := _resolve(dict(branch), definitions)):
                schema = branch
        for name, sub in schema.get("properties", {}).items():
            filled = _fill(sub, value.get(name), definitions)
            if filled is not None or "default" in _resolve(dict(sub), definitions):
                value[name] = filled
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [_fill(schema["items"], item, definitions) for item in value]
    return value

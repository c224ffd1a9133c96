"""The base layer: what every other layer builds on, with no ML library and no Prefect.

- `spec`: the job spec (pydantic models, rules, loading, its reference page);
- `jobdir`: the job folder and its files; `uris`: URIs, stores and model sources; `errors`: the shared exceptions;
- `policy` and `trust`: who may run what (the operator's policy for specs from deployments); `outbound`: requests
  to the spec's endpoints, bounded;
- `catalog`: the names the spec checks against (built-in rewards, grader types); `graders`, `templates`, `formula`,
  `judge`: the pure checks on a grader or a judge at validate;
- `scores`: how held-out scores are named and compared.
"""

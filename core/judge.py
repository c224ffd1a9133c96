"""An `llm_judge` entry's kwargs checked without a network or the environment: what validate says of a judge
(`grpoflow.trainers.rewards.judge` asks it), and of any endpoint a grader names."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from urllib.parse import urlsplit

from grpoflow.core.uris import ALLOW_LINK_LOCAL_ENV, link_local_address, url_credentials

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REQUIRED = ("base_url", "model", "rubric")
# kwarg -> (accepted types, a check on the value, the message when it fails); the defaults are get_llm_judge_reward's.
KWARG_CHECKS: dict[str, tuple[tuple[type, ...], Callable, str]] = {
    "base_url": (
        (str,),
        lambda v: urlsplit(v).scheme in ("http", "https") and bool(urlsplit(v).netloc),
        "an http(s) URL such as http://127.0.0.1:8000/v1",
    ),
    "model": ((str,), lambda v: bool(v.strip()), "the model name the endpoint serves"),
    "rubric": ((str,), lambda v: True, "a template with {completion}"),
    "api_key_env": (
        (str,),
        lambda v: ENV_NAME.fullmatch(v) is not None,
        "an environment variable NAME (the key stays in the environment)",
    ),
    "score_regex": ((str,), lambda v: True, "a regular expression"),
    "max_score": ((int, float), lambda v: v > 0, "a number > 0"),
    "concurrency": ((int,), lambda v: v >= 1, "an integer >= 1"),
    "timeout": ((int, float), lambda v: v > 0, "seconds > 0"),
    "retries": ((int,), lambda v: v >= 0, "an integer >= 0"),
    "backoff": ((int, float), lambda v: v >= 0, "seconds >= 0"),  # accepted for older specs; openai's applies
    "temperature": ((int, float), lambda v: v >= 0, "a number >= 0"),
    "max_tokens": ((int,), lambda v: v >= 1, "an integer >= 1"),
}


def judge_kwargs_problems(kwargs: dict) -> list[tuple[str, str]]:
    """The mistakes in an `llm_judge` entry's kwargs, found without a network or the environment: (kwarg, message).

    >>> for problem in judge_kwargs_problems({"model": "judge", "rubric": "{completion}", "retries": -1}):
    ...     print(problem)
    ('base_url', 'required: an http(s) URL such as http://127.0.0.1:8000/v1')
    ('retries', 'must be an integer >= 0, got -1')
    """
    problems = [(key, f"required: {KWARG_CHECKS[key][2]}") for key in REQUIRED if key not in kwargs]
    for key, value in kwargs.items():
        if key not in KWARG_CHECKS:
            problems.append((key, f"unknown llm_judge kwarg; choose from: {', '.join(KWARG_CHECKS)}"))
            continue
        kinds, ok, hint = KWARG_CHECKS[key]
        if isinstance(value, bool) or not isinstance(value, kinds) or not ok(value):
            # A key pasted where its variable's name belongs is not echoed into logs.
            got = "a value that is not one" if key == "api_key_env" else repr(value)
            problems.append((key, f"must be {hint}, got {got}"))
    if isinstance(kwargs.get("base_url"), str) and not any(key == "base_url" for key, _ in problems):
        problems += endpoint_problems(kwargs["base_url"])
    if isinstance(kwargs.get("rubric"), str):
        problems += [("rubric", p) for p in _rubric_problems(kwargs["rubric"])]
    if isinstance(kwargs.get("score_regex"), str):
        try:
            re.compile(kwargs["score_regex"])
        except re.error as exc:
            problems.append(("score_regex", f"not a valid regular expression: {exc}"))
    return problems


def endpoint_problems(base_url: str, resolve: bool = False) -> list[tuple[str, str]]:
    """An endpoint (a judge's, a model grader's, an embedding one's) holding a credential, or on a link-local /
    cloud-metadata address (the URL is not echoed). With `resolve`, its host name is looked up and every address it
    resolves to checked: what the requests would reach."""
    if where := url_credentials(base_url):
        return [("base_url", f"holds credentials ({where}); give the key's variable name in api_key_env instead")]
    if why := link_local_address(base_url, resolve=resolve):
        return [("base_url", f"{why}: refused as an endpoint; the operator allows it with {ALLOW_LINK_LOCAL_ENV}=1")]
    return []


def rubric_fields(rubric: str) -> list[str]:
    """The placeholders of a rubric template, in order, once each.

    >>> rubric_fields("Q: {prompt} A: {completion} (expected {answer}) {{literal}}")
    ['prompt', 'completion', 'answer']
    """
    fields = [name for _, name, _, _ in string.Formatter().parse(rubric) if name is not None]
    return list(dict.fromkeys(fields))


def _rubric_problems(rubric: str) -> list[str]:
    try:
        parts = list(string.Formatter().parse(rubric))
    except ValueError as exc:  # "Single '}' encountered in format string"
        return [f"not a valid template ({exc}); write {{{{ and }}}} for literal braces"]
    fields = [(name, spec, conversion) for _, name, spec, conversion in parts if name is not None]
    # A format spec or a conversion can grow the text without bound: {completion:>30000000} is 30 MB a request.
    problems = [
        f"placeholder {_shown(name, spec, conversion)} must be a plain name: {{prompt}}, {{completion}} or a dataset "
        "column, with no format spec (:...), conversion (!r), attribute (.x) or index ([0])"
        for name, spec, conversion in fields
        if spec or conversion or not FIELD_NAME.fullmatch(name)
    ]
    if "completion" not in (name for name, _, _ in fields):
        problems.append("must contain {completion}, the text the judge scores")
    return problems


def _shown(name: str, spec: str, conversion: str | None) -> str:
    """A placeholder as the rubric writes it, shortened to 40 characters."""
    written = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
    return written if len(written) <= 40 else written[:37] + "..."

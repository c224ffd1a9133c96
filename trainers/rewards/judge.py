"""The `llm_judge` reward: each completion scored by a chat model behind any OpenAI-compatible endpoint.

    rewards:
      - name: llm_judge
        kwargs:
          base_url: http://127.0.0.1:8000/v1     # the endpoint's /v1 root; POST {base_url}/chat/completions
          model: judge                           # the model name the endpoint serves
          api_key_env: JUDGE_KEY                 # the NAME of the variable holding the key (the key is never written)
          rubric: "Score 0-10 how well this answers {prompt}:\\n{completion}\\nReply with the score only."
          max_score: 10                          # scales the score to 0..1

The rubric is a template in `str.format`'s syntax: `{prompt}`, `{completion}` and any dataset column (`{answer}`),
each a plain name (no format spec, conversion, attribute or index: `{completion:>9999}` would grow each request);
write `{{` and `}}` for literal braces. The score is the first number of the judge's reply, or the first match of
`score_regex` (its first group when it has one); a reply without a score is `None` ("does not apply"), as TRL treats
it. The reward is `async def`: TRL runs it on its event loop next to the other rewards, and it sends up to
`concurrency` requests at a time with openai's `AsyncOpenAI`, which retries a 429, a 5xx, a lost connection or a
timeout `retries` times (0.5 s doubling to 8 s, or the server's Retry-After); its HTTP client
(`grpoflow.core.outbound.BoundedClient`) ends each attempt within `timeout` seconds in all (connection to last
byte), reads at most a capped reply and sends it only to the address checked.
"""

import asyncio
import logging
import os
import re
import string
from collections.abc import Awaitable, Callable
from inspect import Parameter, Signature

import httpx2

from grpoflow.core import outbound
from grpoflow.core.judge import endpoint_problems, judge_kwargs_problems, rubric_fields
from grpoflow.trainers.rewards import NUMBER
from grpoflow.trainers.rewards.text import completion_text

logger = logging.getLogger(__name__)


class JudgeError(RuntimeError):
    """The judge endpoint failed: unreachable, or an error status after every retry. The message names `base_url`
    and never carries the key."""


def get_llm_judge_reward(
    base_url: str,
    model: str,
    rubric: str,
    api_key_env: str | None = None,
    score_regex: str | None = None,
    max_score: float | None = None,
    concurrency: int = 8,
    timeout: float = 30.0,
    retries: int = 3,
    backoff: float | None = None,
    temperature: float = 0.0,
    max_tokens: int = 64,
) -> Callable:
    """Return `llm_judge_reward`, an async reward that asks a chat model behind an OpenAI-compatible endpoint to
    score each completion with `rubric`.

    Args:
        base_url (`str`): the endpoint's root, e.g. `http://127.0.0.1:8000/v1`; requests go to `/chat/completions`.
        model (`str`): the model name sent in each request.
        rubric (`str`): a `str.format` template with `{completion}` and optionally `{prompt}` and dataset columns.
        api_key_env (`str` or `None`, *optional*, defaults to `None`): the environment variable holding the key, sent
            as `Authorization: Bearer ...`; `None` sends none (a local server).
        score_regex (`str` or `None`, *optional*, defaults to `None`): where the score is in the reply (its first
            group when it has one); `None` takes the first number.
        max_score (`float` or `None`, *optional*, defaults to `None`): divides the score and clips it to 0..1;
            `None` keeps the raw score.
        concurrency (`int`, *optional*, defaults to `8`): requests in flight at once per reward call.
        timeout (`float`, *optional*, defaults to `30.0`): seconds per request in all, from connecting to the
            reply's last byte (GRPOFLOW_HTTP_DEADLINE_S may lower it).
        retries (`int`, *optional*, defaults to `3`): further attempts after a 429, a 5xx, a connection error or a
            timeout, openai's `max_retries`: 0.5 s before the first, doubling to 8 s, or the server's Retry-After.
        backoff (`float` or `None`, *optional*): accepted for older specs and unused (a warning says so): openai's
            client keeps its own waits.
        temperature (`float`, *optional*, defaults to `0.0`), max_tokens (`int`, *optional*, defaults to `64`): sent
            with each request.

    Raises:
        ValueError: bad kwargs (see `judge_kwargs_problems`), or `api_key_env` names an unset variable.

    Example:
    ```python
    >>> reward = get_llm_judge_reward("http://127.0.0.1:8000/v1", "judge", "Rate 0-10: {completion}", max_score=10)
    >>> reward.__name__, parse_score("8/10", None, 10)
    ('llm_judge_reward', 0.8)

    ```
    """
    given = {k: v for k, v in locals().items() if v is not None}
    # Here the endpoint's name is looked up too: what the requests would reach.
    if problems := judge_kwargs_problems(given) or endpoint_problems(base_url, resolve=True):
        raise ValueError("; ".join(f"kwargs.{key}: {message}" for key, message in problems))
    key = api_key_from_env(api_key_env) if api_key_env else None
    warn_backoff(backoff)
    pattern = re.compile(score_regex) if score_regex else None
    request = {"model": model, "temperature": temperature, "max_tokens": max_tokens}

    async def llm_judge_reward(completions: list, prompts: list | None = None, **kwargs) -> list[float | None]:
        columns = {k: v for k, v in kwargs.items() if isinstance(v, list) and len(v) == len(completions)}
        texts = [
            fill_rubric(rubric, _prompt_text(prompts[i] if prompts else ""), completion_text(c), columns, i)
            for i, c in enumerate(completions)
        ]
        gate = asyncio.Semaphore(concurrency)
        async with endpoint_client(base_url, key, timeout, retries) as client:

            async def judge(text: str) -> float | None:
                messages = [{"role": "user", "content": text}]
                async with gate:
                    response = await ask(
                        client.chat.completions.with_raw_response.create(**request, messages=messages), base_url
                    )
                return parse_score(reply_text(response, base_url), pattern, max_score)

            return list(await asyncio.gather(*(judge(t) for t in texts)))

    llm_judge_reward.base_url = base_url  # for the dry run's message when the endpoint does not answer in time
    # The rubric's dataset columns as required parameters, so `reward_columns` (and the ingest's column check) sees
    # them through the `__wrapped__` chain as it sees a plain function's.
    columns = [c for c in rubric_fields(rubric) if c not in ("prompt", "completion")]
    keyword = [Parameter(c, Parameter.KEYWORD_ONLY) for c in columns]
    llm_judge_reward.__signature__ = Signature(
        [
            Parameter("completions", Parameter.POSITIONAL_OR_KEYWORD),
            Parameter("prompts", Parameter.POSITIONAL_OR_KEYWORD, default=None),
            *keyword,
            Parameter("kwargs", Parameter.VAR_KEYWORD),
        ]
    )
    return llm_judge_reward


def api_key_from_env(variable: str) -> str:
    key = os.environ.get(variable)
    if not key:
        raise ValueError(
            f"kwargs.api_key_env: the environment variable {variable} is not set (or empty); export it where the "
            "job runs (the spec names the variable, never the key)"
        )
    return key


def fill_rubric(rubric: str, prompt: str, completion: str, columns: dict[str, list], row: int) -> str:
    """The rubric with `{prompt}`, `{completion}` and row `row` of each dataset column filled in.

    >>> fill_rubric("{prompt} -> {completion} (want {answer})", "2+2", "4", {"answer": ["4"]}, 0)
    '2+2 -> 4 (want 4)'
    """
    values = {name: column[row] for name, column in columns.items()}
    values.update(prompt=prompt, completion=completion)
    text = []
    # Each placeholder's value as text, its format spec and conversion ignored (the check refuses them): nothing the
    # rubric says can make a value longer than it is.
    for literal, name, _, _ in string.Formatter().parse(rubric):
        text.append(literal)
        if name is None:
            continue
        if name not in values:
            known = ", ".join(sorted(values))
            raise ValueError(f"the rubric's {{{name}}} is not a dataset column (have: {known})")
        text.append(str(values[name]))
    return "".join(text)


def _prompt_text(prompt) -> str:
    """A prompt as the judge reads it: a string as is, a chat as `role: content` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt or [])


def parse_score(reply: str, pattern: re.Pattern | None, max_score: float | None) -> float | None:
    """The score in a judge's reply: `pattern`'s first group (or match), else the first number; divided by
    `max_score` and clipped to 0..1 when given; `None` when the reply holds no score.

    >>> parse_score("Score: 7. Good.", None, None), parse_score("12 of 10!", None, 10), parse_score("meh", None, 10)
    (7.0, 1.0, None)
    >>> parse_score("2 steps; final score=[4]", re.compile(r"score=\\[(\\d+)\\]"), 5)
    0.8
    """
    match = pattern.search(reply) if pattern else NUMBER.search(reply)
    if match is None:
        return None
    text = match.group(1) if pattern and pattern.groups else match.group(0)
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    if max_score is None:
        return value
    return min(1.0, max(0.0, value / max_score))


def endpoint_client(base_url: str, key: str | None, timeout: float, retries: int):
    """An `openai.AsyncOpenAI` for an OpenAI-compatible endpoint (the judge's, a model grader's, an embedding one's).

    Args:
        base_url (`str`): the endpoint's `/v1` root.
        key (`str` or `None`): sent as `Authorization: Bearer ...`; `None` sends `EMPTY`, as vLLM's examples do for
            a server without a key.
        timeout (`float`): each attempt's total seconds, connection to last byte (`outbound.BoundedClient`).
        retries (`int`): openai's `max_retries`: further attempts after a 429, a 5xx, a lost connection or a timeout.

    Returns:
        `openai.AsyncOpenAI`: to be used in `async with` (it closes its connections).
    """
    import openai  # ~1 s to import: loaded where requests are sent, never by `grpoflow validate`

    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=key or "EMPTY",  # never OPENAI_API_KEY from this process's environment
        max_retries=retries,
        timeout=timeout,
        # Nor OPENAI_ORG_ID / OPENAI_PROJECT_ID: the endpoint may be anyone's.
        default_headers={"OpenAI-Organization": openai.omit, "OpenAI-Project": openai.omit},
        http_client=outbound.BoundedClient(timeout),
    )


def warn_backoff(backoff: float | None) -> None:
    if backoff is not None:
        logger.warning(
            "kwargs.backoff (of llm_judge or a model grader) is no longer used: openai's client waits 0.5 s before "
            "the first retry, doubling to 8 s, or what the server's Retry-After says; remove it from the spec"
        )


async def ask(request: Awaitable, base_url: str) -> httpx2.Response:
    """Awaits one request of openai's client made `with_raw_response` and returns its HTTP reply, read whole.

    Raises:
        JudgeError: the endpoint was unreachable or too slow on every attempt, answered an error status, sent a reply
            over the cap, or resolved to a refused address; the message names `base_url`, never the key.
    """
    import openai  # see endpoint_client

    try:
        return (await request).http_response
    except (openai.APIError, outbound.ResponseTooLarge, outbound.ForbiddenAddress) as exc:
        raise JudgeError(_failure(exc, base_url)) from None


def _failure(exc: Exception, base_url: str) -> str:
    """What went wrong, naming the endpoint; the attempts counted from the retry header openai sends."""
    if isinstance(exc, outbound.ResponseTooLarge):
        return f"the judge at {base_url} sent {exc}"
    if isinstance(exc, outbound.ForbiddenAddress):
        return f"the judge at {base_url}: {exc}"
    attempts = int(exc.request.headers.get("x-stainless-retry-count", "0")) + 1
    status = getattr(exc, "status_code", None)
    if status is not None:  # openai.APIStatusError
        counted = f" after {attempts} attempts" if status == 429 or status >= 500 or attempts > 1 else ""
        return f"the judge at {base_url} answered HTTP {status}{counted}: {outbound.reply_shown(exc.response)}"
    cause = exc.__cause__ or exc  # httpx2's error (refused, reset, DNS, the total deadline) under openai's
    what = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    return f"cannot reach the judge at {base_url} ({what}) after {attempts} attempts"


def reply_text(response: httpx2.Response, base_url: str) -> str:
    """A chat-completions reply's `choices[0].message.content` ("" when it is not text)."""
    try:
        content = outbound.reply_json(response)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeError(
            f"the judge at {base_url} sent no choices[0].message.content: {outbound.reply_shown(response)}"
        ) from None
    return content if isinstance(content, str) else ""

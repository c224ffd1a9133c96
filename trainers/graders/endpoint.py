"""Graders that ask an OpenAI-compatible endpoint: `score_model` and `label_model` (chat completions), and
`text_similarity` with `cosine` (embeddings), with `llm_judge`'s openai client
(`grpoflow.trainers.rewards.judge.endpoint_client`: its retries, total deadline and reply cap)."""

from __future__ import annotations

import asyncio
import math
import re

import httpx2

from grpoflow.core.outbound import reply_json, reply_shown
from grpoflow.trainers.graders.python import Graded
from grpoflow.trainers.graders.templates import render
from grpoflow.trainers.rewards.judge import (
    JudgeError,
    api_key_from_env,
    ask,
    endpoint_client,
    parse_score,
    reply_text,
    warn_backoff,
)

DEFAULT_EMBEDDING_MODEL = "text-embedding-3-large"  # what OpenAI's cosine metric embeds with


def _client(kwargs: dict):
    """An openai client for the endpoint, the key from its variable (never from the spec)."""
    key = api_key_from_env(kwargs["api_key_env"]) if kwargs.get("api_key_env") else None
    warn_backoff(kwargs.get("backoff"))
    return endpoint_client(kwargs["base_url"], key, kwargs.get("timeout", 30.0), kwargs.get("retries", 3))


def _messages(grader: dict, sample: dict, item: dict) -> list[dict]:
    """The grader's input messages with their templates filled in, as chat-completions messages of text."""
    messages = []
    for message in grader["input"]:
        content = message["content"]
        parts = content if isinstance(content, list) else [content]
        texts = [part if isinstance(part, str) else part.get("text", "") for part in parts]
        messages.append({"role": message["role"], "content": "\n".join(render(t, sample, item) for t in texts)})
    return messages


def _instruction(grader: dict) -> str:
    if grader["type"] == "score_model":
        low, high = grader.get("range") or (0, 1)
        return f"Answer with one number from {low:g} to {high:g} and nothing else."
    return f"Answer with exactly one of these labels and nothing else: {', '.join(grader['labels'])}."


def _request(grader: dict, kwargs: dict) -> dict:
    """The request's fields besides the messages: the model the endpoint serves and the grader's sampling_params."""
    request = {"model": kwargs.get("model") or grader["model"]}
    params = grader.get("sampling_params") or {}
    names = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "reasoning_effort": "reasoning_effort"}
    request |= {names[k]: v for k, v in params.items() if k in names and v is not None}
    if params.get("max_completions_tokens") is not None:
        request["max_tokens"] = params["max_completions_tokens"]
    return request


def read_label(reply: str, labels: list[str]) -> str | None:
    """The label a model answered: the whole reply (quotes, a full stop and case aside), else the longest label
    standing alone as a word in it; None when there is none.

    >>> read_label(" 'Correct'.", ["correct", "incorrect"]), read_label("I'd say incorrect", ["correct", "incorrect"])
    ('correct', 'incorrect')
    """
    bare = reply.strip().strip("\"'`*.").strip().lower()
    for label in labels:
        if bare == label.lower():
            return label
    for label in sorted(labels, key=len, reverse=True):
        if re.search(rf"(?<!\w){re.escape(label.lower())}(?!\w)", reply.lower()):
            return label
    return None


def score_reply(grader: dict, reply: str) -> Graded:
    """One model grader's score from the model's reply."""
    if grader["type"] == "score_model":
        low, high = grader.get("range") or (0, 1)
        value = parse_score(reply, None, None)
        if value is None or not math.isfinite(value):
            return Graded(None, f"the model answered no number: {reply[:100]!r}")
        return Graded(min(max(value, low), high))
    label = read_label(reply, grader["labels"])
    if label is None:
        return Graded(None, f"the model answered none of the labels: {reply[:100]!r}")
    return Graded(float(label in grader["passing_labels"]))


def model_scorer(grader: dict, kwargs: dict):
    """Scores with a `score_model` or `label_model` grader: one chat request per completion."""
    base_url, request, instruction = kwargs["base_url"], _request(grader, kwargs), _instruction(grader)

    async def score(samples: list[dict], items: list[dict]) -> list[Graded]:
        gate = asyncio.Semaphore(kwargs.get("concurrency", 8))

        async def one(client, sample: dict, item: dict) -> Graded:
            messages = [*_messages(grader, sample, item), {"role": "user", "content": instruction}]
            async with gate:
                response = await ask(
                    client.chat.completions.with_raw_response.create(**request, messages=messages), base_url
                )
            return score_reply(grader, reply_text(response, base_url))

        async with _client(kwargs) as client:
            return list(await asyncio.gather(*(one(client, s, i) for s, i in zip(samples, items, strict=True))))

    return score


def _embeddings(response: httpx2.Response, base_url: str) -> list[list[float]]:
    try:
        data = sorted(reply_json(response)["data"], key=lambda d: d.get("index", 0))
        return [[float(x) for x in d["embedding"]] for d in data]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise JudgeError(f"the endpoint at {base_url} sent no data[].embedding: {reply_shown(response)}") from None


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two vectors (0 when either is all zeros).

    >>> cosine([1.0, 0.0], [1.0, 1.0])
    0.7071067811865475
    """
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def cosine_scorer(grader: dict, kwargs: dict):
    """Scores with `text_similarity` `cosine`: the input and the reference embedded in one request per completion."""
    base_url, model = kwargs["base_url"], kwargs.get("embedding_model", DEFAULT_EMBEDDING_MODEL)

    async def score(samples: list[dict], items: list[dict]) -> list[Graded]:
        gate = asyncio.Semaphore(kwargs.get("concurrency", 8))

        async def one(client, sample: dict, item: dict) -> Graded:
            texts = [render(grader["input"], sample, item), render(grader["reference"], sample, item)]
            async with gate:
                embedded = client.embeddings.with_raw_response.create(
                    model=model, input=texts, encoding_format="float"
                )
                vectors = _embeddings(await ask(embedded, base_url), base_url)
            if len(vectors) != 2 or len(vectors[0]) != len(vectors[1]):
                return Graded(None, f"the endpoint sent {len(vectors)} embeddings for 2 texts")
            return Graded(cosine(vectors[0], vectors[1]))

        async with _client(kwargs) as client:
            return list(await asyncio.gather(*(one(client, s, i) for s, i in zip(samples, items, strict=True))))

    return score

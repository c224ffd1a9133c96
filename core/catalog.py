"""The names a job spec is checked against, kept here so the spec imports no implementation: the built-in rewards
(`grpoflow.trainers.rewards.builtin.REWARDS` holds their functions, under exactly these names) and the OpenAI grader
types grpoflow scores (`grpoflow.trainers.graders` scores them)."""

from __future__ import annotations

from typing import NamedTuple

# A `rewards:` entry's `name` without `function:` or `grader:`; a test holds REWARDS to this list.
BUILTIN_REWARDS = ("answer_format", "exact_answer", "length_penalty", "llm_judge", "numeric_match")


class GraderType(NamedTuple):
    """What grpoflow holds about one OpenAI grader type."""

    openai: str  # its model in `openai.types.graders`, which validate checks the object with
    asks: str | None = None  # "endpoint": a model at an OpenAI-compatible chat endpoint; "sandbox": its own code
    pass_threshold: bool = False  # OpenAI's Evals give it one: a grader copied from an eval keeps it, unread


# The grader types grpoflow scores: the one table of them, which the lists below, validate's checks (`checks`), the
# spec's description and the trust check (code carried in the spec) are derived from.
GRADERS = {
    "string_check": GraderType("StringCheckGrader"),
    "text_similarity": GraderType("TextSimilarityGrader", pass_threshold=True),  # cosine asks an embeddings endpoint
    "score_model": GraderType("ScoreModelGrader", "endpoint", pass_threshold=True),
    "label_model": GraderType("LabelModelGrader", "endpoint"),
    "python": GraderType("PythonGrader", "sandbox", pass_threshold=True),
    "multi": GraderType("MultiGrader"),
}
GRADER_TYPES = tuple(GRADERS)
MODEL_GRADERS = tuple(kind for kind, grader in GRADERS.items() if grader.asks == "endpoint")
CODE_GRADERS = tuple(kind for kind, grader in GRADERS.items() if grader.asks == "sandbox")

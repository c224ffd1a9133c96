"""OpenAI grader objects as rewards: a `grader:` entry in a spec's rewards, scored as OpenAI's grader guide defines it.

    rewards:
      - grader:                                # the object as OpenAI's fine-tuning API takes it, unchanged
          type: string_check
          name: exact                          # the reward's name: TRL logs rewards/exact/mean
          input: "{{ sample.output_text }}"
          reference: "{{ item.answer }}"
          operation: eq

- `templates`: `{{ item.<column> }}` and `{{ sample.output_text }}` / `{{ sample.output_json.<key> }}`.
- `checks`: a grader checked at validate with the `openai` package's own grader types, every problem with its path.
- `similarity`: `text_similarity`'s metrics, each computed by the library that defines it.
- `formula`: `multi`'s `calculate_output`, evaluated over a small grammar (never `eval`).
- `python`: a `python` grader's `grade(sample, item)`, run in a process of its own.
- `reward`: `get_grader_reward`, the TRL reward a grader entry becomes (model graders ask an OpenAI-compatible
  endpoint, as `llm_judge` does).
- `run`: `grpoflow graders run`, every reward of a spec on given completions, as training would score them.
"""

from __future__ import annotations

from typing import NamedTuple


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

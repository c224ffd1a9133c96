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

GRADER_TYPES = ("string_check", "text_similarity", "score_model", "label_model", "python", "multi")
MODEL_GRADERS = ("score_model", "label_model")

"""OpenAI grader objects as rewards: a `grader:` entry in a spec's rewards, scored as OpenAI's grader guide defines it.

    rewards:
      - grader:                                # the object as OpenAI's fine-tuning API takes it, unchanged
          type: string_check
          name: exact                          # the reward's name: TRL logs rewards/exact/mean
          input: "{{ sample.output_text }}"
          reference: "{{ item.answer }}"
          operation: eq

- `templates`: `{{ item.<column> }}` and `{{ sample.output_text }}` / `{{ sample.output_json.<key> }}`.
- `similarity`: `text_similarity`'s metrics, each computed by the library that defines it.
- `python`: a `python` grader's `grade(sample, item)`, run in a process of its own.
- `reward`: `get_grader_reward`, the TRL reward a grader entry becomes (model graders ask an OpenAI-compatible
  endpoint, as `llm_judge` does).
- `run`: `grpoflow graders run`, every reward of a spec on given completions, as training would score them.

The table of grader types is `grpoflow.core.catalog.GRADERS`; what validate checks of a grader (against the
`openai` package's own types; templates; `multi`'s formula, `grpoflow.core.formula`) is `grpoflow.core.graders`.
"""

"""`grpoflow graders run SPEC.yaml`: every reward of a spec on given completions, scored as training would score them.

    grpoflow graders run job.yaml --completions completions.jsonl --rows 100
    grpoflow graders run job.yaml --json            # the dataset's own `completion` column

Completions come from a JSONL file of `{"row": i, "completion": ...}` (`i` the 0-based row of the dataset as given,
before any hold-out split; the completion a string, or assistant messages for chat prompts), or from the dataset's
`completion` column. Each reward is built from the spec (graders, built-ins, functions, reward models) and called
with what TRL's GRPOTrainer passes it: the prompts as training shapes them (the system prompt applied), the
completions in the prompts' shape, the other columns as keyword lists, each reward its own copy. The total is the
weighted sum training takes, a reward's None counting 0 (TRL sums with `nansum`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from grpoflow.core.spec import JobSpec, SpecError
from grpoflow.trainers.graders.reward import held_warnings
from grpoflow.trainers.model.load import prepare_prompts
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward, check_output
from grpoflow.trainers.rewards.dry_run import call_reward, trl_columns

BATCH = 256  # completions per reward call: a python grader starts one process per call


class CompletionsError(SpecError):
    """A `--completions` file that is missing or malformed: the command's input, not the spec (exit 2 as one)."""

    def __init__(self, path: Path, problems: list[str] | str):
        super().__init__(problems)
        self.args = (f"--completions {path}: " + "; ".join(self.problems),)


@dataclass
class Scores:
    """What `score_completions` found: per row its rewards and total, and each reward's unscored completions."""

    names: list[str]
    rows: list[dict] = field(default_factory=list)  # {"row": i, "rewards": {name: value}, "total": x}
    errors: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # name -> [(row, reason)]

    def as_json(self) -> dict:
        return {"scores": self.rows}


def read_completions(path: Path, num_rows: int, limit: int | None) -> list[tuple[int, object]]:
    """(row, completion) pairs from a JSONL file, each line checked; the first `limit` lines when given.

    Raises:
        CompletionsError: the file is missing, or a line is not `{"row": i, "completion": ...}` with `i` a dataset
            row.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CompletionsError(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompletionsError(path, f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    pairs, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            problems.append(f"line {number}: not JSON ({exc})")
            continue
        row = record.get("row") if isinstance(record, dict) else None
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < num_rows:
            problems.append(f'line {number}: "row" must be a dataset row, 0 to {num_rows - 1}')
        elif not isinstance(record.get("completion"), str | list):
            problems.append(f'line {number}: "completion" must be text or a list of messages')
        else:
            pairs.append((row, record["completion"]))
        if limit is not None and len(pairs) >= limit:
            break
    if problems:
        raise CompletionsError(path, problems)
    return pairs


def _completions(spec: JobSpec, dataset, completions: Path | None, limit: int | None) -> list[tuple[int, object]]:
    if completions is not None:
        return read_completions(completions, len(dataset), limit)
    if "completion" not in dataset.column_names:
        raise SpecError(
            f"dataset {spec.dataset.uri} has no 'completion' column to score (its columns: "
            f"{', '.join(dataset.column_names)}); give the completions with --completions FILE.jsonl"
        )
    count = len(dataset) if limit is None else min(limit, len(dataset))
    return [(i, dataset[i]["completion"]) for i in range(count)]


def score_completions(
    spec: JobSpec, completions: Path | None = None, rows: int | None = None, storage_options: dict | None = None
) -> Scores:
    """Scores completions with every reward of `spec` (see the module's docstring).

    Args:
        spec (`JobSpec`): the job spec.
        completions (`Path` or `None`, *optional*): a JSONL of `{"row": i, "completion": ...}`; None: the dataset's
            `completion` column.
        rows (`int` or `None`, *optional*): score only the first `rows` completions.
        storage_options (`dict` or `None`, *optional*): fsspec options for a remote dataset.

    Raises:
        SpecError: bad completions, a dataset that does not load, or a reward that cannot be built or that fails.
    """
    import datasets

    from grpoflow.core.errors import DatasetError
    from grpoflow.trainers.dataset import read_dataset

    datasets.disable_progress_bars()  # a bar per loading step would bury the table
    column = spec.dataset.prompt_column
    try:
        dataset = read_dataset(
            spec.dataset.uri,
            prompt_column=column,
            split=spec.dataset.split,
            storage_options=storage_options,
            max_row_bytes=spec.dataset.max_row_bytes,
        )
        rewards = [build_reward(r.name, r.function, r.kwargs, r.model, r.grader, column) for r in spec.rewards]
    except DatasetError as exc:
        raise SpecError(exc.problems) from None
    except RewardError as exc:
        raise SpecError(str(exc)) from None
    pairs = _completions(spec, dataset, completions, rows)
    shaped = prepare_prompts(dataset, column, spec.hyperparameters.system_prompt)
    scores = Scores([r.name for r in spec.rewards])
    values: dict[str, list] = {}
    for start in range(0, len(pairs), BATCH):
        batch = pairs[start : start + BATCH]
        records = [shaped[i] for i, _ in batch]
        prompts = [r["prompt"] for r in records]
        texts = [_shaped(c, p) for (_, c), p in zip(batch, prompts, strict=True)]
        columns = trl_columns({k: [r[k] for r in records] for k in shaped.column_names})
        for entry, reward in zip(spec.rewards, rewards, strict=True):
            try:
                with held_warnings():  # dropped: this command prints its own count of what was not scored
                    got = call_reward(reward, prompts, texts, [[] for _ in texts], columns)
            except Exception as exc:  # the user's reward raised: named, exit 2
                raise SpecError(f"reward {entry.name!r} raised {type(exc).__name__}: {exc}") from None
            if (problem := check_output(got, len(texts))) is not None:
                raise SpecError(f"reward {entry.name!r} {problem}")
            values.setdefault(entry.name, []).extend(got)
            for (row, _), error in zip(batch, _errors(reward), strict=False):
                if error is not None:
                    scores.errors.setdefault(entry.name, []).append((row, error))
    for name, errors in scores.errors.items():
        if len(errors) == len(pairs) and all(value is None for value in values[name]):
            row, reason = errors[0]
            raise SpecError(f"reward {name!r} scored none of the {len(pairs)} completions (row {row}: {reason})")
    weights = {r.name: r.weight for r in spec.rewards}
    for k, (row, _) in enumerate(pairs):
        got = {name: values[name][k] for name in scores.names}
        total = sum(weights[n] * v for n, v in got.items() if v is not None)
        scores.rows.append({"row": row, "rewards": got, "total": total})
    return scores


def _errors(reward) -> list[str | None]:
    """Why a grader's last call left completions unscored (its `errors`, under the wrappers); [] for other rewards."""
    while reward is not None and not hasattr(reward, "errors"):
        reward = getattr(reward, "__wrapped__", None)
    return getattr(reward, "errors", None) or []


def _shaped(completion: object, prompt: object) -> object:
    """A completion in the shape TRL gives rewards: assistant messages when the prompt is a chat, else text."""
    if isinstance(prompt, list) and isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    if isinstance(prompt, str) and isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return completion


def table(scores: Scores) -> str:
    """The scores as a text table: a row per completion, a column per reward and the total, then each reward's mean
    and what it could not score."""
    header = ["row", *scores.names, "total"]
    lines = [[str(r["row"]), *(_cell(r["rewards"][n]) for n in scores.names), _cell(r["total"])] for r in scores.rows]
    means = [_mean([r["rewards"][n] for r in scores.rows]) for n in scores.names]
    lines.append(["mean", *means, _mean([r["total"] for r in scores.rows])])
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    text = [" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [header, *lines]]
    for name, errors in scores.errors.items():
        row, reason = errors[0]
        text.append(f"{name}: {len(errors)} completion(s) not scored (None); first, row {row}: {reason}")
    return "\n".join(text)


def _cell(value: float | None) -> str:
    return "None" if value is None else f"{value:.4f}"


def _mean(values: list) -> str:
    scored = [v for v in values if v is not None and math.isfinite(v)]
    return f"{sum(scored) / len(scored):.4f}" if scored else "None"

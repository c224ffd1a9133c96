"""Rollouts you can read: what the model wrote at each kept GRPO step, with every reward's score, and what it wrote on
the held-out prompts at each evaluation, as Parquet files in the job folder (`FILES` in core/jobdir.py).

- `rollouts/step-<NNNNNN>.parquet`, one row per completion of a kept step (`rollouts.every`,
  `rollouts.groups_per_step`): `step`, `group` (the prompt's index in the step), `prompt` (text, or the chat as
  JSON; every place a person reads it shows a chat as its last user message, `prompt_text`), `completion`,
  `reward` (the weighted total TRL optimises), `rewards.<name>` (each reward's own score, null where it scored
  nothing), `advantage`, `completion_tokens`, `truncated`.
- `evaluation/step-<NNNNNN>.parquet`, one row per held-out prompt at each held-out evaluation (step 0: the model GRPO
  started from): `row` (the prompt's index), `sample` (which of its `evaluation.samples` completions), `prompt`,
  `completion`, `score`.

The rows are TRL's own: `rollouts_callback` reads, at each logged step, what `GRPOTrainer` keeps of its latest
generation for its completion logging (the prompts, completions, each reward's scores and the advantages it
computed), and `CompletionProbe`, wrapped around the first reward function, hands TRL each completion's token count
and whether it was cut through TRL's `log_extra` hook, so that they arrive in the same rows, gathered across
processes. Nothing is recomputed.

Training does not wait for the files: a background thread writes them, except the file of a step followed by a
checkpoint, which is written in the loop once the thread's queue is drained (a few milliseconds, every
`checkpoint_every` steps; benchmarks/rollouts.py measures it). Exactly once per step, across crashes and resumes, as
`metrics.jsonl`: files are named by their step and put in place atomically, a checkpoint on disk has every kept step up
to it on disk too, and a resumed run first deletes the files of the steps after its checkpoint
(`truncate_rollouts`), which it trains again. A "step" here is one that generated: with TRL's `num_iterations` or
`steps_per_generation` above 1, the steps that reuse a generation keep no file of their own.

The same callback logs `completions/degenerate_ratio` at every such step: the share of the step's completions that are
empty or one short stretch of text over and over (`degenerate`), which the `degenerate_completions` health alert
watches. Reading needs pyarrow only.
"""

import functools
import inspect
import json
import math
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from grpoflow.core.jobdir import JobDir

DEGENERATE_KEY = "completions/degenerate_ratio"
_STEP_FILE = "step-{:06d}.parquet"
# A completion whose last this-many characters hold few distinct 4-character stretches is one repeated stretch; only
# the tail is looked at, so that the check costs at most ~1 ms per completion however long they grow.
_TAIL = 2048
_MIN_CHARS = 8  # shorter completions ("42", "yes") are answers, never degenerate unless empty


# --- files -----------------------------------------------------------------------------------------------------------


def step_file(folder: Path, step: int) -> Path:
    """`<folder>/step-<NNNNNN>.parquet`."""
    return Path(folder) / _STEP_FILE.format(step)


def kept_steps(folder: Path) -> list[int]:
    """The steps that have a file in `folder` (`rollouts/` or `evaluation/`), in order."""
    folder = Path(folder)
    names = folder.glob("step-*.parquet") if folder.is_dir() else []
    return sorted(int(p.stem.removeprefix("step-")) for p in names if p.stem.removeprefix("step-").isdigit())


def read_rows(path: Path) -> list[dict]:
    """The rows of one step's file, as dicts."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def write_rows(path: Path, columns: dict[str, list]) -> None:
    """Writes `columns` as a Parquet file at `path`, through a hidden temporary file beside it, so that a reader (or
    a crash) never sees half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # No dictionary pages or column statistics: a step's few rows gain nothing from them, and they were a fifth of the
    # write (~0.2 ms a step, beside training on the same cores). Built in memory and written in one call: Arrow's
    # own file output cost a quarter of the write more (0.75 against 0.57 ms a step, benchmarks/trainer_vs_trl.py).
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), buffer, use_dictionary=False, write_statistics=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(buffer.getvalue())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def truncate_rollouts(job: JobDir, last_step: int) -> None:
    """Deletes the rollouts and held-out files of the steps after `last_step` (the checkpoint a run resumes from,
    which trains them again) and any temporary file a killed write left."""
    for folder in (job.rollouts, job.evaluation_rollouts):
        if not folder.is_dir():
            continue
        for path in folder.glob(".step-*"):
            path.unlink(missing_ok=True)
        for step in kept_steps(folder):
            if step > last_step:
                step_file(folder, step).unlink(missing_ok=True)


# --- rows ------------------------------------------------------------------------------------------------------------


def as_text(value, chat_as_json: bool = True) -> str:
    """A prompt or completion as the files keep it: text as it is; a chat as JSON, except a completion of one
    message (`chat_as_json=False`), which is that message's content."""
    if isinstance(value, str):
        return value
    if not chat_as_json and isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        return str(value[0].get("content", ""))
    return json.dumps(value, ensure_ascii=False, default=str)


def _chat(prompt) -> list[dict] | None:
    """`prompt`'s messages when it is a chat (a list of `{role, content}` messages, or the JSON the files keep of
    one); None for text."""
    if isinstance(prompt, str) and prompt.startswith("[{"):
        try:
            prompt = json.loads(prompt)
        except ValueError:
            return None
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt):
        return prompt
    return None


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # multimodal parts: their text
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part)
    return "" if content is None else str(content)


def prompt_text(prompt) -> str:
    """A prompt as a person reads it in a row of rollouts: text as it is; a chat (messages, or the JSON the files keep
    of one) as its last user message, the system prompt apart (`system_text`), so that a cut row still shows the
    question.

    >>> chat = [{"role": "system", "content": "Reply with just the number."}, {"role": "user", "content": "2+2?"}]
    >>> prompt_text(chat), prompt_text(json.dumps(chat)), prompt_text("2+2?")
    ('2+2?', '2+2?', '2+2?')
    """
    messages = _chat(prompt)
    if messages is None:
        return as_text(prompt)
    users = [m for m in messages if m["role"] == "user"] or messages
    return _content(users[-1])


def system_text(prompt) -> str | None:
    """The system prompt of a chat prompt (see `prompt_text`); None for text or a chat without one."""
    messages = _chat(prompt) or []
    system = [_content(m) for m in messages if m["role"] == "system"]
    return "\n".join(system) if system else None


def shared_system_text(prompts: list) -> str | None:
    """The system prompt every one of `prompts` has, shown once beside rows that leave it out; None when they have
    none, or differ."""
    systems = {system_text(p) for p in prompts}
    return systems.pop() if len(systems) == 1 else None


def _number(value) -> float | None:
    # TRL's NaN (a reward that scored nothing) is null in the files.
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def weighted_total(scores: list, weights: list[float]) -> float | None:
    """The reward TRL optimises for one completion: the weighted sum of the rewards that scored it; None when none
    did (TRL's NaN).

    >>> weighted_total([1.0, None, 0.5], [1.0, 2.0, 2.0])
    2.0
    """
    scored = [w * s for s, w in zip(scores, weights, strict=True) if _number(s) is not None]
    return sum(scored) if scored else None


def rollout_columns(step: int, logged: dict, weights: list[float], group_size: int, groups: int | None) -> dict:
    """The columns of one step's rollouts file from what TRL logged of its generation (`logged`: lists `prompt`,
    `completion`, `advantages`, a dict `rewards` by reward name, a dict `extra` by column).

    Args:
        step (`int`): the step.
        logged (`dict`): one list per field, one entry per completion, in TRL's order (a group's completions are
            consecutive).
        weights (`list[float]`): the rewards' weights, in the order of `logged["rewards"]`.
        group_size (`int`): completions per prompt (rollouts_per_prompt).
        groups (`int`, *optional*): keep the first this many groups; None keeps them all.
    """
    rows = len(logged["completion"])
    if groups is not None:
        rows = min(rows, groups * group_size)
    names = list(logged["rewards"])
    scores = [[_number(logged["rewards"][name][i]) for name in names] for i in range(rows)]
    extra = logged.get("extra") or {}
    tokens, truncated = extra.get("completion_tokens"), extra.get("truncated")
    return {
        "step": [step] * rows,
        "group": [i // group_size for i in range(rows)],
        "prompt": [as_text(p) for p in logged["prompt"][:rows]],
        "completion": [as_text(c, chat_as_json=False) for c in logged["completion"][:rows]],
        "reward": [weighted_total(s, weights) for s in scores],
        **{f"rewards.{name}": [s[j] for s in scores] for j, name in enumerate(names)},
        "advantage": [_number(a) for a in logged["advantages"][:rows]],
        "completion_tokens": list(tokens[:rows]) if tokens else [None] * rows,
        "truncated": list(truncated[:rows]) if truncated else [None] * rows,
    }


def reward_names(row: dict) -> list[str]:
    """The reward names of a rollouts row (its `rewards.<name>` columns)."""
    return [key.removeprefix("rewards.") for key in row if key.startswith("rewards.")]


# --- degenerate completions ------------------------------------------------------------------------------------------


def degenerate(text: str) -> str | None:
    """Why a completion is degenerate, or None: `"empty"` (nothing but whitespace) or `"repeated"` (one token or
    n-gram over and over: its text, or its last 2048 characters, holds so few distinct 4-character stretches that
    some stretch of at most a quarter of its length repeats at least about four times, allowing a short lead-in).

    >>> degenerate("iiiiiiiiii"), degenerate("  "), degenerate("The answer is 42."), degenerate("1111")
    ('repeated', 'empty', None, None)
    """
    text = as_text(text, chat_as_json=False).strip()
    if not text:
        return "empty"
    text = text[-_TAIL:]
    if len(text) < _MIN_CHARS:
        return None
    distinct = len(set(zip(text, text[1:], text[2:], text[3:], strict=False)))
    return "repeated" if 4 * distinct <= len(text) - 3 else None


def degenerate_share(completions: list) -> float | None:
    """The share of `completions` that are degenerate; None for none."""
    return sum(degenerate(c) is not None for c in completions) / len(completions) if completions else None


# --- during training -------------------------------------------------------------------------------------------------


class CompletionProbe:
    """Wraps a reward function so that each call also hands TRL, through its `log_extra` hook, each completion's
    token count (`completion_tokens`, as TRL's `completions/mean_length` counts them) and whether generation cut it at
    max_response_length (`truncated`: its last token is not an end token, TRL's `completions/clipped_ratio` rule).
    `stop_ids` is set once the trainer exists (its `eos_token_ids` and the pad token)."""

    def __init__(self):
        self.stop_ids: set[int] = set()

    def _log(self, completion_ids, log_extra) -> None:
        if log_extra is None or completion_ids is None:
            return
        log_extra("completion_tokens", [len(ids) for ids in completion_ids])
        log_extra("truncated", [not ids or ids[-1] not in self.stop_ids for ids in completion_ids])

    def wrap(self, reward: Callable) -> Callable:
        """`reward`, logging the two columns before each call; its name and async-ness kept."""
        if inspect.iscoroutinefunction(reward):

            async def probed(*args, **kwargs):
                self._log(kwargs.get("completion_ids"), kwargs.get("log_extra"))
                return await reward(*args, **kwargs)

        else:

            def probed(*args, **kwargs):
                self._log(kwargs.get("completion_ids"), kwargs.get("log_extra"))
                return reward(*args, **kwargs)

        return functools.wraps(reward)(probed)


def write_or_say(path: Path, columns: dict) -> None:
    """`write_rows`, a failure said on stderr: a full disk fails the next checkpoint anyway, and the rollouts never
    fail training."""
    try:
        write_rows(path, columns)
    except Exception as e:
        print(f"grpoflow: could not write {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


class _Writer(threading.Thread):
    """Writes queued files in the background; `drain()` waits until every queued file is on disk."""

    def __init__(self):
        super().__init__(name="grpoflow-rollouts", daemon=True)
        self.jobs: queue.Queue = queue.Queue()
        self.seconds = 0.0  # spent writing, beside training
        self.cpu_seconds = 0.0  # this thread's CPU time in them: a cost of the run that no step's timing shows
        self.start()

    def run(self) -> None:
        while True:
            path, columns = self.jobs.get()
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                write_or_say(path, columns)
            finally:
                self.seconds += time.perf_counter() - started
                self.cpu_seconds += time.thread_time() - cpu
                self.jobs.task_done()

    def drain(self) -> None:
        self.jobs.join()


def logged_generation(trainer) -> dict:
    """A copy of what `GRPOTrainer` keeps of its latest generation for its completion logging (`_logs`: a list per
    field, or per reward and per extra column, one entry per completion of all processes)."""
    logs = trainer._logs
    return {
        "prompt": list(logs["prompt"]),
        "completion": list(logs["completion"]),
        "advantages": list(logs["advantages"]),
        "rewards": {name: list(logs["rewards"][name]) for name in trainer.reward_func_names},
        "extra": {name: list(values) for name, values in logs["extra"].items()},
    }


def rollouts_callback(job: JobDir, spec):
    """A `TrainerCallback` that, at each step TRL logs a generation's scores (the record has `reward`; with TRL's
    `num_iterations` or `steps_per_generation` above 1, only the steps that generate), adds
    `completions/degenerate_ratio` to the step's record and, at every `rollouts.every`-th such step, has its rollouts
    file written: by a background thread, or, at a step followed by a checkpoint, an evaluation or the end of
    training, in the loop once the thread's queue is drained. Main process only. It must come before
    `metrics_file_callback` in the trainer's callbacks, so that metrics.jsonl gets the ratio, and its `.trainer`
    must be set to the trainer once it is built (the callback reads the trainer's logged generation).

    `.summary()` says what it kept and what it cost: files, seconds in the training loop (the files written there
    included), seconds the thread spent writing beside it and the CPU seconds it used.
    """
    from transformers import TrainerCallback

    every, groups = spec.rollouts.every, spec.rollouts.groups_per_step
    group_size = spec.hyperparameters.rollouts_per_prompt

    class _RolloutsCallback(TrainerCallback):
        def __init__(self):
            self.trainer, self.writer, self.files, self.loop_seconds = None, None, 0, 0.0

        def on_log(self, args, state, control, logs=None, **kwargs):
            # TRL logs `reward` only for a step that scored a new generation: never twice for one generation.
            if not state.is_world_process_zero or not logs or "reward" not in logs:
                return
            started = time.perf_counter()
            trainer = self.trainer
            logged = logged_generation(trainer)
            logs[DEGENERATE_KEY] = degenerate_share(logged["completion"])
            step = state.global_step
            # Before a checkpoint (or an evaluation, or the end), every kept step up to this one is on disk: this
            # step's file is written here, after the thread's queue; other steps' files are the thread's.
            now = control.should_save or control.should_evaluate or control.should_training_stop
            if now:
                self.drain()
            if every and step % every == 0:
                weights = [float(w) for w in trainer.reward_weights.tolist()]
                columns = rollout_columns(step, logged, weights, group_size, groups)
                path = step_file(job.rollouts, step)
                if now:
                    write_or_say(path, columns)
                else:
                    self.writer = self.writer or _Writer()
                    self.writer.jobs.put((path, columns))
                self.files += 1
            self.loop_seconds += time.perf_counter() - started

        def on_train_end(self, args, state, control, **kwargs):
            self.drain()

        def drain(self) -> None:
            if self.writer is not None:
                self.writer.drain()

        def summary(self) -> dict:
            self.drain()
            writer = self.writer
            return {
                "files": self.files,
                "loop_seconds": round(self.loop_seconds, 4),
                "write_seconds": round(writer.seconds if writer else 0.0, 4),
                "write_cpu_seconds": round(writer.cpu_seconds if writer else 0.0, 4),
            }

    return _RolloutsCallback()


def write_held_out(job: JobDir, step: int, prompts: list, completions: list, scores: list, samples: int = 1) -> Path:
    """`evaluation/step-<NNNNNN>.parquet`: each held-out prompt's completion and score at `step` (0: the model GRPO
    started from); with `samples` completions per prompt, `prompts` holds each prompt that many times in a row."""
    path = step_file(job.evaluation_rollouts, step)
    write_rows(
        path,
        {
            "row": [i // samples for i in range(len(prompts))],
            "sample": [i % samples for i in range(len(prompts))],
            "prompt": [as_text(p) for p in prompts],
            "completion": [as_text(c, chat_as_json=False) for c in completions],
            "score": [_number(s) for s in scores],
        },
    )
    return path


# --- reading back ----------------------------------------------------------------------------------------------------


def degenerate_example(job: JobDir, first_step: int, last_step: int) -> tuple[int, str] | None:
    """A degenerate completion kept between `first_step` and `last_step` (the newest such step's first), as (step,
    completion); None when no kept step of that window has one."""
    for step in reversed([s for s in kept_steps(job.rollouts) if first_step <= s <= last_step]):
        try:
            rows = read_rows(step_file(job.rollouts, step))
        except OSError:
            continue
        for row in rows:
            if degenerate(row["completion"] or ""):
                return step, row["completion"]
    return None


def highlights(rows: list[dict], key: str = "reward") -> list[tuple[str, dict]]:
    """The best row, the worst and the one in the middle by `key` (rows it scored), each labelled; fewer for fewer
    rows."""
    scored = sorted((r for r in rows if _number(r.get(key)) is not None), key=lambda r: r[key], reverse=True)
    if not scored:
        return []
    picks = {"best": 0, "between": len(scored) // 2, "worst": len(scored) - 1}
    seen, chosen = set(), []
    for label, index in picks.items():
        if index not in seen:
            seen.add(index)
            chosen.append((label, scored[index]))
    return chosen


def side_by_side(job: JobDir, after_step: int, count: int = 5) -> list[dict]:
    """For up to `count` held-out prompts, the starting model's completion (step 0) beside the one of the model kept
    (`after_step`), with their scores: those whose score changed most first, then in held-out order. Empty when
    either file is missing."""
    before_path, after_path = step_file(job.evaluation_rollouts, 0), step_file(job.evaluation_rollouts, after_step)
    if after_step == 0 or not (before_path.exists() and after_path.exists()):
        return []
    first = [[r for r in read_rows(path) if not r.get("sample")] for path in (before_path, after_path)]  # sample 0
    before = {r["row"]: r for r in first[0]}
    pairs = [(before[r["row"]], r) for r in first[1] if r["row"] in before]

    def change(pair) -> float:
        a, b = (_number(r["score"]) for r in pair)
        return abs(b - a) if a is not None and b is not None else 0.0

    picked = sorted(sorted(pairs, key=change, reverse=True)[:count], key=lambda pair: pair[0]["row"])
    return [
        {
            "row": b["row"],
            "prompt": b["prompt"],
            "before": b["completion"],
            "before_score": b["score"],
            "after": a["completion"],
            "after_score": a["score"],
        }
        for b, a in picked
    ]


def one_line(text: str | None, width: int) -> str:
    """`text` on one line (each run of whitespace, newlines too, one space), cut to `width` characters with "…"."""
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def highlight_rows(job: JobDir, step: int, width: int = 300) -> tuple[int | None, list[dict]]:
    """The rollouts a person looks at first, of `step` or the newest kept step before it: the best, the worst and
    one between by the total reward, each with every reward's score and its prompt and completion cut to `width`
    characters. Returns (the step shown, its rows); (None, []) when no step up to `step` was kept."""
    kept = [s for s in kept_steps(job.rollouts) if s <= step]
    if not kept:
        return None, []
    rows = read_rows(step_file(job.rollouts, kept[-1]))
    shown = []
    for label, row in highlights(rows):
        scores = {name: row[f"rewards.{name}"] for name in reward_names(row)}
        shown.append(  # the scores and the completion first: a UI shows as many columns as fit, in this order
            {
                "rollout": label,
                "reward": row["reward"],
                **{name: None if v is None else round(v, 4) for name, v in scores.items()},
                "completion": one_line(row["completion"], width),
                "prompt": one_line(prompt_text(row["prompt"]), width),
                "advantage": None if row["advantage"] is None else round(row["advantage"], 4),
                "tokens": row["completion_tokens"],
                "truncated": row["truncated"],
                "group": row["group"],
            }
        )
    return kept[-1], shown


# --- `grpoflow rollouts` ---------------------------------------------------------------------------------------------


def _steps_line(steps: list[int]) -> str:
    """`1, 2, 3` or, for many, `1, 2, ..., 99, 100 (100 steps)`."""
    shown = [str(s) for s in steps] if len(steps) <= 6 else [*map(str, steps[:2]), "...", *map(str, steps[-2:])]
    return ", ".join(shown) + (f" ({len(steps)} steps)" if len(steps) > 6 else "")


def select_rollouts(
    folder: Path,
    step: int | None = None,
    last: bool = False,
    best: int | None = None,
    worst: int | None = None,
    reward: str | None = None,
    grep: str | None = None,
) -> list[dict]:
    """The kept rollouts of a job (`rollouts/`), sorted by `reward` (a reward's name; default the total), highest
    first; `ValueError` naming what to change for a step or reward the job does not have.

    Args:
        folder (`Path`): the job's `rollouts/`.
        step (`int`, *optional*): only this step's; `last`: only the newest kept step's; default every kept step's.
        best (`int`, *optional*), worst (`int`, *optional*): only the `best` highest or the `worst` lowest (lowest
            first); rows the reward did not score come last and are never among the worst.
        reward (`str`, *optional*): sort by this reward's own score instead of the total.
        grep (`str`, *optional*): only rows whose prompt (a chat's last user message, `prompt_text`) or completion
            holds this text (case ignored).
    """
    steps = kept_steps(folder)
    if step is not None and step not in steps:
        kept = f"kept: {_steps_line(steps)}" if steps else "it kept none (rollouts.every: 0, or no step ended yet)"
        raise ValueError(f"--step {step}: this job has no rollouts of step {step}; {kept}")
    chosen = [step] if step is not None else steps[-1:] if last else steps
    rows = [row for s in chosen for row in read_rows(step_file(folder, s))]
    names = reward_names(rows[0]) if rows else []
    key = "reward" if reward in (None, "reward") else f"rewards.{reward}"
    if reward not in (None, "reward") and rows and reward not in names:
        raise ValueError(f"--reward {reward}: not a reward of this job; its rewards: {', '.join(names)}")
    if grep:
        needle = grep.lower()
        rows = [
            r
            for r in rows
            if any(needle in text.lower() for text in (prompt_text(r["prompt"] or ""), r["completion"] or ""))
        ]
    scored = sorted((r for r in rows if r[key] is not None), key=lambda r: r[key], reverse=True)
    unscored = [r for r in rows if r[key] is None]
    if worst:
        return scored[::-1][:worst]
    return (scored + unscored)[:best] if best else scored + unscored


def rollout_record(row: dict) -> dict:
    """A rollouts row as `grpoflow rollouts --json` prints it, each reward's score under `rewards`, a chat prompt as
    its last user message and its system prompt apart (`system_prompt`, null for none)."""
    return {
        "step": row["step"],
        "group": row["group"],
        "prompt": prompt_text(row["prompt"]),
        "system_prompt": system_text(row["prompt"]),
        "completion": row["completion"],
        "reward": row["reward"],
        "rewards": {name: row[f"rewards.{name}"] for name in reward_names(row)},
        "advantage": row["advantage"],
        "completion_tokens": row["completion_tokens"],
        "truncated": row["truncated"],
    }


def _figure(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def rollouts_table(rows: list[dict], width: int) -> str:
    """`rows` as a table `width` characters wide: the figures right-aligned, then the prompt (a chat's last user
    message) and the completion each on one line, cut to what is left; a system prompt the rows share is one line
    above the table."""
    names = reward_names(rows[0]) if rows else []
    figures = {
        "step": "step",
        "group": "group",
        "reward": "reward",
        **{f"rewards.{n}": n for n in names},
        "advantage": "adv",
        "completion_tokens": "tokens",
        "truncated": "cut",
    }
    cells = [[_figure(r[key]) for key in figures] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(figures.values())]
    left = max(20, width - sum(widths) - 2 * len(widths) - 2)
    prompt_width = max(10, left * 2 // 5)
    completion_width = max(10, left - prompt_width)

    def line(values: list[str], prompt: str, completion: str) -> str:
        numbers = "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))
        return f"{numbers}  {prompt.ljust(prompt_width)}  {completion}".rstrip()

    system = shared_system_text([r["prompt"] for r in rows])
    out = [one_line(f"system prompt: {system}", width)] if system else []
    out.append(line(list(figures.values()), "prompt", "completion"))
    for row, values in zip(rows, cells, strict=True):
        prompt = one_line(prompt_text(row["prompt"]), prompt_width)
        out.append(line(values, prompt, one_line(row["completion"], completion_width)))
    return "\n".join(out)

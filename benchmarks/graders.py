"""Benchmark 9: `grpoflow graders run` on 1,000 rows of string_check and text_similarity graders.

    python -m benchmarks.graders [--quick] [--json PATH] [--rows 1000] [--repeats 3]

A chat dataset in OpenAI's format (`messages`, `reference_answer`, a `completion` per row: right, near or wrong)
and a spec of six graders: string_check `eq` and `ilike`, text_similarity `fuzzy_match`, `bleu`, `gleu` and `rouge_l`.
Two sides, each a child process timed from its start (interpreter and imports included), in alternating order:

- `graders run`: `python -m grpoflow.flows.cli graders run SPEC --json`, which loads and checks the spec and the
  dataset, builds the graders and scores every row as training would (TRL's reward arguments, templates, a reward
  call per 256 rows);
- `libraries`: a bare script calling the same library functions (rapidfuzz, sacrebleu, NLTK, rouge-score) on the
  same pairs, nothing else: the floor.

Reported: each side's median seconds, the ratio of the two, rows per second, and the largest difference between the
two sides' scores (they must agree). Never asserted; `--quick` runs 100 rows once.
"""

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, alternate, bench_env, finish, fmt, markdown_table, parser

OUT, REF = "{{ sample.output_text }}", "{{ item.reference_answer }}"
GRADERS = [
    {"type": "string_check", "name": "exact", "input": OUT, "reference": REF, "operation": "eq"},
    {"type": "string_check", "name": "contains", "input": OUT, "reference": REF, "operation": "ilike"},
    *(
        {"type": "text_similarity", "name": metric, "input": OUT, "reference": REF, "evaluation_metric": metric}
        for metric in ("fuzzy_match", "bleu", "gleu", "rouge_l")
    ),
]
# The same metrics, computed by the libraries directly: the floor `graders run` is measured against.
LIBRARIES = """
import json, sys
from nltk.translate.gleu_score import sentence_gleu
from rapidfuzz import fuzz
from rouge_score import rouge_scorer
import sacrebleu

rows = [json.loads(line) for line in open(sys.argv[1])]
rouge = rouge_scorer.RougeScorer(["rougeL"])
scores = []
for row in rows:
    out, ref = row["completion"], row["reference_answer"]
    scores.append({
        "exact": float(out == ref),
        "contains": float(ref.lower() in out.lower()),
        "fuzzy_match": fuzz.WRatio(out, ref) / 100,
        "bleu": min(1.0, sacrebleu.sentence_bleu(out, [ref]).score / 100),
        "gleu": sentence_gleu([ref.split()], out.split()),
        "rouge_l": rouge.score(ref, out)["rougeL"].fmeasure,
    })
print(json.dumps(scores))
"""
WORDS = "the a cat dog sat ran on under mat log quickly slowly red blue small large river town".split()


def dataset(rows: int, seed: int = 0) -> list[dict]:
    """OpenAI-style chat rows: a prompt, a reference sentence, and a completion that is the reference, a near copy
    (two words changed, or another case) or another sentence."""
    rng = random.Random(seed)
    records = []
    for i in range(rows):
        reference = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14)))
        kind = i % 4
        if kind == 0:
            completion = reference
        elif kind == 1:
            words = reference.split()
            for j in rng.sample(range(len(words)), 2):
                words[j] = rng.choice(WORDS)
            completion = " ".join(words)
        elif kind == 2:
            completion = f"Sure. {reference.upper()}."
        else:
            completion = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14)))
        messages = [{"role": "user", "content": f"Say sentence {i}."}]
        records.append({"messages": messages, "reference_answer": reference, "completion": completion})
    return records


def timed(command: list[str]) -> dict:
    started = time.monotonic()
    proc = subprocess.run(command, cwd=REPO_ROOT, env=bench_env(), capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} failed: {proc.stderr[-2000:]}")
    return {"seconds": seconds, "stdout": proc.stdout}


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, help="rows to score (default 1000; 100 with --quick)")
    p.add_argument("--repeats", type=int, help="runs of each side (default 3; 1 with --quick)")
    args = p.parse_args(argv)
    rows = args.rows or (100 if args.quick else 1000)
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench-graders-") as tmp:
        folder = Path(tmp)
        data = folder / "rft.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in dataset(rows)))
        spec = {
            "name": "graders-bench",
            "base_model": "builtin:tiny",
            "dataset": {"uri": str(data), "prompt_column": "messages"},
            "rewards": [{"grader": g} for g in GRADERS],
        }
        (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
        (folder / "libraries.py").write_text(LIBRARIES)
        cli = [sys.executable, "-m", "grpoflow.flows.cli", "graders", "run", str(folder / "spec.yaml"), "--json"]
        sides = {
            "graders run": lambda i: timed(cli),
            "libraries": lambda i: timed([sys.executable, str(folder / "libraries.py"), str(data)]),
        }
        runs = alternate(sides, repeats)
    ours = [r["rewards"] for r in json.loads(runs["graders run"][-1]["stdout"])["scores"]]
    floor = json.loads(runs["libraries"][-1]["stdout"])
    difference = max(abs(a[k] - b[k]) for a, b in zip(ours, floor, strict=True) for k in b)
    seconds = {side: statistics.median(r["seconds"] for r in results) for side, results in runs.items()}
    summary = {
        "rows": rows,
        "graders": len(GRADERS),
        "seconds": seconds,
        "rows_per_s": rows / seconds["graders run"],
        "vs_libraries": seconds["graders run"] / seconds["libraries"],
        "max_score_difference": difference,
    }
    table = markdown_table(
        ["side", "rows", "graders", "median s (process start to end)", "rows/s"],
        [[side, rows, len(GRADERS), fmt(s), fmt(rows / s)] for side, s in seconds.items()],
    )
    table += (
        f"\n\n`graders run` / libraries: {fmt(summary['vs_libraries'])}x; largest score difference: {difference:.2e}"
    )
    return finish("graders", args, table, {"summary": summary, "repeats": repeats, "graders_spec": GRADERS})


if __name__ == "__main__":
    main()

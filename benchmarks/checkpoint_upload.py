"""What uploading every checkpoint while GRPO trains costs: seconds per training step with a local output_uri (no
upload) and with an s3:// one (each checkpoint, metrics, events and logs uploaded by
`grpoflow.integrations.checkpoint_sync` as the child trains).

    python -m benchmarks.checkpoint_upload [--quick] [--checkpoint-every N] [--json PATH]

Runs `grpoflow run` on builtin:tiny (GRPO only; by default a checkpoint every step, the worst case for the uploads)
as a child process, alternating the two sides, against moto's S3 server on loopback in this process (real HTTP, the
real s3fs; the server's own CPU comes out of the same cores as training, which a real store's does not). Seconds
per step = the GRPO child's `train_runtime` / steps (`training.json`), so model load and the job's end are left out;
the upload seconds are the sync thread's own (`checkpoint_uploads` in `grpoflow.training.completed`).
"""

import json
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, alternate, bench_env, finish, markdown_table, median, parser, run_child

STEPS, QUICK_STEPS = 30, 6
CHECKPOINT_EVERY = 1


def spec_file(folder: Path, steps: int, checkpoint_every: int) -> Path:
    spec = {
        "name": "upload-bench",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(REPO_ROOT / "examples" / "data" / "arithmetic.jsonl")},
        "rewards": [{"name": "exact_answer"}],
        "hyperparameters": {"max_steps": steps, "rollouts_per_prompt": 4, "max_response_length": 8},
        "checkpoint_every": checkpoint_every,
        "evaluation": {"holdout": 0},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def main(argv=None) -> dict:
    import s3fs

    from tests.s3_server import moto_s3

    cli = parser(__doc__)
    cli.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, help="steps between checkpoints (1)")
    args = cli.parse_args(argv)
    steps, repeats = (QUICK_STEPS, 1) if args.quick else (STEPS, 3)
    work = Path(tempfile.mkdtemp(prefix="grpoflow-upload-bench-"))
    spec = spec_file(work, steps, args.checkpoint_every)
    with moto_s3() as s3:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3["AWS_ENDPOINT_URL"]}, key="testing", secret="testing")
        fs.mkdir("bench")

        def run(side: str, output_uri: str, i: int) -> dict:
            env = bench_env(**s3, GRPOFLOW_STAGING_DIR=str(work / f"staging-{i}"))
            command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--output-uri", output_uri]
            timing = run_child(command, work / f"{side}-{i}.log", env)
            # The one job of the run: staged locally either way (an s3:// job runs in its staging folder).
            local = work / (f"staging-{i}" if output_uri.startswith("s3://") else f"runs-{i}")
            [job_id] = [p.name for p in local.iterdir() if p.is_dir() and not p.name.startswith(".")]
            if output_uri.startswith("s3://"):
                fs.invalidate_cache()
                training = json.loads(fs.cat(f"bench/{i}/{job_id}/training.json"))
                events = [json.loads(line) for line in fs.cat(f"bench/{i}/{job_id}/events.jsonl").splitlines()]
            else:
                folder = Path(output_uri) / job_id
                training = json.loads((folder / "training.json").read_text())
                events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
            [completed] = [e["payload"] for e in events if e["event"] == "grpoflow.training.completed"]
            return {
                "s_per_step": training["train_runtime"] / training["global_step"],
                "uploads": completed.get("checkpoint_uploads"),
                "wall_s": timing["wall_s"],
            }

        results = alternate(
            {
                "local output_uri (no upload)": lambda i: run("local", str(work / f"runs-{i}"), i),
                "s3:// output_uri (upload each checkpoint)": lambda i: run("s3", f"s3://bench/{i}", i),
            },
            repeats,
        )
    base = median(r["s_per_step"] for r in results["local output_uri (no upload)"])
    rows, data = [], {}
    for side, runs in results.items():
        per_step = median(r["s_per_step"] for r in runs)
        uploads = [r["uploads"] for r in runs if r["uploads"]]
        upload_s = median(u["seconds"] / max(u["checkpoints"], 1) for u in uploads) if uploads else None
        mb = median(u["mb"] / max(u["checkpoints"], 1) for u in uploads) if uploads else None
        rows.append([side, per_step, per_step / base - 1 if base else None, upload_s, mb, len(runs)])
        data[side] = {"runs": runs, "median_s_per_step": per_step}
    headers = ["side", "s/step (median)", "slowdown", "upload s/checkpoint", "MB/checkpoint", "runs"]
    data.update({"steps": steps, "checkpoint_every": args.checkpoint_every})
    return finish("checkpoint_upload", args, markdown_table(headers, rows), data)


if __name__ == "__main__":
    main()

"""`grpoflow compare`: held-out scores of several jobs side by side on the prompts they share (jobs/compare.py)."""

import json

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import intervals
from grpoflow.trainers.rollouts import read_rows, step_file, write_held_out
from tests.conftest import cli


def held_out_job(
    root, job_id: str, prompts: list, scores: list, step: int = 3, metric: str = "exact_answer", samples=1, **extra
):
    """A job folder with what `compare` reads: spec.yaml, evaluation.json and the kept model's
    evaluation/step-<step>.parquet (`samples` completions of each prompt, `prompts` holding each that many times)."""
    job = JobDir(root / job_id)
    job.root.mkdir(parents=True)
    job.spec.write_text(f"name: {job_id}\n")
    write_held_out(job, step, prompts, [f"c{i}" for i in range(len(prompts))], scores, samples=samples)
    job.evaluation.write_text(json.dumps({"metric": metric, "n": len(prompts), "selected_step": step, **extra}))
    return job


def test_compare_matches_shared_prompts_by_text_and_pairs_the_intervals(tmp_path):
    root = tmp_path / "runs"
    held_out_job(root, "a", ["p1", "p2", "p3", "p4", "p2"], [1.0, 0.0, 1.0, 0.0, 1.0])
    # The start kept (select: best): its step-0 scores count, not those of the GRPO result's step 2.
    held_out_job(root, "b", ["p4", "p3", "p2", "p5", "p1"], [1.0, 0.0, 1.0, 1.0, 1.0], step=0, trained={"step": 2})
    write_held_out(JobDir(root / "b"), 2, ["p4", "p3", "p2", "p5", "p1"], ["x"] * 5, [0.0] * 5)
    # Two sampled completions of each prompt (evaluation.samples: 2): a prompt's score their mean.
    two = [p for p in ["p1", "p2", "p3", "p4"] for _ in range(2)]
    held_out_job(root, "c", two, [None, None, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], samples=2)

    code, out, err = cli("compare", "a", "b", "c", "--json", "--output-uri", root)

    assert code == 0, err
    result = json.loads(out)
    assert set(result) == {"jobs", "metric", "prompts", "confidence", "rows"}
    assert (result["jobs"], result["metric"], result["prompts"]) == (["a", "b", "c"], "exact_answer", 4)
    # Shared by all three, in a's order: p1, p2 (its first copy only: b and c have one), p3, p4.
    a, b, c = [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0], [None, 0.5, 1.0, 1.0]
    rows = {r["job"]: r for r in result["rows"]}
    assert [set(r) for r in result["rows"]] == [{"job", "score", "ci", "gain_vs_first", "gain_ci"}] * 3
    assert rows["a"]["score"] == 0.5 and rows["a"]["gain_vs_first"] is None and rows["a"]["gain_ci"] is None
    assert rows["b"]["score"] == 0.75 and rows["b"]["gain_vs_first"] == 0.25
    # c's unscored p1 skipped, as in a mean.
    assert rows["c"]["score"] == pytest.approx(2.5 / 3) and rows["c"]["gain_vs_first"] == pytest.approx(2.5 / 3 - 0.5)
    for job, scores in (("b", b), ("c", c)):
        expected = intervals(a, scores, 0.95)
        assert rows[job]["ci"] == expected["after"] and rows[job]["gain_ci"] == expected["gain"]
    assert rows["a"]["ci"] == intervals(a, a)["after"]
    assert rows["c"]["gain_ci"][0] < 2.5 / 3 - 0.5 < rows["c"]["gain_ci"][1]

    code, out, _ = cli("compare", "a", "b", "--confidence", "0.8", "--output-uri", root)
    assert code == 0
    assert "exact_answer, 4 shared held-out prompts" in out and "80% CI" in out
    assert out.splitlines()[2].startswith("b ") and "+0.25, 80% CI" in out.splitlines()[2]


@pytest.mark.parametrize(
    "jobs, named",
    [
        (["a", "other"], "a (exact_answer), other (format)"),  # scored with different metrics
        (["a", "b", "apart"], "job a and apart share no held-out prompt"),  # apart holds none of a's prompts
        (["a", "nosuch"], "unknown job 'nosuch'"),  # as every command that reads a job
        (["a", "unscored"], "job unscored has no held-out evaluation"),  # held nothing out
        (["a"], "two or more different jobs"),  # nothing to compare with
        (["a", "a"], "two or more different jobs"),  # the same job twice
    ],
)
def test_jobs_that_cannot_be_compared_exit_2_naming_them(tmp_path, jobs, named):
    root = tmp_path / "runs"
    held_out_job(root, "a", ["p1", "p2"], [1.0, 0.0])
    held_out_job(root, "b", ["p1", "p2"], [1.0, 1.0])
    held_out_job(root, "other", ["p1", "p2"], [1.0, 1.0], metric="format")
    held_out_job(root, "apart", ["q1"], [1.0])
    (root / "unscored").mkdir()
    (root / "unscored" / "spec.yaml").write_text("name: unscored\n")

    code, out, err = cli("compare", *jobs, "--json", "--output-uri", root)

    assert code == 2
    assert named in err


def test_compare_two_trained_jobs(trained_jobs):
    lora, full = JobDir(trained_jobs["lora"]), JobDir(trained_jobs["full"])
    root = lora.root.parent

    code, out, err = cli("compare", lora.job_id, full.job_id, "--json", "--output-uri", root)

    assert code == 0, err
    result = json.loads(out)
    evaluations = [json.loads(job.evaluation.read_text()) for job in (lora, full)]
    assert result["metric"] == evaluations[0]["metric"] and result["prompts"] == evaluations[0]["n"] == 4
    kept = [
        [r["score"] for r in read_rows(step_file(job.evaluation_rollouts, e["selected_step"]))]
        for job, e in zip((lora, full), evaluations, strict=True)
    ]
    # One held-out split (the same data and seed): every prompt shared, each score the job's own `after`.
    assert [r["score"] for r in result["rows"]] == pytest.approx([e["after"] for e in evaluations])
    assert result["rows"][1]["gain_ci"] == intervals(*kept, 0.95)["gain"]
    assert result["rows"][1]["gain_vs_first"] == pytest.approx(evaluations[1]["after"] - evaluations[0]["after"])

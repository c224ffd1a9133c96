"""The serving registry's versions, rollback and listing (on registry files written by hand), its commands (`grpoflow
serving`, and the old spellings `deploy` and `deployments list`), and the promotion gate's rule (`gate_decision`)."""

import json
import shutil

import pytest

from grpoflow.core.scores import intervals
from grpoflow.core.spec.models import GateSpec
from grpoflow.jobs.registry import (
    RegistrationError,
    gate_decision,
    list_serving_records,
    read_serving_record,
    rollback,
    served_score,
)
from tests.conftest import cli


def version(n: int, score: float | None, status: str = "ready") -> dict:
    job_id = f"arith-2026113{n}-000000-abcdef"
    return {
        "version": n,
        "job_id": job_id,
        "artifact_path": f"/runs/{job_id}/merged",
        "artifact_type": "full",
        "metric": "exact_answer",
        "score": score,
        "status": status,
        "registered": f"2026-11-3{n}T00:00:00+00:00",
    }


@pytest.fixture
def root(tmp_path):
    """An output root whose registry holds `arith` (versions 1 ready, 2 failed, 3 ready and current) and `old` (a
    one-record file as grpoflow wrote them before versions)."""
    registry = tmp_path / "deployments"
    registry.mkdir()
    versions = [version(1, 0.5), version(2, None, "failed"), version(3, 0.25)]
    record = {"name": "arith", "created": "2026-11-31T00:00:00+00:00", "current": 3, "versions": versions}
    (registry / "arith.json").write_text(json.dumps({**record, **{k: versions[2][k] for k in ("job_id", "status")}}))
    old = {
        "name": "old",
        "job_id": "old-20261101-000000-abcdef",
        "artifact_path": "/runs/old-20261101-000000-abcdef/merged",
        "artifact_type": "full",
        "created": "2026-11-01T00:00:00+00:00",
        "updated": "2026-11-02T00:00:00+00:00",
        "status": "ready",
        "smoke": {"prompt": "What is 1+2?", "completion": "3", "seconds": 0.1},
    }
    (registry / "old.json").write_text(json.dumps(old))
    return tmp_path


def test_an_old_one_record_file_is_one_version(root):
    record = read_serving_record(root, "old")
    assert record["current"] == 1 and len(record["versions"]) == 1
    [only] = record["versions"]
    assert only["job_id"] == "old-20261101-000000-abcdef" and only["status"] == "ready" and only["score"] is None
    assert record["artifact_path"] == only["artifact_path"]  # what `grpoflow serve` reads stays at the top level
    with pytest.raises(RegistrationError, match="no ready version before version 1"):
        rollback(root, "old")


def test_rollback_restores_the_previous_ready_version(root):
    assert served_score(root, "arith") == 0.25
    restored, replaced = rollback(root, "arith")
    assert (restored["version"], replaced["version"]) == (1, 3)  # version 2 failed its smoke test: skipped
    saved = json.loads((root / "deployments" / "arith.json").read_text())
    assert saved["current"] == 1 and [v["version"] for v in saved["versions"]] == [1, 2, 3]  # nothing is lost
    assert saved["job_id"] == restored["job_id"] and saved["artifact_path"] == restored["artifact_path"]
    assert served_score(root, "arith") == 0.5
    with pytest.raises(RegistrationError, match="no ready version before version 1"):
        rollback(root, "arith")
    with pytest.raises(RegistrationError, match="unknown serving name 'nope'; registered: arith, old"):
        rollback(root, "nope")
    assert served_score(root, "nope") is None


def test_cli_list_and_rollback(root):
    code, out, err = cli("--output-uri", root, "serving", "list")
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0] == "arith  (current: v3)" and lines[4] == "old  (current: v1)"
    assert lines[1].startswith("    v1 ") and "exact_answer 0.500" in lines[1] and "ready" in lines[1]
    assert "not scored" in lines[2] and "failed" in lines[2]
    assert lines[3].startswith("  * v3 ") and "arith-20261133-000000-abcdef" in lines[3]

    code, out, err = cli("--output-uri", root, "serving", "rollback", "arith")
    assert code == 0, err
    assert "rolled back to version 1 (job arith-20261131-000000-abcdef)" in out and "version 3" in out
    code, out, _ = cli("--output-uri", root, "serving", "list", "--json")
    listed = {r["name"]: r for r in json.loads(out)["serving"]}
    assert listed["arith"]["current"] == 1 and len(listed["arith"]["versions"]) == 3

    code, _, err = cli("--output-uri", root, "serving", "rollback", "arith")
    assert code == 1 and "no ready version before version 1" in err
    code, _, err = cli("--output-uri", root, "serving", "register")
    assert code == 2 and "job_id" in err
    assert list_serving_records(root / "empty") == []
    code, out, _ = cli("--output-uri", root / "empty", "serving", "list")
    assert code == 0 and out.startswith("nothing registered for serving under")


def test_the_old_spellings_work_and_say_the_new_ones(root):
    """`deploy`, `deploy --rollback` and `deployments list` are in users' scripts: each does what it did, its JSON as
    before, with one line on stderr naming its `serving` spelling."""
    listed = cli("--output-uri", root, "serving", "list")[1]
    code, out, err = cli("--output-uri", root, "deployments", "list")
    assert (code, out) == (0, listed)
    assert (
        err
        == "grpoflow: `grpoflow deployments list` is now `grpoflow serving list` (the serving registry's commands)\n"
    )
    code, out, err = cli("--output-uri", root, "deployments", "list", "--json")
    assert (
        json.loads(out)["deployments"]
        == json.loads(cli("--output-uri", root, "serving", "list", "--json")[1])["serving"]
    )
    code, out, err = cli("--output-uri", root, "deploy", "--rollback", "arith")
    assert code == 0 and "rolled back to version 1" in out
    assert err.splitlines() == [
        "grpoflow: `grpoflow deploy --rollback NAME` is now `grpoflow serving rollback NAME` (the serving registry's "
        "commands)"
    ]
    code, _, err = cli("--output-uri", root, "deploy")
    assert (
        code == 2 and "`grpoflow serving register JOB_ID`" in err.splitlines()[0] and "JOB_ID" in err.splitlines()[1]
    )


def test_without_output_uri_the_registry_is_found_where_the_job_index_points(root, tmp_path, monkeypatch):
    # `grpoflow serving register JOB` registers beside the job (found through the job index); `serving list`, `serve`
    # and `serving rollback` from the same folder read ./runs alone and found nothing.
    import grpoflow.trainers.model.serve
    from grpoflow.core.jobdir import remember

    monkeypatch.setenv("GRPOFLOW_JOB_INDEX", str(tmp_path / "index"))
    remember("arith-20261133-000000-abcdef", str(root / "arith-20261133-000000-abcdef"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    served = []
    monkeypatch.setattr(
        grpoflow.trainers.model.serve, "serve", lambda path, name, host, port: served.append((path, name))
    )

    code, out, err = cli("serving", "list")
    assert code == 0, err
    assert out.splitlines()[0] == f"arith  (current: v3)  {root}" and f"old  (current: v1)  {root}" in out
    code, out, _ = cli("serving", "list", "--json")
    listed = [(r["name"], r["root"]) for r in json.loads(out)["serving"]]
    assert listed == [("arith", str(root)), ("old", str(root))]
    assert cli("serve", "old") == (0, "", "") and served == [("/runs/old-20261101-000000-abcdef/merged", "old")]
    code, out, err = cli("serving", "rollback", "arith")
    assert code == 0 and "rolled back to version 1" in out, err

    code, _, err = cli("serve", "nope")  # unknown: where it looked, and the names there are
    assert code == 2
    assert f"unknown serving name 'nope' under {elsewhere / 'runs' / 'deployments'}, {root / 'deployments'}" in err
    assert "registered: arith, old" in err
    (elsewhere / "runs" / "deployments").mkdir(parents=True)  # the same name in ./runs too: which one is meant?
    shutil.copy(root / "deployments" / "old.json", elsewhere / "runs" / "deployments")
    code, _, err = cli("serve", "old")
    assert code == 2 and f"'old' is registered under {elsewhere / 'runs'}, {root}: pick one with --output-uri" in err
    assert cli("--output-uri", root, "serve", "old")[0] == 0 and len(served) == 2


EVALUATION = {"metric": "exact_answer", "n": 8, "before": 0.5, "after": 0.75}
NO_GAIN = "no checkpoint beat the starting model"


@pytest.mark.parametrize(
    "evaluation, gate, kind, reason",
    [
        # The default gate: a model no better than its start is not promoted, a tie included.
        ({**EVALUATION, "after": 0.5}, GateSpec(), "no_improvement", f"{NO_GAIN} (0.5 -> 0.5, no change)"),
        ({**EVALUATION, "after": 0.25}, GateSpec(), "no_improvement", f"{NO_GAIN} (0.5 -> 0.25, -25.0 points)"),
        # The kept start (select: best, nothing beat it) has the start's score: refused as well.
        (
            {**EVALUATION, "before": 0.05942, "after": 0.05942, "selected_step": 0},
            GateSpec(),
            "no_improvement",
            "evaluation.gate.min_gain 0 promotes only a gain (null turns the gate off)",
        ),
        # A tiny loss is a loss, never "-0".
        ({**EVALUATION, "before": 0.05942, "after": 0.05937}, GateSpec(), "no_improvement", "-0.005 points"),
        # A minimum above 0 names the gain it asks for.
        ({**EVALUATION, "after": 0.5}, GateSpec(min_gain=0.1), "no_improvement", "a gain of at least 0.1"),
        # Some gain, not enough.
        ({**EVALUATION, "after": 0.55}, GateSpec(min_gain=0.1), "below_min_gain", "below evaluation.gate.min_gain"),
        (EVALUATION, GateSpec(beat_deployed=True), "below_deployed", "below the deployed version's"),
        (None, GateSpec(), "not_scored", "no held-out score"),
    ],
)
def test_gate_refusals_say_what_failed(evaluation, gate, kind, reason):
    decision = gate_decision(evaluation, gate, 0.8)
    assert not decision["promote"] and decision["kind"] == kind and reason in decision["reason"]
    assert "-0 " not in decision["reason"] and "-0.0 " not in decision["reason"]


@pytest.mark.parametrize(
    "evaluation, gate, deployed, promote, reason",
    [
        (EVALUATION, None, None, True, "no gate"),  # no gate block at all
        (EVALUATION, GateSpec(min_gain=None), 0.9, True, "no gate"),  # null turns it off, whatever is deployed
        (EVALUATION, GateSpec(), 0.9, True, "passed"),  # the default (min_gain 0): a gain passes
        (EVALUATION, GateSpec(min_gain=0.25), None, True, "passed"),  # exactly the minimum passes
        (
            EVALUATION,
            GateSpec(min_gain=0.3),
            None,
            False,
            "gain +0.25 (0.5 -> 0.75) is below evaluation.gate.min_gain",
        ),
        ({**EVALUATION, "before": 0.6, "after": 0.7}, GateSpec(min_gain=0.1), None, True, "passed"),  # float noise
        (EVALUATION, GateSpec(min_gain=-0.1), None, True, "passed"),  # a tolerated loss
        ({**EVALUATION, "after": 0.4}, GateSpec(min_gain=-0.05), None, False, "gain -0.1"),  # more than tolerated
        (EVALUATION, GateSpec(beat_deployed=True), None, True, "passed"),  # nothing deployed (or unscored) to beat
        (EVALUATION, GateSpec(beat_deployed=True), 0.75, True, "passed"),  # a tie keeps the newer model
        (EVALUATION, GateSpec(beat_deployed=True), 0.8, False, "below the deployed version's 0.8"),
        (EVALUATION, GateSpec(min_gain=0.5, beat_deployed=True), 0.8, False, "min_gain 0.5; score 0.75 is below"),
        (None, GateSpec(min_gain=0.0), None, False, "no held-out score"),  # nothing held out
        ({**EVALUATION, "after": None}, GateSpec(beat_deployed=True), 0.1, False, "no held-out score"),
        ({**EVALUATION, "before": None}, GateSpec(min_gain=0.0), None, False, "start model was not scored"),
        (None, None, None, True, "no gate"),  # no evaluation and no gate: promoted as before the gate existed
    ],
)
def test_gate_decision(evaluation, gate, deployed, promote, reason):
    decision = gate_decision(evaluation, gate, deployed)
    assert decision["promote"] is promote and reason in decision["reason"]
    assert (decision["kind"] is None) is promote
    assert decision["deployed_score"] == deployed and decision["after"] == (evaluation or {}).get("after")


def _scored_40(solved_before: int, solved_after: int) -> dict:
    """evaluation.json of 40 held-out prompts: the start solves the first `solved_before`, the GRPO result the first
    `solved_after`, with their paired bootstrap intervals."""
    before = [1.0] * solved_before + [0.0] * (40 - solved_before)
    after = [1.0] * solved_after + [0.0] * (40 - solved_after)
    return {
        "metric": "exact_answer",
        "n": 40,
        "before": solved_before / 40,
        "after": solved_after / 40,
        "confidence": 0.95,
        "ci": intervals(before, after, 0.95),
    }


def test_a_significant_gate_withholds_a_one_prompt_gain_and_promotes_a_large_one():
    one_prompt = _scored_40(16, 17)  # +0.025: one prompt flipped from 0 to 1
    assert gate_decision(one_prompt, GateSpec(), None)["promote"]  # the default gate promotes it
    decision = gate_decision(one_prompt, GateSpec(significant=True), None)
    assert not decision["promote"] and decision["kind"] == "not_significant"
    assert decision["gain_ci"] == one_prompt["ci"]["gain"] and decision["gain_ci"][0] <= 0 < decision["gain_ci"][1]
    assert decision["reason"].startswith("exact_answer 0.40 -> 0.425 (+0.025, 95% CI +0.00 to +0.075): the gain's")
    assert "does not exceed evaluation.gate.min_gain 0" in decision["reason"]

    large = _scored_40(16, 25)  # +0.225
    decision = gate_decision(large, GateSpec(significant=True), None)
    low, high = large["ci"]["gain"]
    assert decision["promote"] and decision["kind"] is None and 0.05 <= low < 0.225 < high <= 0.4
    assert decision["reason"] == "passed evaluation.gate: exact_answer 0.40 -> 0.625 (+0.225, 95% CI +0.10 to +0.35)"
    # The lower bound must exceed min_gain itself, not only 0.
    assert gate_decision(large, GateSpec(min_gain=low, significant=True), None)["kind"] == "not_significant"
    # No interval to judge (evaluation.confidence: null): not promoted, and said why.
    decision = gate_decision({**large, "ci": None, "confidence": None}, GateSpec(significant=True), None)
    assert decision["kind"] == "not_significant" and "no interval" in decision["reason"]
    # A loss stays no_improvement; the deployed version is still judged beside significance.
    assert gate_decision(_scored_40(16, 10), GateSpec(significant=True), None)["kind"] == "no_improvement"
    decision = gate_decision(one_prompt, GateSpec(significant=True, beat_deployed=True), 0.9)
    assert [p.split(" ")[0] for p in decision["reason"].split("; ")] == ["exact_answer", "score"]

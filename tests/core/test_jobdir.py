"""The job folder: what can name one, where each file of `FILES` lives, and writes no reader sees torn."""

import doctest
import json
from pathlib import Path

import pytest

from grpoflow.core import jobdir
from grpoflow.core.jobdir import JobDir, check_job_id, replace_dir, write_json_atomic, write_text_atomic


def test_doctest():
    assert doctest.testmod(jobdir).failed == 0


@pytest.mark.parametrize(
    "job_id, ok",
    [
        ("arithmetic-demo-20261130-064628-4013d1", True),  # what new_job_id makes
        ("a", True),  # one character is one path segment
        ("name with spaces", True),  # odd but one segment
        ("..hidden", True),  # starts with dots but is not "." or ".."
        ("", False),  # would be the output root itself
        (".", False),  # the output root
        ("..", False),  # its parent
        ("a/b", False),  # two segments
        ("../escape", False),  # out of the output root
        ("/etc", False),  # an absolute path
        ("a\\b", False),  # a Windows separator
        (None, False),  # a flow parameter can be anything
        (42, False),
    ],
)
def test_check_job_id(job_id, ok):
    if ok:
        assert check_job_id(job_id) == job_id
    else:
        with pytest.raises(ValueError, match="not a job id"):
            check_job_id(job_id)


def test_every_file_of_the_design_table_has_its_name(tmp_path):
    job = JobDir(tmp_path / "demo-20261130-000000-abcdef")
    assert job.job_id == "demo-20261130-000000-abcdef"
    names = {
        "spec": "spec.yaml",
        "dataset": "dataset",
        "metrics": "metrics.jsonl",
        "checkpoints": "checkpoints",
        "sft": "sft",
        "adapter": "adapter",
        "merged": "merged",
        "model_json": "model.json",
        "events": "events.jsonl",
        "evaluation": "evaluation.json",
        "report": "report.md",
        "logs": "logs",
    }
    assert {attr: getattr(job, attr) for attr in names} == {attr: job.root / name for attr, name in names.items()}


def test_atomic_writes_leave_only_the_file(tmp_path):
    path = tmp_path / "new" / "model.json"
    write_json_atomic(path, {"artifact_type": "full", "files": ["a"]})
    assert json.loads(path.read_text()) == {"artifact_type": "full", "files": ["a"]}
    write_json_atomic(path, {"artifact_type": "adapter"})  # replaced whole
    assert json.loads(path.read_text()) == {"artifact_type": "adapter"}
    write_text_atomic(tmp_path / "new" / "spec.yaml", "name: x\n")
    assert (tmp_path / "new" / "spec.yaml").read_text() == "name: x\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.json", "spec.yaml"]  # no temp files left


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "training.json"
    write_json_atomic(path, {"global_step": 3})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})  # not JSON: fails mid-write
    assert json.loads(path.read_text()) == {"global_step": 3}


def folder(path: Path, content: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(content)
    return path


def test_replace_dir_puts_the_new_folder_in_place(tmp_path):
    dest = folder(tmp_path / "merged", "old")
    (dest / "only-in-old.bin").write_text("x")
    replace_dir(folder(tmp_path / ".merged-staging", "new"), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"]  # the new folder, not a mix of both
    assert (dest / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # staging and the old copy are gone


def test_replace_dir_into_an_absent_destination(tmp_path):
    replace_dir(folder(tmp_path / ".staging", "new"), tmp_path / "sft")
    assert (tmp_path / "sft" / "config.json").read_text() == "new"


def test_replace_dir_keeps_the_old_folder_until_the_swap(tmp_path):
    dest = folder(tmp_path / "merged", "old")
    # The old folder is set aside before the new one moves in; when that move fails (here the staged folder is gone,
    # e.g. cleaned up by another process) the old one, never deleted, is put back whole.
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / ".missing-staging", dest)
    assert (dest / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]

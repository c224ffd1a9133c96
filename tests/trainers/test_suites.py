"""trainers/suites.py's checks before any model loads: an evaluation suite names a file that exists, a task in it and
needs the evals extra, each mistake one line naming its entry, exit code 2 from `grpoflow validate`. (The suites run
through inspect-ai in tests/tasks/test_evaluate.py.)"""

import sys

import pytest

from grpoflow.core.spec import load_spec
from grpoflow.trainers.suites import suite_problems
from tests.conftest import cli

TASKS = (
    "from inspect_ai import task\n\n\n@task\ndef sums():\n    pass\n\n\n@task(name='renamed')\ndef other():\n    pass"
)


@pytest.fixture
def suite_file(tmp_path):
    path = tmp_path / "evals.py"
    path.write_text(TASKS)
    return path


@pytest.mark.parametrize(
    ("suite", "installed", "problem"),
    [
        # the file and its task: nothing to say (a task under its decorator's name too)
        ("{file}@sums", True, None),
        ("{file}@renamed", True, None),
        # no such file
        ("{dir}/missing.py@sums", True, "evaluation.suites[0].inspect: {dir}/missing.py is not a file"),
        # no such task: the file's tasks named
        ("{file}@summs", True, "evaluation.suites[0].inspect: {file} has no task 'summs'; its tasks: renamed, sums"),
        # inspect-ai missing: the extra named, before the file is read
        ("{file}@sums", False, "evaluation.suites: inspect-ai is not installed here; install grpoflow's evals "
         "extra: pip install 'grpoflow[evals]'"),
    ],
)  # fmt: skip
def test_suite_problems(make_spec, suite_file, monkeypatch, suite, installed, problem):
    inspect = suite.format(file=suite_file, dir=suite_file.parent)
    spec, _ = load_spec(make_spec(evaluation={"suites": [{"inspect": inspect}]}))
    if not installed:
        monkeypatch.setitem(sys.modules, "inspect_ai", None)  # what an import of an absent package meets
    problems = suite_problems(spec)
    if problem is None:
        assert problems == []
    else:
        [line] = problems
        assert line.startswith(problem.format(file=suite_file, dir=suite_file.parent))


def test_validate_refuses_a_missing_task_with_exit_2(make_spec, suite_file):
    path = make_spec(evaluation={"suites": [{"inspect": f"{suite_file}@sums"}, {"inspect": f"{suite_file}@nope"}]})
    code, _, err = cli("validate", path)
    assert code == 2
    assert f"evaluation.suites[1].inspect: {suite_file} has no task 'nope'" in err and "suites[0]" not in err

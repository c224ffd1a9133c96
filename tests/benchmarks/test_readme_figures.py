"""The README's and the docs' benchmark tables are the benchmarks' own output (benchmarks/readme.py), never typed."""

import json

from benchmarks.common import RESULTS_DIR
from benchmarks.learning import real_table, summarize, table
from benchmarks.readme import BLOCK, PAGES, main, render, result_table, stale_blocks
from benchmarks.run import summary_table


def cited() -> set[str]:
    return {m.group("name") for page in PAGES for m in BLOCK.finditer(page.read_text())}


def test_each_page_holds_its_results_table():
    # The README's learning tables (tiny and real model) and its speed table (`make bench`'s summary).
    assert {"learning.json", "learning-real.json", "summary.json"} <= cited()
    assert stale_blocks() == [], "run `python -m benchmarks.readme` after a benchmark's run (and commit its JSON)"


def test_the_real_model_table_is_what_the_benchmark_renders_from_its_runs():
    result = json.loads((RESULTS_DIR / "learning-real.json").read_text())
    assert real_table(result["runs"]).strip() == result["table"].strip()
    assert [run["seed"] for run in result["runs"]] == [42, 43, 44] and not result["quick"]


def test_the_tiny_model_table_is_what_the_benchmark_renders_from_its_runs():
    result = json.loads((RESULTS_DIR / "learning.json").read_text())
    assert table(summarize(result["runs"]), result["runs"]).strip() == result["table"].strip()
    assert result["seeds"] == [42, 43, 44] and not result["quick"]


def test_the_speed_table_is_what_make_bench_renders_from_each_benchmarks_result():
    summary = json.loads((RESULTS_DIR / "summary.json").read_text())
    results = {name: json.loads((RESULTS_DIR / f"{name}.json").read_text()) for name in summary["benchmarks"]}
    assert summary_table(results, summary["skipped"]).strip() == summary["table"].strip()
    assert not summary["quick"] and not summary["failed"] and not any(r["quick"] for r in results.values())


def test_a_typed_figure_is_found_and_rewritten(tmp_path, monkeypatch, capsys):
    page = tmp_path / "README.md"
    good = "intro\n<!-- results: learning-real.json -->\n| typed | 0.99 |\n<!-- /results -->\nend\n"
    page.write_text(good)
    monkeypatch.setattr("benchmarks.readme.PAGES", [page])
    monkeypatch.setattr("benchmarks.readme.REPO_ROOT", tmp_path)
    assert main(["--check"]) == 1 and "README.md: learning-real.json" in capsys.readouterr().out
    assert main([]) == 0 and main(["--check"]) == 0
    assert page.read_text() == render(good) and "| typed |" not in page.read_text()
    page.write_text("<!-- results: learning-real.json -->\n<!-- /results -->\n")  # a new, empty block is filled
    assert main(["--check"]) == 1 and main([]) == 0
    filled = f"<!-- results: learning-real.json -->\n{result_table('learning-real.json')}\n<!-- /results -->\n"
    assert page.read_text() == filled


def test_the_learning_tables_give_each_gains_interval_or_say_why_not():
    """Each row's gain has its 95% interval where the runs kept their prompts' scores; "-" where they did not, which
    the README says under the table."""
    readme = (PAGES[0]).read_text()
    for name in ("learning.json", "learning-real.json"):
        result = json.loads((RESULTS_DIR / name).read_text())
        header, _, *rows = result["table"].splitlines()
        column = header.split(" | ").index("gain 95% CI")
        cells = [row.split(" | ")[column] for row in rows if not row.startswith("| range")]
        if all(run.get("scores") for run in result["runs"]):
            assert all(" to " in cell for cell in cells)
        else:
            assert set(cells) == {"-"}
            after = readme.split(f"<!-- results: {name} -->", 1)[1].split("<!-- /results -->", 1)[1]
            assert after.lstrip().startswith('"gain 95% CI":') and '"-": the committed runs predate' in after


def test_a_rerun_that_kept_its_prompts_scores_puts_the_intervals_on_the_page(tmp_path, monkeypatch):
    from benchmarks.learning import real_table

    result = json.loads((RESULTS_DIR / "learning-real.json").read_text())
    for run in result["runs"]:  # 40 prompts each, as many right as the run's scores say; none lost by training
        right = (round(run["before"] * 40), round(run["kept"] * 40))
        run["scores"] = {
            side: [1.0] * k + [0.0] * (40 - k) for side, k in zip(("before", "after"), right, strict=True)
        }
    result["table"] = real_table(result["runs"])
    (tmp_path / "learning-real.json").write_text(json.dumps(result))
    page = tmp_path / "README.md"
    page.write_text("<!-- results: learning-real.json -->\n<!-- /results -->\n")
    monkeypatch.setattr("benchmarks.readme.PAGES", [page])
    monkeypatch.setattr("benchmarks.readme.REPO_ROOT", tmp_path)
    monkeypatch.setattr("benchmarks.readme.RESULTS_DIR", tmp_path)
    assert main([]) == 0
    header, _, *rows = page.read_text().splitlines()[1:-1]
    column = header.split(" | ").index("gain 95% CI")
    seeds = [row.split(" | ")[column] for row in rows[:3]]
    assert all(0 < float(cell.split(" to ")[0]) for cell in seeds)  # +0.25 to +0.43 on 40 prompts: clear of 0
    assert " to " in rows[3].split(" | ")[column] and rows[3].startswith("| mean ± sd")

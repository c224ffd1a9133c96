"""The figures README.md and the docs show, from the benchmarks' own output: never typed.

    python -m benchmarks.readme            # rewrites each marked table from benchmarks/results/
    python -m benchmarks.readme --check    # exit 1, naming the block, where a page and a result differ

A page marks a table that comes from a benchmark's JSON with `<!-- results: NAME.json -->` on the line before it and
`<!-- /results -->` after it; the table between them is that JSON's `table`, as the benchmark printed it. The JSON
files a page cites are committed (benchmarks/results/ is otherwise ignored: `git add -f` the one a page cites), and
tests/benchmarks/test_readme_figures.py checks both that each page holds its result's table and that the table is
what the benchmark renders from the result's own runs, so neither the page nor the JSON's table can be typed.
"""

import argparse
import json
import re
import sys

from benchmarks.common import REPO_ROOT, RESULTS_DIR

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w.-]+\.json) -->\n)(?:(?P<table>.*?)\n)?(<!-- /results -->)", re.DOTALL)


def result_table(name: str) -> str:
    """The table the benchmark printed into `benchmarks/results/NAME`."""
    return json.loads((RESULTS_DIR / name).read_text())["table"].strip()


def render(text: str) -> str:
    """`text` with every marked block replaced by its result's table."""
    return BLOCK.sub(lambda m: m.group(1) + result_table(m.group("name")) + "\n" + m.group(4), text)


def stale_blocks() -> list[str]:
    """`page: NAME.json` for each marked block that differs from its result."""
    return [
        f"{page.relative_to(REPO_ROOT)}: {m.group('name')}"
        for page in PAGES
        for m in BLOCK.finditer(page.read_text())
        if (m.group("table") or "").strip() != result_table(m.group("name"))
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say which blocks differ (exit 1 if any)")
    args = p.parse_args(argv)
    if args.check:
        stale = stale_blocks()
        print("\n".join(stale) or "every marked table is its result's")
        return 1 if stale else 0
    for page in PAGES:
        text = page.read_text()
        if render(text) != text:
            page.write_text(render(text))
            print(f"rewrote {page.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

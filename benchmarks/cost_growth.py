"""Benchmark 5: how a training step's cost grows with rollouts_per_prompt (K) and max_response_length (L).

    python -m benchmarks.cost_growth [--quick] [--json PATH]

Runs grpoflow's training stage (in this process) over a grid of K x L on builtin:tiny with the demo's prompts,
reads TRL's own per-step `step_time` from `metrics.jsonl` (median over the steps after the first), and fits
step time = a + b * K * L by least squares. The grid is run twice, the second time in reverse order, and each
cell's median is reported relative to the smallest cell, so the machine's load drifting during the run tilts
neither end of the grid. R^2 says how much of the growth K x L explains; the fit is also made against the tokens
actually generated (K x mean completion length), since a completion may end before L.
"""

import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import finish, markdown_table, median, parser, pin_threads
from benchmarks.trainer_vs_trl import NO_CHECKPOINTS, prepare_job, run_project, shaped_workload


def linear_fit(y: list[float], **terms: list[float]) -> dict:
    """Least-squares y = a + sum of b_i * term_i, with R^2; returns a (`intercept_s`), each b_i and R^2."""
    y = np.asarray(y, float)
    design = np.column_stack([np.ones_like(y), *(np.asarray(t, float) for t in terms.values())])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    r2 = 1 - (residual**2).sum() / ((y - y.mean()) ** 2).sum()
    return {
        "intercept_s": float(coef[0]),
        **{k: float(c) for k, c in zip(terms, coef[1:], strict=True)},
        "r2": float(r2),
    }


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    pin_threads()
    ks, lengths, steps, passes = ([2, 4], [4, 8], 2, 1) if args.quick else ([2, 4, 8], [8, 16, 32], 6, 2)
    grid = [(k, length) for k in ks for length in lengths]
    runs: dict[tuple[int, int], list[dict]] = {cell: [] for cell in grid}
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-") as tmp:
        root = Path(tmp)
        templates = {}
        for k, length in grid:
            w = shaped_workload(f"k{k}-l{length}", "demo-shaped", root, steps, zero_variance_share=0.0)
            w.rollouts_per_prompt, w.max_response_length = k, length
            w.checkpoint_every = NO_CHECKPOINTS["checkpoint_every"]  # step_time excludes saves anyway
            templates[k, length] = prepare_job(w, root)
        run_project(templates[grid[0]], root, "warm-up", None)  # one-off costs of the first run in a process
        for p in range(passes):
            for cell in grid if p % 2 == 0 else reversed(grid):
                runs[cell].append(run_project(templates[cell], root, f"k{cell[0]}-l{cell[1]}-{p}", None))
    cells = []
    for k, length in grid:
        step = median(r["step_time_s"] for r in runs[k, length])
        tokens = k * median(r["mean_completion_length"] for r in runs[k, length])
        cells.append({"K": k, "L": length, "K_x_L": k * length, "generated_tokens": tokens, "step_time_s": step})
    base = cells[0]["step_time_s"]
    for c in cells:
        c["relative_to_smallest"] = c["step_time_s"] / base
    times = [c["step_time_s"] for c in cells]
    fit_kl = linear_fit(times, K_x_L=[c["K_x_L"] for c in cells])
    fit_tokens = linear_fit(times, generated_tokens=[c["generated_tokens"] for c in cells])
    # Generation decodes L tokens one after the other, each for all K completions at once: a per-token cost that
    # does not grow with K shows up as a term in L alone.
    fit_two = linear_fit(times, L=[c["L"] for c in cells], K_x_L=[c["K_x_L"] for c in cells])
    table = markdown_table(
        ["K", "L", "K x L", "generated tokens/step", "step time / smallest cell's"],
        [[c["K"], c["L"], c["K_x_L"], c["generated_tokens"], c["relative_to_smallest"]] for c in cells],
    )
    table += (
        f"\n\nFit step_time = a + b * K * L: R^2 = {fit_kl['r2']:.3f} (a = {fit_kl['intercept_s'] / base:.2f}, "
        f"b = {fit_kl['K_x_L'] / base:.4f}, in units of the smallest cell's step). Against generated tokens "
        f"(K x mean completion length): R^2 = {fit_tokens['r2']:.3f}. With a term in L alone, a + c L + b K L: "
        f"R^2 = {fit_two['r2']:.3f} (c = {fit_two['L'] / base:.4f}, b = {fit_two['K_x_L'] / base:.4f})."
    )
    return finish(
        "cost_growth",
        args,
        table,
        {
            "steps": steps,
            "passes": passes,
            "cells": cells,
            "fit_K_x_L": fit_kl,
            "fit_generated_tokens": fit_tokens,
            "fit_L_and_K_x_L": fit_two,
            "runs": {f"K={k},L={length}": r for (k, length), r in runs.items()},
        },
    )


if __name__ == "__main__":
    main()

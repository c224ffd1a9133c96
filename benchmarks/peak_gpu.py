"""Runs a module as `python -m MODULE ARGS...` would, then prints its peak GPU memory (for benchmark 6).

    python -m benchmarks.peak_gpu grpoflow.trainers.grpo runs/<job_id>

Both sides of the GPU benchmark start through it, so the wrapper costs them the same. The last line it prints is
`BENCH_PEAK_GPU_MB=<torch.cuda.max_memory_allocated in MiB>`.
"""

import runpy
import sys


def main() -> int:
    module, sys.argv = sys.argv[1], sys.argv[1:]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    import torch

    if torch.cuda.is_available():
        print(f"BENCH_PEAK_GPU_MB={torch.cuda.max_memory_allocated() / 2**20:.1f}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The cost model's prediction for a merged call beside the measured merged-vs-unmerged call ratio, on
the CPU shapes the tests and fixtures run (harness/call_ratio.py SHAPES), at the ToMA Patch node's
defaults forced to merge (min_tokens 0, start_percent 0, merge_every 2), at the scope the node's auto
picks and at scope block: the table in docs/advice.md, and what tests/integration/test_cost_accuracy.py
checks (within 15 %).

    OMP_NUM_THREADS=1 COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.cost_accuracy [--budget 20]

Measured on this thread's CPU clock, merged and unmerged calls interleaved, medians, the allocator
pinned (harness/call_ratio.py); +- is the ratio's notch uncertainty (about a 95 % interval).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from harness import comfy_env

CASES = [("wan_fixture", "auto"), ("wan_fixture", "block"), ("wan_shaped", "auto"), ("wan_shaped", "block"),
         ("flux", "auto"), ("sdxl", "auto")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=20.0, help="CPU seconds per case at most")
    p.add_argument("--settle", type=float, default=0.03, help="stop adding runs once the ratio's uncertainty is within this")
    p.add_argument("--cases", nargs="+", default=None, metavar="SHAPE:SCOPE",
                   help="only these cases, e.g. wan_fixture:block flux:auto (default: all)")
    p.add_argument("--allocator", choices=["pinned", "default"], default="pinned",
                   help="default: leave glibc's dynamic mmap threshold as it is (unpinned calls do not repeat run to run)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    root = comfy_env.import_comfy()
    if isinstance(root, str):
        sys.exit(root)
    from harness import call_ratio

    load = os.getloadavg()[0]
    print("| shape | scope | call (tokens, text, batch) | predicted (range) | measured | error | merged / unmerged ms | calls | runs' own ratios |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    cases = [tuple(c.split(":")) for c in args.cases] if args.cases else CASES
    for shape, scope in cases:
        base, run = call_ratio.shape_setup(shape)
        a = call_ratio.measure(shape, base, run, scope, settle=args.settle, budget_s=args.budget, pin=args.allocator == "pinned")
        print(f"| {shape} | {scope} ({a.scope}) | {a.shape} | {a.predicted:.2f}x ({a.low:.2f}-{a.high:.2f}) | {a.measured:.2f}x +-{a.uncertainty:.0%} | "
              f"{a.error:+.0%} | {a.merged_ms:.1f} / {a.unmerged_ms:.1f} | {a.calls} | "
              f"{min(a.runs):.2f}-{max(a.runs):.2f}x ({len(a.runs)} runs) |", flush=True)
    print(f"\nComfyUI {comfy_env.comfy_version(root)}, CPU, fp32, one thread, allocator {args.allocator}; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {time.strftime('%Y-%m-%d %H:%M')}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

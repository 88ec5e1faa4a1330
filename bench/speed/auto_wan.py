"""min_tokens "auto" where the cost model is close to break-even: whole sampling runs (cfg 1, euler /
simple) through the ToMA Patch node's settings, at its defaults (start_percent 0.4) and at
start_percent 0, against the unpatched model, in turns. --model wan_shaped (default): the Wan-shaped
model (harness/tiny_wan.py WAN_SHAPED: width 256, 4 blocks, latent 7 x 24 x 40 = 1,680 tokens), 4
steps; wan_fixture: the trained Wan fixture (width 64, 6 blocks, 9 x 32 x 32 latent = 2,304 tokens,
fixtures/wan.safetensors), 20 steps.
--scope: the node's scope input, by default the ToMA Patch node's (auto: keys_values on Wan).

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.auto_wan --rounds 7 --threads 1
    COMFYUI_PATH=/path/to/ComfyUI python -m bench.speed.auto_wan --model wan_fixture --rounds 5 --threads 1

Every round runs each configuration once, unpatched first (after one untimed round); a
configuration's speed is the median over the rounds of the round's unpatched run time over its own,
with the lowest and highest. The min_tokens 0 rows merge every call of the window: what auto decides
between. For the auto rows, what the run lines said auto did (nodes/run/gain.py: measured, then kept
merging or stopped; or the prediction decided) and the merged calls' speed-up their run lines
measured (median over the runs that had both kinds of call). The clock's noise: the unpatched runs'
spread (slowest / fastest) and the load average. --clock wall (default; the device synchronised
around each run) or cpu (this process's CPU time, one thread: waiting for a shared core does not count).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

import torch

from harness.pack import PACK_NAME, pack_module

from .. import cli, timing

STARTS = (0.4, 0.0)


class RunLines(logging.Handler):
    """Keeps the RunRecord of each ToMA run line (nodes/run/report.py TOMA_RUN)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        run = getattr(record, pack_module("nodes.run.report").TOMA_RUN, None)
        if run is not None:
            self.records.append(run)


def configurations(base: Any, scope: str) -> dict[str, Any]:
    """Unpatched, then auto and min_tokens 0 at each start_percent, the other inputs the ToMA Patch
    node's defaults (nodes/node/toma_nodes.py) and `scope` (the node's: "auto")."""
    nodes, patching = pack_module("nodes.node.toma_nodes"), pack_module("nodes.node.patching")
    defaults = {i.id: i.default for i in nodes.ToMAPatch.define_schema().inputs if i.id != "model"}
    assert defaults["start_percent"] == STARTS[0], defaults
    configs = {"unpatched": base}
    for min_tokens in ("auto", 0):
        for start in STARTS:
            settings = nodes.build_settings(**(defaults | {"start_percent": start}), min_tokens=min_tokens, scope=scope)
            configs[f"min_tokens {min_tokens}, start_percent {start:g}"] = patching.patch_model(base, settings)
    return configs


def model_and_inputs(name: str) -> tuple[Any, tuple[int, ...], list, list, int]:
    """(ModelPatcher, latent shape, positive, negative, steps) of --model `name`."""
    from harness import tiny_wan, trained_video

    if name == "wan_fixture":
        positive, negative = trained_video.conditioning()
        return trained_video.load_model(), trained_video.latent_shape(), positive, negative, 20
    model = tiny_wan.build_wan("t2v", **tiny_wan.WAN_SHAPED)
    positive = tiny_wan.conditioning(model, 1, tiny_wan.WAN_SHAPED_LATENT)
    return model, tiny_wan.WAN_SHAPED_LATENT, positive, positive, 4


def tokens_of(latent: tuple[int, ...]) -> int:
    """Image tokens of a Wan latent (B, C, F, H, W): F x H/2 x W/2 (patch 1 x 2 x 2)."""
    return latent[2] * (latent[3] // 2) * (latent[4] // 2)


def prediction_line(patched: Any, tokens: int, device: str) -> str:
    """min_tokens auto's prediction for the model's calls of `tokens` image tokens (nodes/run/prediction.py Prediction)."""
    settings = pack_module("nodes.settings")
    cost = patched.model_options["transformer_options"][settings.TOMA_KEY].config.cost
    p = cost.predict(tokens, 0, device, 1)
    verdict = "too close to call: measured" if p.close else "decided by the prediction"
    return (f"min_tokens auto on {device}: predicted {p.speedup:.2f}x, {p.low:.2f}-{p.high:.2f}x within the cost "
            f"model's error, against {pack_module('nodes.run.prediction').AUTO_MIN_SPEEDUP:g}x: {verdict}\n")


def outcome(record: Any) -> str:
    """What min_tokens auto did in a run, from its record: 'measured X.XXx, merged' / 'measured X.XXx,
    stopped', or the calls merged when the prediction decided."""
    if not record.auto:
        return f"predicted: {record.calls_merged}/{record.total_calls} calls merged"
    (measured,) = record.auto
    return f"{'merged' if measured.merge else 'stopped'} ({record.calls_merged}/{record.total_calls} calls merged)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_device_args(p)
    cli.add_kernel_args(p)
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (after one untimed round)")
    p.add_argument("--model", choices=["wan_shaped", "wan_fixture"], default="wan_shaped")
    p.add_argument("--steps", type=int, default=None, help="default: 4 (wan_shaped), 20 (wan_fixture)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch default)")
    p.add_argument("--clock", choices=list(timing.CLOCKS), default="wall")
    node = pack_module("nodes.settings")
    p.add_argument("--scope", choices=list(node.SCOPES), default=node.NODE_SCOPE,
                   help="the node's scope input (default: the ToMA Patch node's, auto: keys_values on Wan)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = cli.import_comfy(args)
    from harness import tiny_models

    base, latent, positive, negative, steps = model_and_inputs(args.model)
    args.steps = args.steps or steps
    configs = configurations(base, args.scope)
    lines = RunLines()
    logging.getLogger(f"{PACK_NAME}.nodes.run.wrappers").addHandler(lines)
    logging.getLogger(PACK_NAME).setLevel(logging.INFO)

    def run(model: Any) -> None:
        tiny_models.sample(model, latent, steps=args.steps, cfg=1.0, positive=positive, negative=negative)

    seconds: dict[str, list[float]] = {name: [] for name in configs}
    outcomes: dict[str, Counter] = {name: Counter() for name in configs}
    merged_calls: dict[str, list[float]] = {name: [] for name in configs}
    load = os.getloadavg()[0]
    for round_index in range(args.rounds + 1):
        for name, model in configs.items():
            ms = timing.timed_ms(lambda model=model: run(model), args.device, timing.CLOCKS[args.clock])
            if round_index and name != "unpatched":
                record = lines.records[-1]
                outcomes[name][outcome(record)] += 1
                if record.gain is not None and record.gain.measured:
                    merged_calls[name].append(record.gain.call)
            if round_index:
                seconds[name].append(ms / 1000)
    plain = seconds["unpatched"]
    tokens = tokens_of(latent)
    print(cli.run_header(root, args) + f"{args.model}, latent {'x'.join(map(str, latent[2:]))} = {tokens} tokens, "
          f"{args.steps} steps, cfg 1; {args.rounds} rounds in turns, {args.clock} clock")
    print(prediction_line(configs["min_tokens auto, start_percent 0.4"], tokens, args.device.split(":")[0]))
    print("| configuration | run s (median) | speed vs unpatched (median) | lowest - highest | merged calls measured | what auto did |")
    print("|---|---:|---:|---|---:|---|")
    for name, values in seconds.items():
        ratios = [u / s for u, s in zip(plain, values)]
        did = "; ".join(f"{n}x {what}" for what, n in outcomes[name].most_common()) if name.startswith("min_tokens auto") else ""
        calls = f"{statistics.median(merged_calls[name]):.2f}x ({len(merged_calls[name])} runs)" if merged_calls[name] else ""
        print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(ratios):.2f}x | "
              f"{min(ratios):.2f} - {max(ratios):.2f} | {calls} | {did} |")
    print(f"\nClock: unpatched runs {min(plain):.2f}-{max(plain):.2f} s (spread {max(plain) / min(plain) - 1:.0%}); "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {time.strftime('%Y-%m-%d %H:%M')}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

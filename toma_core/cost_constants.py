"""The cost model's constants (cost.py): operation counts, kernel launches and the constants fitted
to measurements, with those measurements.

Calibration: MOVE is fitted to the merged / unmerged block times in CALIBRATION, measured on this
project's CPU (one thread, fp32, real ComfyUI blocks at the real width, random weights; `python -m
bench.speed.realsize measure`, figures in docs/realsize.md): every prediction there is within 12 %
of its measurement; GREEDY and PLAN_MOVES are fitted to plan times at tile 4 / 8 / 16 and 1-4 frames
(PLAN_CALIBRATION), within a factor 2.5 of each. cost.py's `call_speedup_range` turns these two errors
(BLOCK_ERROR, PLAN_ERROR) into the range a call's speed-up is predicted in, whatever its blocks
merge. At tiny widths on a CPU the model predicts a small gain (the tiny test Flux, C 64), as its
merged calls measure there; on a GPU such a call is launch-bound and the launch terms predict a loss.

Pure Python: no torch, no ComfyUI.
"""

LINEAR_DIT = 24.0
"""Flops per token and C^2 of a DiT block's per-token layers (Flux double and single, SD3, Wan, ...)."""

LINEAR_UNET = 36.0
"""Flops per token and C^2 of a UNet BasicTransformerBlock (attn1 4, attn2 q/out 2, GEGLU 12 MACs)."""

ATTENTION = 4.0
"""Flops per L^2 C of self-attention (Q K^T and A V)."""

CALIBRATION = (
    {"block": "flux", "width": 3072, "tokens": 256, "text": 256, "measured": 1.33},
    {"block": "flux", "width": 3072, "tokens": 1024, "text": 256, "measured": 1.62},
    {"block": "flux", "width": 3072, "tokens": 4096, "text": 256, "measured": 2.17},
    {"block": "flux", "width": 3072, "tokens": 4096, "text": 512, "measured": 1.84, "count": 57},
    {"block": "unet", "width": 640, "tokens": 576, "text": 0, "measured": 1.95},
    {"block": "unet", "width": 1280, "tokens": 144, "text": 0, "measured": 1.66},
    {"block": "unet", "width": 640, "tokens": 1024, "text": 0, "measured": 1.95},
    {"block": "unet", "width": 1280, "tokens": 256, "text": 0, "measured": 1.84},
)
"""Measured merged-over-unmerged speed-ups MOVE is fitted to, at ratio 0.5, tile 4: one Flux double
and one single block (their mean; the double builds the plan), text T joining the attention; one
SDXL BasicTransformerBlock at the level's width (cross-attention text not counted); and 57 Flux
blocks at 1024 px, every one merged. CPU, one thread (see the module docstring)."""

MOVE = 1000.0
"""Flop-equivalents per image token and channel of one merged block's merge + unmerge + residual
(memory-bound); fitted to CALIBRATION."""

KV_MERGE = 0.8
"""Flop-equivalents per image token, channel and tile destination of a keys/values block's K / V merge
(two (k, n) @ (n, C) matmuls per tile: 4 k flops per token and channel at the matmuls' best rate,
below it in flop-equivalents); fitted with KV_MOVE to KV_CALIBRATION."""

KV_MOVE = 220.0
"""Flop-equivalents per image token and channel of a keys/values block's copies: the tiles folded, the
rows around the merged ones, q / k / v padded to e' and the output's e channels taken back
(memory-bound at a real width: about 15 ns per token and channel on one thread); fitted with KV_MERGE
to KV_CALIBRATION."""

KV_CALIBRATION = (
    {"grid": (1, 88, 88), "width": 6144, "ratio": 0.5, "tile_frames": 1, "ms": 1318.7},
    {"grid": (1, 88, 88), "width": 6144, "ratio": 0.75, "tile_frames": 1, "ms": 868.3},
    {"grid": (1, 88, 88), "width": 6144, "ratio": 0.9, "tile_frames": 1, "ms": 581.2},
    {"grid": (1, 88, 88), "width": 3072, "ratio": 0.5, "tile_frames": 1, "ms": 557.8},
    {"grid": (1, 88, 88), "width": 3072, "ratio": 0.9, "tile_frames": 1, "ms": 257.2},
    {"grid": (5, 30, 40), "width": 5120, "ratio": 0.5, "tile_frames": 4, "ms": 836.0},
    {"grid": (5, 30, 40), "width": 5120, "ratio": 0.9, "tile_frames": 4, "ms": 623.4},
    {"grid": (5, 32, 40), "width": 1792, "ratio": 0.5, "tile_frames": 4, "ms": 194.2},
    {"grid": (5, 32, 40), "width": 4096, "ratio": 0.75, "tile_frames": 4, "ms": 447.3},
)
"""Measured ms of one keys/values block's work besides its attention kernel (nodes/machinery/keys_values.py
KeysValuesOverride around a kernel doing no attention, less that kernel on the unmerged q / k / v:
bench/speed/realsize_measure.py kv_overhead_ms, cached in bench/speed/realsize_cpu.json "kv_merge") on
frames x height x width tokens of Flux.2-dev (6144) / Flux.1-dev (3072) width with their text keys first,
and of Wan 14B (5120) / Kandinsky 5 Video Lite (1792) / Pro (4096) in the node's video plan (frame 0
alone, tiles of 4 frames), tile 8, one thread, process CPU clock, fastest of 3. keys_values_flops' merge
term is within a factor 2 of each (tests/test_cost.py); a block's attention is 100-1000 times longer."""

PLAN_MOVES = 0.85
"""A call's plan costs this many MOVE passes over its image tokens (features, assignment), once per
call, besides its similarities and greedy (plan_flops); fitted with GREEDY to PLAN_CALIBRATION."""

LAUNCH = {"cpu": 1.0e5, "cuda": 1.6e9}
"""Flop-equivalents of one kernel launch by device type: ~7 us per op at ~15 GFLOP/s (one thread of
this project's CPU), ~8 us of PyTorch's eager dispatch at ~200 TFLOP/s achieved (a data-centre GPU
in bf16). Other devices: as "cuda"."""

SERIAL = frozenset({"cpu"})
"""Device types whose launches add to the work (synchronous); on the others they overlap it."""

BLOCK_OPS = 30
"""Kernel launches of one transformer block (norms, modulation, projections, attention, MLP)."""

MERGE_OPS = 12
"""Extra launches of a merged block: merge, unmerge, residual, positional rows, dtype casts."""

KV_OPS = 24
"""Extra launches of a keys/values block (nodes/machinery/keys_values.py): K and V merged (fold, matmul,
cat of the rows around them), the log-mass column, the padded q / k / v, the output's slice."""

HEAD_MULTIPLE = 8
"""Head sizes fast attention kernels take are multiples of 8 (flash attention, SDPA's fused paths)."""

HEAD_WIDTH = 128
"""Head size e where a caller gives none: the DiTs' (Flux, Wan 14B, HunyuanVideo, Qwen-Image, ...)."""

PLAN_OPS = 40
"""Launches of one plan besides the greedy's iterations: features, tile similarities, the assignment."""

GREEDY = 75.0
"""Flop-equivalents per similarity entry and greedy iteration of facility location (toma_core/facility.py:
each of its k iterations reads the (G, n, n) tile similarities a few times, memory-bound); fitted to PLAN_CALIBRATION."""

PLAN_CALIBRATION = (
    {"grid": (4, 20, 21), "tile": 4, "frames": 1, "ms": 22.2}, {"grid": (4, 20, 21), "tile": 4, "frames": 2, "ms": 18.1},
    {"grid": (4, 20, 21), "tile": 4, "frames": 4, "ms": 30.1}, {"grid": (4, 20, 21), "tile": 8, "frames": 1, "ms": 42.2},
    {"grid": (4, 20, 21), "tile": 8, "frames": 2, "ms": 94.2}, {"grid": (4, 20, 21), "tile": 8, "frames": 4, "ms": 449.2},
    {"grid": (4, 20, 21), "tile": 16, "frames": 1, "ms": 453.2}, {"grid": (4, 20, 21), "tile": 16, "frames": 2, "ms": 2224.5},
    {"grid": (4, 20, 21), "tile": 16, "frames": 4, "ms": 7467.0},
    {"grid": (4, 16, 24), "tile": 4, "frames": 1, "ms": 11.7}, {"grid": (4, 16, 24), "tile": 4, "frames": 2, "ms": 14.6},
    {"grid": (4, 16, 24), "tile": 4, "frames": 4, "ms": 26.2}, {"grid": (4, 16, 24), "tile": 8, "frames": 1, "ms": 22.7},
    {"grid": (4, 16, 24), "tile": 8, "frames": 2, "ms": 57.7}, {"grid": (4, 16, 24), "tile": 8, "frames": 4, "ms": 284.4},
    {"grid": (4, 16, 24), "tile": 16, "frames": 1, "ms": 522.7},
)
"""Measured ms of one plan (toma_core.make_plan, ratio 0.5, width 256) on a grid of frames x height x
width tokens, at tile_size x tile_size x tile frames: `OMP_NUM_THREADS=1 python -m bench.speed.plan_cost
--frames F --height H --width W`, process CPU clock, fastest of 3, on a shared 2-core machine (spread
1.1-2.5x between repeats, wall / CPU 2-4). plan_flops is within a factor 2.5 of each over this
600-fold range. Tiles that do not divide the grid are padded (20 x 21 by tile 16 to 32 x 32), which
the model does not count: its low side."""

GREEDY_OPS = 16
"""Launches of one greedy iteration (gain, argmax with ties, pick, coverage update), batched over the tiles."""

TILE_TOKENS = 16
"""Tokens per tile n where a caller gives none: tile_size 4, one frame (the CALIBRATION setting)."""

LAUNCH_SECONDS_CPU = 7e-6
"""Seconds of one launch on this project's CPU, one thread: LAUNCH["cpu"] flop-equivalents take this long."""

BLOCK_ERROR = 0.12
"""Relative error of the merged blocks' predicted speed-up: every CALIBRATION point is within it
(tests/test_cost.py)."""

PLAN_ERROR = 2.5
"""Factor within which plan_flops meets the measured plan times of PLAN_CALIBRATION (tests/test_cost.py;
repeats on the shared machine spread up to that much)."""

CALIBRATED = frozenset({"cpu"})
"""Device types CALIBRATION and PLAN_CALIBRATION were measured on. Elsewhere (a GPU) no error is
measured, so no lower bound of a predicted speed-up is known."""

"""The cost model's constants (cost.py): operation counts, kernel launches and the constants fitted
to measurements, with those measurements.

Calibration: MOVE is fitted to the merged / unmerged block times in CALIBRATION, measured on this
project's CPU (one thread, fp32, real ComfyUI blocks at the real width, random weights; `python -m
bench.speed.realsize measure`, figures in docs/realsize.md): every prediction there is within 12 %
of its measurement; GREEDY and PLAN_MOVES are fitted to plan times at tile 4 / 8 / 16 and 1-4 frames
(PLAN_CALIBRATION), within a factor 2.5 of each. cost.py's `call_speedup_range` turns these two errors
(BLOCK_ERROR, PLAN_ERROR) into the range a call's speed-up is predicted in, whatever its blocks
merge. The CPU's flop rate (LAUNCH["cpu"] per LAUNCH_SECONDS_CPU), a call's work outside its blocks
(CALL_OPS) and the softmax per attention score (SCORE) are fitted to whole model calls of the small
models the tests and fixtures run (CALL_CALIBRATION): there launches, the plan and narrow heads weigh
most, and every prediction is within 11 % of its measured merged-vs-unmerged call ratio. On a GPU a
tiny call is launch-bound and the launch terms predict a loss.

Pure Python: no torch, no ComfyUI.
"""

LINEAR_DIT = 24.0
"""Flops per token and C^2 of a DiT block's per-token layers (Flux double and single, SD3, Wan, ...)."""

LINEAR_UNET = 36.0
"""Flops per token and C^2 of a UNet BasicTransformerBlock (attn1 4, attn2 q/out 2, GEGLU 12 MACs)."""

ATTENTION = 4.0
"""Flops per L^2 C of self-attention (Q K^T and A V)."""

SCORE = 128.0
"""Flop-equivalents per attention score (per query, key and head): its softmax, a few memory-bound
passes over the scores, which matter in narrow heads (SCORE / e beside ATTENTION's 4 per query, key
and channel: +100 % at e 32, +25 % at 128); fitted with LAUNCH["cpu"] and CALL_OPS to CALL_CALIBRATION (the Wan fixture's
heads of 32 gain more from merging than the Wan-shaped model's heads of 128)."""

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

KV_MERGE = 3.6
"""Flop-equivalents per image token, channel and tile destination of a keys/values block's K / V merge
(two (k, n) @ (n, C) matmuls per tile: 4 k flops per token and channel at the matmuls' best rate,
below it in flop-equivalents); fitted with KV_MOVE to KV_CALIBRATION."""

KV_MOVE = 990.0
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

PLAN_MOVES = 0.64
"""A call's plan costs this many MOVE passes over its image tokens (features, assignment), once per
call, besides its similarities and greedy (plan_flops); fitted with GREEDY to PLAN_CALIBRATION (in
flop-equivalents at LAUNCH["cpu"]'s rate)."""

LAUNCH = {"cpu": 4.5e5, "cuda": 1.6e9}
"""Flop-equivalents of one kernel launch by device type: ~7 us per op at ~64 GFLOP/s (one thread of
this project's CPU, fp32; the rate fitted with CALL_OPS and SCORE to CALL_CALIBRATION, where the
unmerged calls' predicted times come within 0.8-1.0x of the measured ones at widths 64 and 256), ~8 us
of PyTorch's eager dispatch at ~200 TFLOP/s achieved (a data-centre GPU in bf16). Other devices: as
"cuda". The plan and keys/values constants fitted to times in ms (PLAN_CALIBRATION, KV_CALIBRATION)
are in flop-equivalents at this rate."""

SERIAL = frozenset({"cpu"})
"""Device types whose launches add to the work (synchronous); on the others they overlap it."""

BLOCK_OPS = 30
"""Kernel launches of one transformer block (norms, modulation, projections, attention, MLP)."""

CALL_OPS = 1000
"""Launches of a model call's work outside its transformer blocks (embeddings, positions, the head,
ComfyUI's apply_model), about 7 ms on a CPU; a GPU overlaps them with its queued work, so only a
SERIAL device counts them. Fitted with LAUNCH["cpu"] and SCORE to CALL_CALIBRATION (the tiny Flux's
call measures 25-27 ms where its blocks are predicted 14 ms)."""

CALL_CALIBRATION = (
    {"shape": "wan_fixture", "width": 64, "head": 32, "blocks": (4, 2), "scope": "keys_values", "tokens": 2304,
     "others": 8, "batch": 1, "tile_tokens": 256, "measured": (0.99, 1.02, 0.99)},
    {"shape": "wan_fixture", "width": 64, "head": 32, "blocks": (4, 2), "scope": "block", "tokens": 2304,
     "others": 8, "batch": 1, "tile_tokens": 256, "measured": (1.33, 1.32, 1.36)},
    {"shape": "wan_shaped", "width": 256, "head": 128, "blocks": (3, 1), "scope": "keys_values", "tokens": 1680,
     "others": 19, "batch": 1, "tile_tokens": 256, "measured": (0.94, 0.92, 0.94)},
    {"shape": "wan_shaped", "width": 256, "head": 128, "blocks": (3, 1), "scope": "block", "tokens": 1680,
     "others": 19, "batch": 1, "tile_tokens": 256, "measured": (1.27, 1.31, 1.24)},
    {"shape": "flux", "width": 64, "head": 16, "blocks": (4, 0), "scope": "block", "tokens": 64,
     "others": 256, "batch": 2, "tile_tokens": 64, "measured": (0.88, 0.88, 0.87)},
)
"""Measured merged-vs-unmerged call ratios (unmerged / merged median call time) that LAUNCH["cpu"],
CALL_OPS and SCORE are fitted to, three runs each: `OMP_NUM_THREADS=1 python -m bench.speed.cost_accuracy`
(harness/call_ratio.py: the ToMA Patch node's defaults, ratio 0.5, tile 8 x 4 frames, blocks auto,
forced to merge every other step; this thread's CPU clock, the allocator pinned; docs/advice.md).
Shapes (harness/call_ratio.py SHAPES): the trained Wan fixture (width 64, heads of 32, 4 of 6 blocks
merged, cross-attention text), the Wan-shaped model (width 256, heads of 128, 3 of 4 blocks), the tiny
test Flux (width 64, heads of 16, all 4 blocks, its 256 text tokens joining the attention, batch 2).
The tiny SDXL (its UNet's convolutions priced by families/unet_cost.py) is checked by
tests/integration/test_cost_accuracy.py, like every shape here."""

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

GREEDY = 45.0
"""Flop-equivalents per similarity entry and greedy iteration of facility location (toma_core/facility.py:
each of its k iterations reads the (G, n, n) tile similarities a few times, memory-bound); fitted to PLAN_CALIBRATION
(in flop-equivalents at LAUNCH["cpu"]'s rate)."""

PLAN_CALIBRATION = (
    {"grid": (4, 20, 21), "channels": 256, "tile": 4, "frames": 1, "ms": 7.9}, {"grid": (4, 20, 21), "channels": 256, "tile": 4, "frames": 2, "ms": 8.9},
    {"grid": (4, 20, 21), "channels": 256, "tile": 4, "frames": 4, "ms": 9.3}, {"grid": (4, 20, 21), "channels": 256, "tile": 8, "frames": 1, "ms": 11.6},
    {"grid": (4, 20, 21), "channels": 256, "tile": 8, "frames": 2, "ms": 23.6}, {"grid": (4, 20, 21), "channels": 256, "tile": 8, "frames": 4, "ms": 55.1},
    {"grid": (4, 20, 21), "channels": 256, "tile": 16, "frames": 1, "ms": 89.4}, {"grid": (4, 20, 21), "channels": 256, "tile": 16, "frames": 2, "ms": 257.3},
    {"grid": (4, 20, 21), "channels": 256, "tile": 16, "frames": 4, "ms": 1352.0},
    {"grid": (4, 16, 24), "channels": 256, "tile": 4, "frames": 1, "ms": 6.4}, {"grid": (4, 16, 24), "channels": 256, "tile": 4, "frames": 2, "ms": 7.8},
    {"grid": (4, 16, 24), "channels": 256, "tile": 4, "frames": 4, "ms": 7.8}, {"grid": (4, 16, 24), "channels": 256, "tile": 8, "frames": 1, "ms": 7.8},
    {"grid": (4, 16, 24), "channels": 256, "tile": 8, "frames": 2, "ms": 16.6}, {"grid": (4, 16, 24), "channels": 256, "tile": 8, "frames": 4, "ms": 35.9},
    {"grid": (4, 16, 24), "channels": 256, "tile": 16, "frames": 1, "ms": 44.3}, {"grid": (4, 16, 24), "channels": 256, "tile": 16, "frames": 2, "ms": 119.2},
    {"grid": (4, 16, 24), "channels": 256, "tile": 16, "frames": 4, "ms": 472.6},
    {"grid": (9, 16, 16), "channels": 64, "tile": 4, "frames": 1, "ms": 4.6}, {"grid": (9, 16, 16), "channels": 64, "tile": 4, "frames": 2, "ms": 9.5},
    {"grid": (9, 16, 16), "channels": 64, "tile": 4, "frames": 4, "ms": 13.5}, {"grid": (9, 16, 16), "channels": 64, "tile": 8, "frames": 1, "ms": 10.7},
    {"grid": (9, 16, 16), "channels": 64, "tile": 8, "frames": 2, "ms": 24.5}, {"grid": (9, 16, 16), "channels": 64, "tile": 8, "frames": 4, "ms": 70.8},
    {"grid": (9, 16, 16), "channels": 64, "tile": 16, "frames": 1, "ms": 52.9}, {"grid": (9, 16, 16), "channels": 64, "tile": 16, "frames": 2, "ms": 160.8},
    {"grid": (9, 16, 16), "channels": 64, "tile": 16, "frames": 4, "ms": 1001.1},
)
"""Measured ms of one plan (toma_core.make_plan, ratio 0.5) on a grid of frames x height x width tokens
of `channels` features (256; 64 on the Wan fixture's 9 x 16 x 16 grid), at tile_size x tile_size x tile
frames: `OMP_NUM_THREADS=1 python -m bench.speed.plan_cost --frames F --height H --width W --channels C`,
process CPU clock, fastest of 3, on a shared 2-core machine (spread 1.0-1.6x between repeats, wall /
CPU 1-2). plan_flops is within a factor 2.1 of each over this 300-fold range. Tiles that do not
divide the grid are padded (20 x 21 by tile 16 to 32 x 32), which the model does not count."""

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

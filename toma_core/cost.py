"""Predicted speed-up of a model call whose transformer blocks run on merged tokens: an operation
count of each block, with the merge's own cost.

One block of width C on L tokens (L = N image tokens, plus the T text and R pass-through tokens that
join its attention in a joint-attention DiT such as Flux):

    unmerged = linear * L * C^2 + ATTENTION * L^2 * C
    merged   = linear * L' * C^2 + ATTENTION * L'^2 * C + MOVE * N * C,   L' = D + T + R

(scope "block"; scope "keys_values" keeps every token and shortens only the self-attention's keys
and values, L_kv = D + T + R, in heads padded from e to e' = padded_head(e) channels for the
log-mass channel (toma_core/keys_values.py):

    keys_values = linear * L * C^2 + ATTENTION * L * L_kv * C * e' / e + (KV_MERGE * k + KV_MOVE) * N * C

with k = n (1 - ratio) destinations per plan tile of n tokens: only attention shrinks, and the gain
is bounded by the attention's share of the block), times the batch B, and the kernel launches,
priced per attention kernel (toma_core/kernels.py): every attention term is divided by the kernel's
speed against SDPA (a faster kernel shrinks attention's share of a block, so merging gains less; the
merge's own work is unchanged), and the keys/values padding e' / e becomes the kernel's bucket of e'
over its bucket of e for the channel form, 1 for the forms that keep the head (equal_mass, plain:
toma_core/keys_values.py choose_form); a matmul kernel (a CPU's SDPA) pays e' / e itself. Launches are
priced at LAUNCH[device] flop-equivalents each (BLOCK_OPS per block, MERGE_OPS more per merged block, PLAN_OPS per plan). A CPU runs the launches
and the work one after the other (their sum); a GPU launches asynchronously, so a block takes the
longer of its work and its launches: a small call that merging would shorten is launch-bound and
gains nothing.

D = N * (1 - ratio). `linear` counts the flops per token and C^2 of the block's per-token layers
(LINEAR_DIT for a Flux, SD3 or Wan block: q/k/v 3, out 1, MLP 8 multiply-adds; LINEAR_UNET for
SDXL's BasicTransformerBlock: self-attention 4, cross-attention q/out 2, GEGLU 12). ATTENTION: Q K^T
and A V. MOVE prices the merge, the unmerge and the residual (ToMA §3.3): a few matmuls of the
(k, n) tile matrices, cheap in flops but memory-bound, so it is given in flop-equivalents per image
token and channel (about ten passes over the tokens at a GPU's ~400 flops per element moved). The
plan (facility location, ToMA §3.2) is built once per call and shared by every merged block
(plan_flops): PLAN_MOVES passes of the same memory-bound work, the tile similarities, and the
greedy, whose k = n (1 - ratio) iterations each read the (G, n, n) similarities (G n = N), so its work
grows as N n^2 with the tile's n = tile_size^2 x tile_frames tokens: a plan at tile 8 x 4 frames
(n 256) costs about 250 times the greedy work per token of one at tile 4 (n 16).

Attention's rate per query, key and channel is ATTENTION plus SCORE / e (`attention_rate`): each score's
softmax, which weighs in narrow heads. A call's work outside its blocks (embeddings, the head) is
CALL_OPS launches on a CPU (on a GPU it overlaps the queued kernels). Cross-attention to the text
(UNet, Wan) and the per-sample modulation are left out: under 2 % of a real block.

The constants, and the measurements the fitted ones are fitted to, are in cost_constants.py.

Pure Python: no torch, no ComfyUI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .cost_constants import (
    ATTENTION,
    BLOCK_ERROR,
    BLOCK_OPS,
    CALL_OPS,
    CALIBRATED,
    GREEDY,
    GREEDY_OPS,
    HEAD_MULTIPLE,
    HEAD_WIDTH,
    KV_MERGE,
    KV_MOVE,
    KV_OPS,
    LAUNCH,
    LINEAR_DIT,
    MERGE_OPS,
    MOVE,
    PLAN_ERROR,
    PLAN_MOVES,
    PLAN_OPS,
    SCORE,
    SERIAL,
    TILE_TOKENS,
)
from .kernels import KERNELS, MATMUL, Kernel


CHANNEL = "channel"
"""The keys/values form that carries log m in an extra head channel (toma_core/keys_values.py CHANNEL):
the only form whose head size, and so its kernel bucket, grows."""


def padded_head(size: int) -> int:
    """e' = e + 1 rounded up to HEAD_MULTIPLE: the head size that holds the keys/values scope's log-mass channel."""
    return -(-(size + 1) // HEAD_MULTIPLE) * HEAD_MULTIPLE


def attention_rate(head: int, padded: int | None = None) -> float:
    """Flop-equivalents per query, key and channel of self-attention in heads of e = `head` channels:
    ATTENTION for Q K^T and A V (on e' = `padded` channels, default e), plus SCORE per score (its
    softmax) spread over the head's e channels: narrow heads pay more per flop."""
    return ATTENTION * (padded or head) / head + SCORE / head


def launch_cost(device: str) -> float:
    """Flop-equivalents of one launch on a device of this type ("cpu", "cuda", "mps", ...)."""
    return LAUNCH.get(device, LAUNCH["cuda"])


def timed(work: float, ops: int, device: str) -> float:
    """Flop-equivalents of `work` issued as `ops` launches on `device` (see SERIAL)."""
    launches = ops * launch_cost(device)
    return work + launches if device in SERIAL else max(work, launches)


@dataclass(frozen=True)
class BlockCost:
    """One group of identical blocks of a model call, as the cost model sees it.

    width: C. count: how many such blocks. share: tokens at the block per image token of the call
    (1 in a DiT; 1/s^2 at a UNet level s times smaller than the latent). linear: flops per token and
    C^2 of its per-token layers (a convolution block: 2 * its parameters, with width 1). attention:
    it self-attends over its tokens. joint: text and pass-through tokens join that attention.
    merged: the setting merges these blocks. scope: how (nodes/settings.py SCOPES): "block", the
    whole block runs on the D merged tokens; "attention", only its attention does, its per-token
    layers run on all N; "keys_values", every token keeps its query and its layers, the attention
    runs over D merged image keys. head: the attention's head size e (the keys/values scope pads it).
    kernel: the attention kernel it runs on (toma_core/kernels.py; a matmul kernel by default, the
    CPU calibration's). form: the keys/values form its merged attention takes (keys_values.choose_form).
    """

    width: int
    count: int = 1
    share: float = 1.0
    linear: float = LINEAR_DIT
    attention: bool = True
    joint: bool = True
    merged: bool = False
    scope: str = "block"
    head: int = HEAD_WIDTH
    kernel: Kernel = KERNELS[MATMUL]
    form: str = CHANNEL


def head_cost(block: BlockCost) -> float:
    """A keys/values block's merged attention cost per key against the unmerged call's: the channel's
    wider head at the kernel's bucket (kernels.Kernel.cost_ratio of e and e'); 1 for a form that keeps
    the head, and where the kernel refuses e' (keys_values.py then retries the call at e)."""
    if block.form != CHANNEL:
        return 1.0
    ratio = block.kernel.cost_ratio(block.head, padded_head(block.head))
    return 1.0 if ratio is None else ratio


def block_flops(block: BlockCost, tokens: float, others: float, attended: float | None = None) -> float:
    """Flops of one block on `tokens` image tokens and `others` joint tokens (counted if joint);
    its attention sees `attended` image tokens (default: `tokens`)."""
    extra = others if block.joint else 0.0
    work = block.linear * (tokens + extra) * block.width ** 2
    if block.attention:
        work += attention_rate(block.head) * ((tokens if attended is None else attended) + extra) ** 2 * block.width / block.kernel.speed
    return work


def merged_block_flops(block: BlockCost, tokens: float, others: float, kept: float, tile_tokens: int = TILE_TOKENS) -> float:
    """Flop-equivalents of one merged block's work, by its scope: on the kept tokens (scope "block"),
    its attention on them ("attention"), or every token attending over the kept keys
    (keys_values_flops, whose K / V merge grows with the tile); plus the merge's memory-bound moves."""
    if block.scope == "keys_values":
        return keys_values_flops(block, tokens, others, kept, tile_tokens)
    if block.scope == "block":
        work = block_flops(block, tokens * kept, others)
    else:
        work = block_flops(block, tokens, others, attended=tokens * kept)
    return work + MOVE * tokens * block.width


def keys_values_flops(block: BlockCost, tokens: float, others: float, kept: float, tile_tokens: int = TILE_TOKENS) -> float:
    """One keys/values block: its per-token layers on every token, its self-attention's L queries
    over L_kv = D + others keys at the form's head cost (head_cost) and the kernel's speed, plus the K / V merge:
    the tiles' (k, n) @ (n, C) matmuls on K and V, KV_MERGE k flops per image token and channel
    (k = n * kept destinations of a tile of n tokens), and the copies around them (KV_MOVE)."""
    extra = others if block.joint else 0.0
    work = block.linear * (tokens + extra) * block.width ** 2
    if block.attention:
        rate = ATTENTION * head_cost(block) + SCORE / block.head  # attention_rate at the kernel's bucket of the form's head
        work += rate * (tokens + extra) * (tokens * kept + extra) * block.width / block.kernel.speed
    destinations = max(1.0, min(tile_tokens, tokens) * kept)
    return work + (KV_MERGE * destinations + KV_MOVE) * tokens * block.width


def plan_flops(tokens: float, width: int, tile_tokens: int, kept: float, device: str = "cpu", batch: int = 1) -> float:
    """Predicted time, in flop-equivalents, of one call's plan on `tokens` image tokens of width C
    in tiles of n = `tile_tokens` tokens (tile_size^2 x tile_frames, at most the tokens), keeping
    the share `kept`: its memory-bound moves (PLAN_MOVES), the tile similarities (2 N n C) and the
    greedy's k = round(n * kept) iterations over the (G, n, n) similarities, G n = N: GREEDY * k N n,
    about kept * N n^2, so a tile twice as wide costs the plan four times as much per token."""
    n = max(1, min(int(tile_tokens), int(tokens)))
    k = max(1, round(n * kept))
    work = PLAN_MOVES * MOVE * tokens * width + 2.0 * tokens * n * width + GREEDY * k * tokens * n
    return timed(batch * work, PLAN_OPS + GREEDY_OPS * k, device)


@dataclass(frozen=True)
class CallParts:
    """One call's predicted time in flop-equivalents, in the parts the model's errors differ by:
    `plain`, its blocks that run as they are; `merged`, its merged blocks with their merge moves;
    `plan`, its plan."""

    plain: float = 0.0
    merged: float = 0.0
    plan: float = 0.0

    @property
    def total(self) -> float:
        return self.plain + self.merged + self.plan


def call_parts(
    blocks: Sequence[BlockCost], tokens: int, others: int = 0, kept: float = 1.0, device: str = "cpu", batch: int = 1,
    tile_tokens: int = TILE_TOKENS,
) -> CallParts:
    """Predicted time, by part, of one call of batch `batch` on `device` with N = `tokens` image
    tokens and `others` text / pass-through tokens per sample; merged blocks keep the share `kept`
    = D / N of their tokens (1 = unmerged), their plan tiles hold `tile_tokens` tokens."""
    plain = CALL_OPS * launch_cost(device) if device in SERIAL else 0.0
    merged = plan = 0.0
    for block in blocks:
        if block.count == 0:
            continue
        n = tokens * block.share
        if block.merged and kept < 1.0:
            ops = BLOCK_OPS + (KV_OPS if block.scope == "keys_values" else MERGE_OPS)
            merged += block.count * timed(batch * merged_block_flops(block, n, others, kept, tile_tokens), ops, device)
            if plan == 0.0:
                plan = plan_flops(n, block.width, tile_tokens, kept, device, batch)
        else:
            plain += block.count * timed(batch * block_flops(block, n, others), BLOCK_OPS, device)
    return CallParts(plain, merged, plan)


def call_flops(
    blocks: Sequence[BlockCost], tokens: int, others: int = 0, kept: float = 1.0, device: str = "cpu", batch: int = 1,
    tile_tokens: int = TILE_TOKENS,
) -> float:
    """Predicted time, in flop-equivalents, of one call (call_parts' total)."""
    return call_parts(blocks, tokens, others, kept, device, batch, tile_tokens).total


def call_speedup(
    blocks: Sequence[BlockCost], tokens: int, others: int, kept: float, device: str = "cpu", batch: int = 1,
    tile_tokens: int = TILE_TOKENS,
) -> float:
    """Predicted unmerged / merged time of one call (see call_flops); 1.0 when nothing merges."""
    merged = call_flops(blocks, tokens, others, kept, device, batch, tile_tokens)
    return call_flops(blocks, tokens, others, 1.0, device, batch) / merged if merged > 0 else 1.0


def call_speedup_range(
    blocks: Sequence[BlockCost], tokens: int, others: int, kept: float, device: str = "cpu", batch: int = 1,
    tile_tokens: int = TILE_TOKENS,
) -> tuple[float, float]:
    """(lowest, highest) unmerged / merged time of one call within the model's measured errors: its
    merged blocks' speed-up off by BLOCK_ERROR either way, its plan by a factor PLAN_ERROR, the blocks
    that run as they are exact. The lowest is 0 on a device the model was not calibrated on
    (CALIBRATED); (1, 1) when nothing merges."""
    unmerged = call_flops(blocks, tokens, others, 1.0, device, batch)
    parts = call_parts(blocks, tokens, others, kept, device, batch, tile_tokens)
    if parts.merged == 0.0 or unmerged <= 0.0:
        return 1.0, 1.0
    high = unmerged / (parts.plain + parts.merged / (1.0 + BLOCK_ERROR) + parts.plan / PLAN_ERROR)
    if device not in CALIBRATED:
        return 0.0, high
    return unmerged / (parts.plain + parts.merged / (1.0 - BLOCK_ERROR) + parts.plan * PLAN_ERROR), high

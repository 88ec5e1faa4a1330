"""Fidelity of token merging on tokens made from natural images: ToMA vs ToMe vs 2x2 pooling.

Run from the repository root (CPU, 1-3 minutes with the defaults on 2 shared cores):

    python -m bench.tokens.fidelity         (writes bench/out/fidelity/fidelity.md and fidelity.json)

Tokens. Each of scikit-image's bundled sample photographs (nothing is fetched at run time, no image
is stored in this repository) is resized so that its long side is `--grid` tokens of `--patch` x
`--patch` pixels, keeping the aspect ratio (so most grids are not divisible by the tile size). Each
patch (p*p*3 values) goes through one fixed, seeded random projection to C = `--channels` channels
and a LayerNorm without affine: (1, N, C) tokens in raster order, like a DiT block's normalised input.

Methods (all merge N -> D tokens and unmerge D -> N):
- ToMA (`toma_core.make_plan`) for every similarity x tile size x temperature; features = the tokens.
- ToMe's bipartite soft matching as ComfyUI's built-in `TomePatchModel` does it (re-implemented
  here from its description): 2x2 cells, one random destination per cell (seeded), every other
  token a source; the r = int(N * ratio) sources most cosine-similar to some destination are
  averaged into it (mean, destination included); unmerge copies the merged token back. The
  destination of a source may be anywhere in the image. Averaged over `--tome-seeds` seeds.
- Plain average pooling over 2x2 cells + nearest upsampling: only ratio 0.75 is natural for it.
  1x2 pooling (ratio 0.5) is listed as well for reference.

Errors (relative Frobenius norms, averaged over images):
- roundtrip: ||unmerge(merge(x)) - x|| / ||x||.
- attn: a self-attention layer with random seeded weights (content-based: keys share the query
  projection, so tokens attend to similar tokens) on the merged tokens, unmerged:
  ||U attn(M x) - attn(x)|| / ||attn(x)||. This is exactly ToMA's residual semantics,
  `unmerge_residual(x, Mx, Mx + attn(Mx)) - x` against `(x + attn(x)) - x`: we compare the
  branch's update only, because adding the identity path x to both sides would dilute the error.
- attn_prop: as attn, with proportional attention: log(cluster size) added to each merged key's
  logits, so a merged key weighs as much as the tokens it stands for (ToMe for ViTs does this; a
  candidate improvement, not what the nodes do).
- attn_q: as attn, but only the queries are merged and keys/values stay at all N tokens (what
  ComfyUI's ToMe node does inside attn1): ||U attn(Mx, x) - attn(x)|| / ||attn(x)||.

Writes `<out>/fidelity.md` (tables) and `<out>/fidelity.json` (every number, per image too).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch
import torch.nn.functional as F
from einops import rearrange

from harness.metrics import relative_error
from toma_core import BUDGETS, SIMILARITIES, check_ratio, make_plan

log = logging.getLogger("toma.fidelity")

SAMPLE_IMAGES = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "camera")
RATIOS = (0.25, 0.5, 0.75)
TILE_SIZES = (2, 4, 8)
TEMPERATURES = (1e-3, 1e-2, 0.0)
METRICS = ("roundtrip", "attn", "attn_prop", "attn_q")
COMPARE = (  # the nodes' default at the time of writing, and the setting bench/tokens/fidelity.py favours
    "toma (similarity=cosine, tile=4, temperature=0.001, budget=tile)",
    "toma (similarity=neg_sq_dist, tile=4, temperature=0.001, budget=tile)",
)


# --------------------------------------------------------------------------------------------
# Images and tokens


def load_sample_image(name: str):
    """A scikit-image sample photograph as a float32 (H, W, 3) array in [0, 1] (gray -> RGB)."""
    import numpy as np
    import skimage.data

    loader = getattr(skimage.data, name, None)
    if loader is None:
        raise ValueError(f"{name!r} is not a scikit-image sample image")
    image = np.asarray(loader())
    return to_rgb_float(image)


def to_rgb_float(image):
    """An (H, W) or (H, W, 3) uint8 or float array -> float32 (H, W, 3) in [0, 1]."""
    import numpy as np

    image = np.asarray(image)
    scale = float(np.iinfo(image.dtype).max) if image.dtype.kind in "ui" else 1.0
    image = image.astype(np.float32) / scale
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    return np.clip(image[..., :3], 0.0, 1.0)


def grid_for(height: int, width: int, long_side: int) -> tuple[int, int]:
    """Token grid (h, w) with the image's aspect ratio and max(h, w) = long_side (each >= 1)."""
    if long_side < 1:
        raise ValueError(f"long_side={long_side} must be >= 1 token")
    scale = long_side / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def resize_to_grid(image, long_side: int, patch: int) -> tuple[torch.Tensor, int, int]:
    """Resize an (H, W, 3) array to (h*p, w*p, 3) pixels; returns the tensor and the grid (h, w)."""
    from skimage.transform import resize

    if patch < 1:
        raise ValueError(f"patch={patch} must be >= 1 pixel")
    h, w = grid_for(image.shape[0], image.shape[1], long_side)
    pixels = resize(image, (h * patch, w * patch), anti_aliasing=True, preserve_range=True)
    return torch.from_numpy(pixels.astype("float32")), h, w


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """(H, W, 3) pixels -> (1, N, p*p*3) raster-order patch tokens (N = H/p * W/p)."""
    return rearrange(pixels, "(h p) (w q) c -> 1 (h w) (p q c)", p=patch, q=patch)


def unpatchify(tokens: torch.Tensor, h: int, w: int, patch: int) -> torch.Tensor:
    """(1, N, p*p*3) patch tokens -> (H, W, 3) pixels."""
    return rearrange(tokens[0], "(h w) (p q c) -> (h p) (w q) c", h=h, w=w, p=patch, q=patch)


def projection(in_dim: int, channels: int, seed: int) -> torch.Tensor:
    """A fixed (in_dim, C) Gaussian projection, the same for every image of a run."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(in_dim, channels, generator=g) / math.sqrt(in_dim)


def embed(patches: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B, N, p*p*3) patches -> (B, N, C) tokens: projection, then LayerNorm without affine."""
    x = patches @ weight
    return F.layer_norm(x, (x.shape[-1],))


# --------------------------------------------------------------------------------------------
# Mergers


class Merger(Protocol):
    """What every method offers: merge (B, N, C) -> (B, D, C) and unmerge (B, D, C) -> (B, N, C)."""

    num_kept: int

    def merge(self, x: torch.Tensor) -> torch.Tensor: ...

    def unmerge(self, y: torch.Tensor) -> torch.Tensor: ...


class HardMerger:
    """Hard clusters: token i belongs to merged token owner[b, i].

    merge = mean of each cluster (B, N, C) -> (B, D, C); unmerge = copy back (B, D, C) -> (B, N, C).
    """

    def __init__(self, owner: torch.Tensor, num_kept: int) -> None:
        if owner.dim() != 2:
            raise ValueError(f"owner must be (B, N), got shape {tuple(owner.shape)}")
        self.owner = owner
        self.num_kept = num_kept
        ones = torch.ones(owner.shape, dtype=torch.float32, device=owner.device)
        count = torch.zeros(owner.shape[0], num_kept, device=owner.device).scatter_add_(1, owner, ones)
        if bool((count == 0).any()):
            raise ValueError("every merged token needs at least one member")
        self.count = count

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        index = self.owner.unsqueeze(-1).expand_as(x)
        total = torch.zeros(x.shape[0], self.num_kept, x.shape[-1], dtype=x.dtype, device=x.device)
        total.scatter_add_(1, index, x)
        return total / self.count.to(x.dtype).unsqueeze(-1)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        return y.gather(1, self.owner.unsqueeze(-1).expand(-1, -1, y.shape[-1]))


def random_cell_destinations(h: int, w: int, generator: torch.Generator, sy: int = 2, sx: int = 2) -> torch.Tensor:
    """(h*w,) bool raster mask: one random destination in every full sy x sx cell (ToMe's layout).

    Tokens of the partial cells at the bottom/right edge (grid not divisible) are all sources.
    """
    gy, gx = h // sy, w // sx
    pick = torch.randint(sy * sx, (gy, gx), generator=generator)
    rows = torch.arange(gy).view(-1, 1) * sy + pick // sx
    cols = torch.arange(gx).view(1, -1) * sx + pick % sx
    mask = torch.zeros(h, w, dtype=torch.bool)
    mask[rows.flatten(), cols.flatten()] = True
    return mask.flatten()


def tome_merger(metric: torch.Tensor, h: int, w: int, ratio: float, generator: torch.Generator) -> HardMerger:
    """ToMe's bipartite soft matching (ComfyUI `TomePatchModel`), as hard clusters.

    metric (B, N, C). r = int(N * ratio) sources (at most all of them) are merged, each into its
    most cosine-similar destination; the sources whose best match is weakest stay unmerged.
    D = N - r. Destinations: `random_cell_destinations` (shared by the batch, as in ComfyUI).
    """
    batch, n, _ = metric.shape
    r = int(n * ratio)
    if r <= 0 or h == 1 or w == 1:  # every token kept
        return HardMerger(torch.arange(n, device=metric.device).expand(batch, -1).contiguous(), n)
    is_dst = random_cell_destinations(h, w, generator).to(metric.device)
    dst_idx = is_dst.nonzero().squeeze(-1)
    src_idx = (~is_dst).nonzero().squeeze(-1)
    unit = F.normalize(metric.float(), dim=-1)
    scores = unit[:, src_idx] @ unit[:, dst_idx].transpose(-1, -2)  # (B, S, Dd)
    best, best_dst = scores.max(dim=-1)  # (B, S)
    r = min(r, src_idx.numel())
    order = best.argsort(dim=-1, descending=True)  # (B, S): most similar sources first
    num_dst, num_unmerged = dst_idx.numel(), src_idx.numel() - r
    owner = torch.empty(batch, n, dtype=torch.long, device=metric.device)
    owner[:, dst_idx] = torch.arange(num_dst, device=metric.device)
    merged_src, kept_src = order[:, :r], order[:, r:]
    owner.scatter_(1, src_idx[merged_src], best_dst.gather(1, merged_src))
    kept = num_dst + torch.arange(num_unmerged, device=metric.device).expand(batch, -1)
    owner.scatter_(1, src_idx[kept_src], kept)
    return HardMerger(owner, num_dst + num_unmerged)


def pool_merger(batch: int, h: int, w: int, ky: int = 2, kx: int = 2) -> HardMerger:
    """Average pooling over ky x kx cells (partial cells at the edges pool what they hold) +
    nearest upsampling, as hard clusters. D = ceil(h/ky) * ceil(w/kx)."""
    gy, gx = -(-h // ky), -(-w // kx)
    owner = (torch.arange(h).view(-1, 1) // ky) * gx + torch.arange(w).view(1, -1) // kx
    return HardMerger(owner.flatten().expand(batch, -1).contiguous(), gy * gx)


# --------------------------------------------------------------------------------------------
# Metrics


@dataclass(frozen=True)
class RandomAttention:
    """Multi-head self-attention with random seeded weights; (B, N, C) -> (B, N, C).

    Keys share the query projection (content-based attention: a token attends to similar tokens);
    `sharpness` scales the logits so the attention is not nearly uniform.
    """

    w_q: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    heads: int
    sharpness: float

    @classmethod
    def create(cls, channels: int, heads: int, seed: int, sharpness: float = 4.0) -> "RandomAttention":
        if channels % heads:
            raise ValueError(f"channels={channels} must be divisible by heads={heads}")
        g = torch.Generator().manual_seed(seed)
        weights = [torch.randn(channels, channels, generator=g) / math.sqrt(channels) for _ in range(3)]
        return cls(*weights, heads=heads, sharpness=sharpness)

    def __call__(self, queries: torch.Tensor, context: torch.Tensor | None = None,
                 key_bias: torch.Tensor | None = None) -> torch.Tensor:
        """queries (B, Nq, C) attend to context (B, Nk, C) (default: the queries) -> (B, Nq, C).

        key_bias (B, Nk), optional: added to every query's logits for that key (e.g. log cluster size).
        """
        context = queries if context is None else context
        split = lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads)  # noqa: E731
        q, k, v = split(queries @ self.w_q), split(context @ self.w_q), split(context @ self.w_v)
        scale = self.sharpness / math.sqrt(q.shape[-1])
        mask = None if key_bias is None else rearrange(key_bias, "b n -> b 1 1 n").to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return rearrange(out, "b h n d -> b n (h d)") @ self.w_o


def cluster_sizes(merger: Merger, batch: int) -> torch.Tensor:
    """(B, D) how many tokens each merged token stands for: the column sums of the unmerge matrix
    (exact counts for hard clusters, total assignment weight for ToMA's soft ones)."""
    eye = torch.eye(merger.num_kept).expand(batch, -1, -1)
    return merger.unmerge(eye).sum(1)


def measure(merger: Merger, x: torch.Tensor, attn: RandomAttention, reference: torch.Tensor) -> dict[str, float]:
    """Roundtrip, whole-layer (plain and size-weighted) and query-only attention errors of one
    merger on tokens x (B, N, C)."""
    merged = merger.merge(x)
    log_size = cluster_sizes(merger, x.shape[0]).clamp_min(1e-6).log()
    return {
        "roundtrip": relative_error(merger.unmerge(merged), x),
        "attn": relative_error(merger.unmerge(attn(merged)), reference),
        "attn_prop": relative_error(merger.unmerge(attn(merged, key_bias=log_size)), reference),
        "attn_q": relative_error(merger.unmerge(attn(merged, x)), reference),
        "kept_fraction": merger.num_kept / x.shape[1],
    }


# --------------------------------------------------------------------------------------------
# The sweep


@dataclass(frozen=True)
class Method:
    """One row of the tables: a name, its settings, and how to build its merger for one image."""

    name: str
    settings: dict
    build: Callable[[torch.Tensor, int, int, float, int], Merger]  # (x, h, w, ratio, seed) -> merger
    ratios: tuple[float, ...]
    seeds: int = 1

    @property
    def label(self) -> str:
        extras = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.name} ({extras})" if extras else self.name


def toma_method(similarity: str, tile: int, temperature: float, ratios: Iterable[float], budget: str = "tile") -> Method:
    settings = {"similarity": similarity, "tile": tile, "temperature": temperature, "budget": budget}
    return Method("toma", settings, lambda x, h, w, ratio, seed: make_plan(
        x, h, w, ratio, tile, similarity=similarity, temperature=temperature, budget=budget), tuple(ratios))


def pool_method(ky: int, kx: int) -> Method:
    return Method(f"pool{ky}x{kx}", {}, lambda x, h, w, ratio, seed: pool_merger(x.shape[0], h, w, ky, kx),
                  (round(1 - 1 / (ky * kx), 4),))


def methods_for(args: argparse.Namespace) -> list[Method]:
    """Every method and setting of the sweep, in table order: ToMA's settings, ToMe, the two poolings."""
    methods = [toma_method(sim, tile, temp, args.ratios, budget) for budget in args.budgets
               for sim in args.similarities for tile in args.tiles for temp in args.temperatures]
    tome = Method("tome", {}, lambda x, h, w, ratio, seed: tome_merger(x, h, w, ratio, torch.Generator().manual_seed(seed)),
                  tuple(args.ratios), seeds=args.tome_seeds)
    return [*methods, tome, pool_method(2, 2), pool_method(1, 2)]


@dataclass
class ImageTokens:
    name: str
    tokens: torch.Tensor  # (1, N, C)
    h: int
    w: int


def prepare_images(args: argparse.Namespace) -> list[ImageTokens]:
    """Load, resize and embed every requested sample image (seeded projection shared by all)."""
    weight = projection(args.patch * args.patch * 3, args.channels, args.seed)
    images = []
    for name in args.images:
        pixels, h, w = resize_to_grid(load_sample_image(name), args.grid, args.patch)
        images.append(ImageTokens(name, embed(patchify(pixels, args.patch), weight), h, w))
        log.info("image %-22s grid %3d x %-3d (%d tokens, %d channels)", name, h, w, h * w, args.channels)
    return images


def run_method(method: Method, images: list[ImageTokens], attn: RandomAttention, refs: list[torch.Tensor], seed: int) -> list[dict]:
    """All ratios of one method on all images -> one record per ratio (means and per-image values)."""
    records = []
    for ratio in method.ratios:
        per_image, plan_seconds = {}, []
        for image, ref in zip(images, refs):
            trials = []
            for s in range(method.seeds):
                start = time.perf_counter()
                merger = method.build(image.tokens, image.h, image.w, ratio, seed + s)
                plan_seconds.append(time.perf_counter() - start)
                trials.append(measure(merger, image.tokens, attn, ref))
            per_image[image.name] = {k: statistics.fmean(t[k] for t in trials) for k in trials[0]}
        summary = {k: statistics.fmean(v[k] for v in per_image.values()) for k in next(iter(per_image.values()))}
        records.append({
            "method": method.name, **method.settings, "label": method.label, "ratio": ratio,
            **summary, "plan_ms": 1000 * statistics.median(plan_seconds), "per_image": per_image,
        })
    return records


def sweep(args: argparse.Namespace) -> list[dict]:
    """Every method x ratio on every image."""
    torch.manual_seed(args.seed)
    images = prepare_images(args)
    attn = RandomAttention.create(args.channels, args.heads, args.seed + 1, args.sharpness)
    with torch.no_grad():
        refs = [attn(image.tokens) for image in images]
        make_plan(images[0].tokens, images[0].h, images[0].w, 0.5, 4)  # warm-up before timing plans
        records = []
        methods = methods_for(args)
        for i, method in enumerate(methods, 1):
            records += run_method(method, images, attn, refs, args.seed)
            log.info("[%d/%d] %s", i, len(methods), method.label)
    return records


# --------------------------------------------------------------------------------------------
# Reporting


def lookup(records: list[dict], label: str, ratio: float) -> dict | None:
    return next((r for r in records if r["label"] == label and math.isclose(r["ratio"], ratio)), None)


def best_toma(records: list[dict], metric: str, ratios: Iterable[float]) -> dict | None:
    """The record, at the first of `ratios`, of the ToMA setting with the lowest mean `metric` over
    `ratios` (a setting without a record at every ratio is passed over); None when there is none."""
    ratios = list(ratios)
    scored = []
    for label in sorted({r["label"] for r in records if r["method"] == "toma"}):
        found = [lookup(records, label, ratio) for ratio in ratios]
        if all(found):
            scored.append((statistics.fmean(f[metric] for f in found), found[0]))
    return min(scored, key=lambda s: s[0])[1] if scored else None


def metric_table(records: list[dict], metric: str, ratios: list[float]) -> list[str]:
    """Markdown rows: one per method setting, one column per ratio."""
    labels = list(dict.fromkeys(r["label"] for r in records))
    lines = ["| method | " + " | ".join(f"ratio {r}" for r in ratios) + " |",
             "|---|" + "---:|" * len(ratios)]
    for label in labels:
        cells = [lookup(records, label, r) for r in ratios]
        lines.append(f"| {label} | " + " | ".join("–" if c is None else f"{c[metric]:.4f}" for c in cells) + " |")
    return lines


def goal_table(records: list[dict], label: str, ratios: list[float]) -> list[str]:
    """ToMA setting `label` against ToMe: error ratios per metric and ratio (goal <= 0.75)."""
    lines = ["| metric | " + " | ".join(f"ratio {r}" for r in ratios) + " |", "|---|" + "---:|" * len(ratios)]
    for metric in METRICS:
        cells = []
        for ratio in ratios:
            ours, tome = lookup(records, label, ratio), lookup(records, "tome", ratio)
            cells.append("–" if not (ours and tome) else f"{ours[metric] / tome[metric]:.3f}")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(records: list[dict], args: argparse.Namespace, seconds: float) -> str:
    ratios = sorted({rec["ratio"] for rec in records})
    main_ratios = list(args.ratios)
    best = {m: best_toma(records, m, main_ratios) for m in METRICS}
    best = {m: record["label"] for m, record in best.items() if record is not None}
    out = [
        "# Token-merging fidelity on natural-image tokens",
        "",
        f"Command: `python -m bench.tokens.fidelity {' '.join(sys.argv[1:])}`  ",
        f"Images: {', '.join(args.images)} (scikit-image samples); long side {args.grid} tokens of "
        f"{args.patch}x{args.patch} px; C={args.channels} (seeded projection + LayerNorm); attention: "
        f"{args.heads} heads, sharpness {args.sharpness}; ToMe averaged over {args.tome_seeds} seeds.  ",
        f"Machine: {platform.platform()}, torch {torch.__version__}; {seconds:.0f} s.",
        "",
        "Relative errors (lower is better), mean over images. `roundtrip`: ||U M x - x|| / ||x||. "
        "`attn`: ||U attn(M x) - attn(x)|| / ||attn(x)|| (whole layer on merged tokens; equals ToMA's "
        "`unmerge_residual` update). `attn_prop`: as `attn` with proportional attention (log cluster size "
        "added to each merged key's logits, as in ToMe for ViTs; not what the nodes do today). `attn_q`: queries merged, keys/values at full N (ComfyUI ToMe's scheme). "
        "Pooling has one natural ratio (2x2: 0.75, 1x2: 0.5).",
        "",
    ]
    for metric in METRICS:
        out += [f"## {metric}", "", *metric_table(records, metric, ratios), ""]
    out += ["## Kept fraction D/N", "", *metric_table(records, "kept_fraction", ratios), ""]
    out += ["## Plan build time (ms, median over images; indicative only: shared CPU, first calls slower)", "", *metric_table(records, "plan_ms", ratios), ""]
    for metric, label in best.items():
        out += [f"## Best ToMA setting by mean {metric} error: {label}", "",
                "Error of that setting / ToMe's error (goal: <= 0.75 at every ratio):", "",
                *goal_table(records, label, main_ratios), ""]
    for label in args.compare:
        if any(r["label"] == label for r in records):
            out += [f"## Against ToMe: {label}", "", "Error / ToMe's error (goal: <= 0.75 at every ratio):", "",
                    *goal_table(records, label, main_ratios), ""]
    return "\n".join(out)


def write_outputs(records: list[dict], args: argparse.Namespace, seconds: float) -> tuple[Path, Path]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / "fidelity.md", out / "fidelity.json"
    md_path.write_text(render_markdown(records, args, seconds) + "\n")
    meta = {k: v for k, v in vars(args).items() if k != "log_level"}
    json_path.write_text(json.dumps({"settings": meta, "seconds": seconds, "records": records}, indent=1) + "\n")
    return md_path, json_path


# --------------------------------------------------------------------------------------------
# CLI


def _list(cast: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type: comma-separated values, each through `cast`."""
    return lambda text: [cast(t) for t in text.split(",") if t]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/out/fidelity", help="output folder for fidelity.md and fidelity.json")
    p.add_argument("--images", type=_list(str), default=list(SAMPLE_IMAGES), help="comma-separated scikit-image sample names")
    p.add_argument("--grid", type=int, default=48,
                   help="tokens on the long side of each image (48 = Flux at 768 px; 64 = 1024 px, ~2x slower)")
    p.add_argument("--patch", type=int, default=4, help="pixels per token side")
    p.add_argument("--channels", type=int, default=64, help="token channels C")
    p.add_argument("--heads", type=int, default=4, help="attention heads (C must be divisible)")
    p.add_argument("--sharpness", type=float, default=4.0, help="attention logit scale (1 = standard random init)")
    p.add_argument("--ratios", type=_list(float), default=list(RATIOS), help="comma-separated merge ratios in (0, 1)")
    p.add_argument("--tiles", type=_list(int), default=list(TILE_SIZES), help="comma-separated ToMA tile sizes")
    p.add_argument("--similarities", type=_list(str), default=list(SIMILARITIES), help="comma-separated ToMA similarities")
    p.add_argument("--budgets", type=_list(str), default=list(BUDGETS), help="comma-separated ToMA token budgets (tile, adaptive)")
    p.add_argument("--temperatures", type=_list(float), default=list(TEMPERATURES), help="comma-separated ToMA temperatures")
    p.add_argument("--tome-seeds", type=int, default=3, help="random destination draws averaged for ToMe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", type=lambda t: [x.strip() for x in t.split(";") if x.strip()],
                   default=list(COMPARE),
                   help="';'-separated labels of ToMA settings that get their own table against ToMe")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Reject bad settings with a ValueError naming the value and the allowed range."""
    for ratio in args.ratios:
        check_ratio(ratio)
        if ratio == 0:
            raise ValueError("ratio=0 merges nothing, so it has no error to compare: give ratios in (0, 0.95]")
    for name in args.similarities:
        if name not in SIMILARITIES:
            raise ValueError(f"similarity={name!r} is not one of {', '.join(SIMILARITIES)}")
    if min(args.tiles, default=1) < 1 or args.tome_seeds < 1 or args.grid < 2:
        raise ValueError("tiles and --tome-seeds must be >= 1 and --grid >= 2")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    try:
        import skimage  # noqa: F401
    except ImportError:
        print("error: bench/tokens/fidelity.py needs scikit-image (pip install scikit-image)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    records = sweep(args)
    seconds = time.perf_counter() - start
    md_path, json_path = write_outputs(records, args, seconds)
    print(f"wrote {md_path} and {json_path} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

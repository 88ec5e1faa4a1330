"""Merge plans for video tokens: spatio-temporal tiles over frame segments.

A video DiT's image tokens are t-major (frame, row, column). Frames that must not merge with each
other (the first latent frame, which Wan's causal VAE encodes from one picture alone and which I2V
and Wan 2.2-5B hold at timestep 0; frames of different timesteps; reference frames that only pass
through) are cut into separate *segments*. Each segment gets its own plan: t x h x w tiles
(`make_plan` with `frames` / `tile_frames`) or the no-op plan for a pass-through span. A
`SegmentPlan` strings the parts together over one token sequence, so the block hook sees a single
plan: merge (B, N, C) -> (B, D, C), unmerge, and destination rows for the rope table.

Axis letters: B batch, N tokens of all segments, D kept tokens, C channels, F frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_plan_args, whole
from .plan import MergePlan, make_plan
from .rows import take_destinations


@dataclass(frozen=True)
class Segment:
    """A run of `frames` consecutive frames of `height` x `width` tokens.

    merge: False for a pass-through span (reference frames); tile_frames: how many frames one
    tile spans inside this segment (1 = spatial tiles only).
    """

    frames: int
    merge: bool = True
    tile_frames: int = 1


def frame_runs(frame_values: list[list[float]], separate_first: bool = True) -> list[tuple[int, int]]:
    """Cut F frames into runs of equal per-frame values, as (start, length) pairs.

    frame_values: one list of F values per sample (e.g. each frame's timestep). A run ends where
    any sample's value changes, and after frame 0 when separate_first (frame 0 is never merged
    with the frames after it).
    """
    count = len(frame_values[0]) if frame_values else 0
    if count == 0:
        raise ValueError("frame_runs needs at least one frame")
    if any(len(values) != count for values in frame_values):
        raise ValueError(f"every sample needs {count} per-frame values, got {[len(v) for v in frame_values]}")
    cuts = [
        f for f in range(1, count)
        if (separate_first and f == 1) or any(values[f] != values[f - 1] for values in frame_values)
    ]
    bounds = [0, *cuts, count]
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


class SegmentPlan(MergePlan):
    """Plans of consecutive token spans, run as one: part i merges tokens [offset_i, offset_i + n_i).

    dst_index (B, D) are indices into the whole sequence; merged tokens keep the part order.
    frame_counts: merged tokens per frame when the merged order is frame-major with the same count
    in every sample (then a per-frame modulation such as Wan 2.2-5B's stays exact), else None.
    """

    def __init__(self, parts: list[MergePlan], frame_counts: list[int] | None) -> None:
        batch = max(p.batch for p in parts)
        super().__init__(batch, sum(p.num_tokens for p in parts), parts[0].device)
        self.parts = parts
        self.frame_counts = frame_counts
        self._spans = _spans([p.num_tokens for p in parts])
        self._kept_spans = _spans([p.num_kept for p in parts])
        self._index = torch.cat([
            p.dst_index.expand(batch, -1) + start for p, (start, _) in zip(parts, self._spans)
        ], dim=1)

    @property
    def merges(self) -> bool:
        """True when some part keeps fewer tokens than it has."""
        return self.num_kept < self.num_tokens

    @property
    def num_kept(self) -> int:
        return sum(p.num_kept for p in self.parts)

    @property
    def dst_index(self) -> torch.Tensor:
        return self._index

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        # The parts write into one tensor: no concatenation of their pieces.
        out = x.new_empty(self.batch, self.num_kept, x.shape[-1])
        for p, (a, n), (c, d) in zip(self.parts, self._spans, self._kept_spans):
            p._merge_into(x[:, a:a + n], out[:, c:c + d])
        return out

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        return _cat_batch([p.unmerge(y[:, a:a + n]) for p, (a, n) in zip(self.parts, self._kept_spans)], 1)

    def unmerge_residual(self, x: torch.Tensor, merged_in: torch.Tensor, merged_out: torch.Tensor) -> torch.Tensor:
        spans = list(zip(self.parts, self._spans, self._kept_spans))
        if not x.dtype == merged_in.dtype == merged_out.dtype:
            return _cat_batch([
                p.unmerge_residual(x[:, a:a + n], merged_in[:, c:c + d], merged_out[:, c:c + d]) for p, (a, n), (c, d) in spans
            ], 1)
        out = x.new_empty(self.batch, self.num_tokens, x.shape[-1])  # the parts write into it, no concatenation
        for p, (a, n), (c, d) in spans:
            p._unmerge_residual_into(x[:, a:a + n], merged_in[:, c:c + d], merged_out[:, c:c + d], out[:, a:a + n])
        return out

    def cluster_sizes(self) -> torch.Tensor:
        return _cat_batch([p.cluster_sizes() for p in self.parts], 1)

    def size_bias(self) -> torch.Tensor | None:
        return self.cluster_sizes().log() if self.merges else None

    def balanced(self) -> MergePlan:
        """Each part balanced (a pass-through part keeps its mass-1 tokens)."""
        if not hasattr(self, "_balanced"):
            self._balanced = SegmentPlan([p.balanced() for p in self.parts], self.frame_counts)
        return self._balanced

    def take(self, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return take_destinations(rows, self._index, dim)

    def frame_of_kept(self, tokens_per_frame: int) -> torch.Tensor:
        """(B, D) frame of each merged token's destination (token index // tokens per frame)."""
        return torch.div(self._index, tokens_per_frame, rounding_mode="floor")


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return list(zip(starts, sizes))


def _cat_batch(pieces: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Concatenate along `dim`, expanding batch-1 pieces (no-op parts) to the others' batch."""
    batch = max(p.shape[0] for p in pieces)
    return torch.cat([p.expand(batch, *p.shape[1:]) if p.shape[0] != batch else p for p in pieces], dim=dim)


def make_video_plan(
    features: torch.Tensor,
    segments: list[Segment],
    height: int,
    width: int,
    ratio: float,
    tile_size: int,
    *,
    similarity: str = "cosine",
    temperature: float = 1e-3,
    budget: str = "tile",
    unmerge: str = "delta",
    frequency: torch.Tensor | None = None,
    penalty: float = 0.0,
) -> SegmentPlan:
    """A plan over the frames of `segments`, in order.

    features: (B, N, C) with N = sum(segment frames) * height * width, t-major. Merging segments
    get t x s x s tiles (t = min(tile_frames, frames), s = tile_size) and make_plan's destinations;
    pass-through segments keep every token. ratio, tile_size, similarity, temperature, budget,
    unmerge, frequency (B, N) and penalty as in make_plan.
    """
    check_segments(segments)
    check_plan_args(height, width, ratio, tile_size, temperature)
    per_frame = height * width
    total = sum(s.frames for s in segments) * per_frame
    if features.dim() != 3 or features.shape[1] != total:
        raise ValueError(
            f"features shape {tuple(features.shape)} does not match the segments: expected (B, "
            f"{sum(s.frames for s in segments)}*{height}*{width}={total}, C)"
        )
    parts: list[MergePlan] = []
    counts: list[int] | None = []
    start = 0
    for segment in segments:
        span = slice(start, start + segment.frames * per_frame)
        start += segment.frames * per_frame
        options = {"similarity": similarity, "temperature": temperature, "budget": budget, "unmerge": unmerge,
                   "frequency": None if frequency is None else frequency[:, span], "penalty": penalty}
        part = _segment_plan(features[:, span], segment, height, width, ratio, tile_size, options)
        parts.append(part)
        counts = _frame_counts(counts, part, segment, per_frame, budget)
    return SegmentPlan(parts, counts)


def check_segments(segments: list[Segment]) -> None:
    """Reject an empty segment list or a segment without whole frames >= 1 (pass-through ones too)."""
    if not segments:
        raise ValueError("segments=[] is empty: a video plan needs at least one segment of frames")
    for segment in segments:
        if not (whole(segment.frames, 1) and whole(segment.tile_frames, 1)):
            raise ValueError(
                f"{segment}: frames={segment.frames} and tile_frames={segment.tile_frames} must be integers >= 1"
            )


def _segment_plan(features: torch.Tensor, segment: Segment, height: int, width: int, ratio: float,
                  tile_size: int, options: dict) -> MergePlan:
    if not segment.merge:
        return MergePlan(features.shape[0], features.shape[1], features.device)
    return make_plan(
        features, height, width, ratio, tile_size, frames=segment.frames, tile_frames=segment.tile_frames, **options,
    )


def _frame_counts(counts: list[int] | None, part: MergePlan, segment: Segment, per_frame: int, budget: str) -> list[int] | None:
    """Append the segment's merged tokens per frame, or give None once a frame count is unknown."""
    if counts is None:
        return None
    if part.num_kept == part.num_tokens:
        return counts + [per_frame] * segment.frames
    if budget != "tile" or min(segment.tile_frames, segment.frames) != 1:
        return None
    return counts + [part.num_kept // segment.frames] * segment.frames

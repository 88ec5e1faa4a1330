"""Token similarity measures used to pick destinations and to assign tokens to them.

All measures return fp32 similarities; larger means more alike. The paper uses cosine similarity
of the block's normalised input tokens (ToMA §3.2); the others exist so that the choice can be
measured rather than assumed (bench/fidelity.py).
"""

from __future__ import annotations

import torch

SIMILARITIES = ("cosine", "centered_cosine", "neg_sq_dist")


def check_similarity(name: str) -> None:
    """Raise a ValueError naming `name` and the allowed measures if it is not one of them."""
    if name not in SIMILARITIES:
        raise ValueError(f"similarity={name!r} is not supported; use one of {', '.join(SIMILARITIES)}")


def prepare_features(features: torch.Tensor, similarity: str) -> torch.Tensor:
    """Map features (B, N, C) to fp32 vectors whose pairwise scores define `similarity`.

    cosine: unit vectors (zero tokens all point one way, see `unit_vectors`). centered_cosine: unit vectors after removing the per-sample mean token,
    so a shared offset (e.g. an AdaLN shift) does not make every token look alike. neg_sq_dist:
    vectors scaled by the per-sample RMS token norm, so distances are O(1) whatever the width.
    """
    check_similarity(similarity)
    x = features.float()
    if similarity == "centered_cosine":
        x = x - x.mean(dim=1, keepdim=True)
    if similarity == "neg_sq_dist":
        rms = x.pow(2).sum(-1).mean(dim=1, keepdim=True).sqrt().clamp_min(1e-12)
        return x / rms.unsqueeze(-1)
    return unit_vectors(x)


def unit_vectors(x: torch.Tensor) -> torch.Tensor:
    """(B, N, C) -> (B, N, C+1) unit vectors whose dot products are the cosine similarities.

    A zero token (a flat patch after LayerNorm) has no direction: plain normalisation would make
    it unlike everything, itself included, so flat regions could never merge. One extra channel
    of 1e-4 x the sample's mean token norm gives every zero token the same direction (similarity
    1 with each other, ~0 with the rest) and moves other cosines by ~1e-8.
    """
    scale = x.norm(dim=-1).mean(dim=1).clamp_min(1e-12) * 1e-4
    extra = scale.view(-1, 1, 1).expand(*x.shape[:-1], 1)
    vectors = torch.cat([x, extra], dim=-1)
    # torch.nn.functional.normalize's arithmetic (norm clamped to 1e-12), in place: one copy less
    return vectors.div_(vectors.norm(dim=-1, keepdim=True).clamp_min(1e-12))


def pairwise(prepared: torch.Tensor, similarity: str) -> torch.Tensor:
    """Similarity matrix (..., n, n) of prepared vectors (..., n, C) within each tile."""
    gram = prepared @ prepared.transpose(-1, -2)
    if similarity != "neg_sq_dist":
        return gram
    sq = prepared.pow(2).sum(-1)
    return 2 * gram - sq.unsqueeze(-1) - sq.unsqueeze(-2)

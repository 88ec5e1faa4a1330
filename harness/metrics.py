"""How close an output stays to the exact one: relative error of tensors, PSNR and SSIM of images,
per-frame PSNR / SSIM and flicker of clips. One definition each, for the benches and the tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact||_F / ||exact||_F, computed in float32 (so fp16 / bf16 outputs do not overflow).

    nan when `exact` is not finite; for an all-zero `exact`, 0 when `approx` is zero too, else inf."""
    approx, exact = approx.detach().float(), exact.detach().float()
    norm, diff = float(exact.norm()), float((approx - exact).norm())
    if not math.isfinite(norm):
        return math.nan
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / norm


def psnr(reference: Any, image: Any) -> float:
    """PSNR in dB of two images with values in [0, 1] (numpy arrays or CPU tensors of one shape),
    computed in float64; inf when identical."""
    mse = float(np.mean((np.asarray(reference, dtype=np.float64) - np.asarray(image, dtype=np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def ssim(reference: np.ndarray, image: np.ndarray) -> float:
    """SSIM of two (H, W, 3) images with values in [0, 1] (scikit-image's structural_similarity)."""
    from skimage.metrics import structural_similarity

    return float(structural_similarity(reference, image, channel_axis=2, data_range=1.0))


def clip_metrics(ref: np.ndarray, clip: np.ndarray) -> dict[str, Any]:
    """Per-frame PSNR / SSIM of clip against ref, both (F, H, W, 3), and its flicker: the relative
    error of the frame-to-frame change, ||diff(clip) - diff(ref)|| / ||diff(ref)|| over the whole
    clip ("flicker") and per pair of frames ("flicker_pairs"); 0 when the clip moves as ref does."""
    psnrs = [psnr(r, x) for r, x in zip(ref, clip)]
    ssims = [ssim(r, x) for r, x in zip(ref, clip)]
    d_ref, d = np.diff(ref, axis=0), np.diff(clip, axis=0)
    pairs = [float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)) for a, b in zip(d, d_ref)]
    whole = float(np.linalg.norm(d - d_ref) / max(np.linalg.norm(d_ref), 1e-12))
    return {"psnr": psnrs, "ssim": ssims, "flicker": whole, "flicker_pairs": pairs}

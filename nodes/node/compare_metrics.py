"""How close a decoded image stays to the unpatched one, for the ToMA Compare node: PSNR and SSIM.

Torch only (no ComfyUI, no new dependency). Images are ComfyUI's IMAGE layout (N, H, W, C) with
values in [0, 1], N = batch items x video frames; both metrics pool every frame, so a video is
judged as the mean over its frames. Computed on the CPU in float64, a frame at a time: the pictures are
small next to the sampling, and float64 keeps a near-identical pair's MSE (and so its PSNR) exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from einops import rearrange

SSIM_WINDOW = 7
"""Side of the uniform SSIM window: scikit-image's `structural_similarity` default, which the project's
fixture quality figures use (harness/metrics.py); Wang et al. 2004 used an 11 x 11 Gaussian."""
SSIM_K1, SSIM_K2 = 0.01, 0.03
"""The stabilising constants of Wang et al. 2004, for a data range of 1."""


def _pairs(reference: torch.Tensor, image: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Both images, one (H, W, C) frame at a time as float64 CPU tensors (a long video in float64 at
    once would take gigabytes); ValueError unless the shapes match."""
    if reference.shape != image.shape or reference.dim() != 4:
        raise ValueError(f"images of shape {tuple(image.shape)} and {tuple(reference.shape)}: both must be the same (N, H, W, C)")
    for ref, img in zip(reference, image):
        yield ref.detach().to("cpu", torch.float64), img.detach().to("cpu", torch.float64)


def psnr(reference: torch.Tensor, image: torch.Tensor) -> float:
    """PSNR in dB, 10 log10(1 / MSE), the MSE over every pixel of all N images (a video's frames
    pooled); inf when the images are identical."""
    mse = sum(float(torch.mean((ref - img) ** 2)) for ref, img in _pairs(reference, image)) / len(reference)
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def ssim(reference: torch.Tensor, image: torch.Tensor) -> float:
    """Mean SSIM over the N images and C channels, as scikit-image's `structural_similarity`
    computes it by default (data range 1): means, sample variances and covariance over every
    SSIM_WINDOW x SSIM_WINDOW window that lies inside the image; 1 when identical.

    ValueError for images smaller than the window."""
    if min(reference.shape[1:3]) < SSIM_WINDOW:
        raise ValueError(f"images of {reference.shape[1]} x {reference.shape[2]} px: SSIM needs at least {SSIM_WINDOW} x {SSIM_WINDOW}")
    return sum(_frame_ssim(ref, img) for ref, img in _pairs(reference, image)) / len(reference)


def _frame_ssim(reference: torch.Tensor, image: torch.Tensor) -> float:
    """The mean SSIM of one (H, W, C) frame over its windows and channels."""
    x, y = (rearrange(t, "h w c -> c 1 h w") for t in (reference, image))
    mean = _window_mean
    mu_x, mu_y = mean(x), mean(y)
    sample = SSIM_WINDOW**2 / (SSIM_WINDOW**2 - 1)  # unbiased (co)variances, as scikit-image
    var_x = sample * (mean(x * x) - mu_x**2)
    var_y = sample * (mean(y * y) - mu_y**2)
    cov = sample * (mean(x * y) - mu_x * mu_y)
    c1, c2 = SSIM_K1**2, SSIM_K2**2
    index = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return float(index.mean())


def _window_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean over each SSIM_WINDOW x SSIM_WINDOW window inside the image, (C, 1, H, W) -> (C, 1, H - 6, W - 6)."""
    return F.avg_pool2d(t, SSIM_WINDOW, stride=1)

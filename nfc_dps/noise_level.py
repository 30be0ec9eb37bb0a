"""The Gaussian noise level of a measurement, estimated from the measurement alone (``sigma_y="auto"``).

The estimator is the patch-PCA method of Chen, Zhu and Heng ("An efficient statistical method for
image noise level estimation", ICCV 2015): the covariance of the measurement's overlapping patches
(all channels of a patch together) is split into the eigenvalues an image explains and a tail that
only white noise explains, the tail being the longest run of the smallest eigenvalues whose mean is
not above their median; sigma^2 is the tail's mean. It needs a measurement that is an image (any
operator but phase retrieval's Fourier amplitudes) and works on what the operator leaves observed:
for inpainting, only patches whose pixels are all observed, shrinking the patch (7x7 down to 1x2)
until there are enough of them.

Accuracy depends on how much fine texture the measurement keeps: a blurred measurement leaves almost
only noise in its finest patches and is estimated closely at any level; a sharp one (denoising,
super-resolution's small image, a gray image for colorization) is overestimated at low noise levels,
where its finest texture is as strong as the noise (docs/noise_level.md has the measured errors).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["FLOOR", "estimate_sigma", "measurement_sigma"]

#: the smallest estimate returned: the rounding noise of an 8-bit image is 1 / (255 sqrt 12) = 0.0011
FLOOR = 1e-3
#: patch shapes tried in order; the first with enough fully observed patches is used
PATCHES = ((7, 7), (5, 5), (3, 3), (2, 2), (1, 2))
#: fully observed patches needed per patch dimension (channels x height x width)
PATCHES_PER_DIM = 20


def _tail_sigma(eigenvalues: np.ndarray) -> float:
    """Chen et al.'s noise std from a patch covariance's eigenvalues."""
    lam = np.clip(np.sort(eigenvalues)[::-1], 0.0, None)
    for i in range(len(lam)):
        tail = lam[i:]
        if tail.mean() <= np.median(tail):
            return float(np.sqrt(tail.mean()))
    return float(np.sqrt(lam[-1]))


def _patches(image: Tensor, observed: Tensor | None) -> Tensor | None:
    """(n, C*ph*pw) float64 fully observed patches of ``image`` (C, H, W) for the largest patch
    shape that has enough of them; None when none has."""
    c = image.shape[0]
    for ph, pw in PATCHES:
        if ph > image.shape[1] or pw > image.shape[2]:
            continue
        p = torch.nn.functional.unfold(image[None].double(), (ph, pw))[0].T
        if observed is not None:
            m = torch.nn.functional.unfold(observed[None, None].double(), (ph, pw))[0].T
            p = p[m.min(dim=1).values > 0]
        if len(p) >= PATCHES_PER_DIM * c * ph * pw:
            return p
    return None


def estimate_sigma(image: Tensor, observed: Tensor | None = None) -> float:
    """The white Gaussian noise std of ``image`` (C, H, W), in its own units, at least :data:`FLOOR`.

    observed: optional (H, W) bool mask of the pixels that carry a measurement (others are ignored).
    Raises ValueError when too few fully observed patches remain (fewer than twenty per dimension of
    a 1x2 patch).
    """
    if image.ndim != 3:
        raise ValueError(f"estimate_sigma takes one image (C, H, W), got shape {tuple(image.shape)}")
    if observed is not None and tuple(observed.shape) != tuple(image.shape[1:]):
        raise ValueError(f"observed mask of shape {tuple(observed.shape)} for an image of shape {tuple(image.shape)}")
    patches = _patches(image.detach().cpu(), None if observed is None else observed.detach().cpu().bool())
    if patches is None:
        size = f"{image.shape[1]}x{image.shape[2]}"
        if observed is None:
            raise ValueError(f"the measurement ({size}) is too small to estimate its noise level: give the noise level")
        raise ValueError(f"too few observed pixels to estimate the noise level ({int(observed.sum())} of {size}, "
                         f"too few of them side by side): give the noise level")
    patches = patches - patches.mean(dim=0)
    cov = (patches.T @ patches / len(patches)).numpy()
    return max(_tail_sigma(np.linalg.eigvalsh(cov)), FLOOR)


def measurement_sigma(y: Tensor, operator) -> list[float]:
    """Per image of ``y`` (B, C, h, w), a measurement of ``operator`` in [0, 1] units, its noise std.

    Inpainting measurements are read at their observed pixels only. ValueError for a measurement
    that is not an image (phase retrieval's Fourier amplitudes), naming the operator.
    """
    if not getattr(operator, "image_measurement", True):
        raise ValueError(f"sigma_y='auto': a {type(operator).__name__} measurement is not an image, so its noise "
                         f"level cannot be read from it; give the noise level")
    if y.ndim != 4:
        raise ValueError(f"sigma_y='auto' takes a batch (B, C, h, w), got shape {tuple(y.shape)}")
    mask = getattr(operator, "mask", None) if getattr(operator, "family", None) == "inpaint" else None
    out = []
    for b in range(y.shape[0]):
        observed = None
        if isinstance(mask, Tensor):
            m = mask[b if mask.shape[0] > 1 else 0]
            observed = (m.amax(dim=0) if m.ndim == 3 else m) > 0
        out.append(estimate_sigma(y[b], observed))
    return out

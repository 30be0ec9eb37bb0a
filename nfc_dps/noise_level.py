"""The Gaussian noise level of a measurement, estimated from the measurement alone (``sigma_y="auto"``).

Two classical estimators, combined:

* patch PCA (Chen, Zhu and Heng, "An efficient statistical method for image noise level
  estimation", ICCV 2015): the covariance of the measurement's overlapping patches (all channels of
  a patch together; each channel on its own where the channels are one gray image that carries
  one noise draw) splits into eigenvalues the image explains and a tail only white noise
  explains, the longest run of the smallest eigenvalues whose mean is not above their median;
  sigma^2 is the tail's mean;
* weak-texture patches (Liu, Tanaka and Okutomi, "Single-image noise level estimation for blind
  denoising", IEEE TIP 2013): the PCA runs on the patches whose gradient energy white noise of the
  current estimate explains (below its 99.99 % quantile, a gamma law), re-selected until the
  estimate settles, so a photograph's fine texture does not pass for noise.

A blurred measurement has no fine texture: every patch is used. Inpainting measurements are read
at fully observed patches only. The patch shrinks (7x7, 5x5, 3x3; for inpainting also 2x2 and 1x2)
until enough patches remain. Accuracy depends on how much fine texture the measurement keeps: a
sharp small image (super-resolution's) is overestimated at low noise levels, where its texture is as
strong as the noise (docs/noise_level.md has the measured errors).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch import Tensor

__all__ = ["FLOOR", "estimate_sigma", "measurement_sigma", "texture_corrected"]

#: the smallest estimate returned: the rounding noise of an 8-bit image is 1 / (255 sqrt 12) = 0.0011
FLOOR = 1e-3
#: patch shapes tried in order (the last two only where a mask leaves few whole patches)
PATCHES = ((7, 7), (5, 5), (3, 3))
MASKED_PATCHES = PATCHES + ((2, 2), (1, 2))
#: patches needed per patch dimension (channels x height x width): all patches / weak-texture ones
PATCHES_PER_DIM, WEAK_PER_DIM = 20, 5
#: quantile of pure noise's gradient energy below which a patch counts as weak texture
WEAK_QUANTILE = 0.9999
MAX_ROUNDS = 8
#: at most this many patches (a seeded random subset) per estimate: memory and time stay bounded
MAX_PATCHES = 200_000
#: a sharp measurement's read (weak-texture patches) of a noise-free photograph: its own fine texture
#: reads as noise of about this std, so a sharp read is corrected for it in quadrature, and a read
#: below ``TEXTURE_ONLY`` is the texture alone (noise 0); chosen on validation photos
TEXTURE_READ = 0.0026
TEXTURE_ONLY = 0.0043


def _tail_sigma(eigenvalues: np.ndarray) -> float:
    """Chen et al.'s noise std from a patch covariance's eigenvalues."""
    lam = np.clip(np.sort(eigenvalues)[::-1], 0.0, None)
    for i in range(len(lam)):
        tail = lam[i:]
        if tail.mean() <= np.median(tail):
            return float(np.sqrt(tail.mean()))
    return float(np.sqrt(lam[-1]))


def _pca_sigma(patches: np.ndarray) -> float:
    centred = patches - patches.mean(axis=0)
    return _tail_sigma(np.linalg.eigvalsh(centred.T @ centred / len(centred)))


def _gradient_form(channels: int, ph: int, pw: int) -> np.ndarray:
    """M such that p^T M p is a patch's sum of squared horizontal and vertical pixel differences
    (patch vectors in unfold's order: channel, row, column)."""
    idx = np.arange(channels * ph * pw).reshape(channels, ph, pw)
    pairs = [(a, b) for a, b in zip(idx[:, :, 1:].ravel(), idx[:, :, :-1].ravel())]
    pairs += [(a, b) for a, b in zip(idx[:, 1:, :].ravel(), idx[:, :-1, :].ravel())]
    diff = np.zeros((len(pairs), idx.size))
    for row, (a, b) in enumerate(pairs):
        diff[row, a], diff[row, b] = 1.0, -1.0
    return diff.T @ diff


def _weak_texture_sigma(patches: np.ndarray, form: np.ndarray, sigma: float) -> float | None:
    """Liu et al.'s re-selection from ``sigma``; None when too few weak-texture patches remain."""
    energy = np.einsum("ij,jk,ik->i", patches, form, patches)
    tr, tr2 = np.trace(form), np.trace(form @ form)
    shape = tr**2 / (2 * tr2)  # the gamma law of sigma^2 * sum(lambda_i chi2_1), by its first two moments
    for _ in range(MAX_ROUNDS):
        weak = energy < stats.gamma.ppf(WEAK_QUANTILE, shape, scale=sigma**2 * tr / shape)
        if weak.sum() < WEAK_PER_DIM * patches.shape[1]:
            return None
        new = max(_pca_sigma(patches[weak]), FLOOR)
        if abs(new - sigma) <= 1e-4 * sigma:
            return new
        sigma = new
    return sigma


def estimate_sigma(image: Tensor, observed: Tensor | None = None, weak_texture: bool = True) -> float:
    """The white Gaussian noise std of ``image`` (C, H, W), in its own units, at least :data:`FLOOR`.

    Channels that are one gray image up to a scale and an offset on most pixels (a toned black-and-
    white photo, a gray scan with a coloured stamp: :func:`_one_gray`) may carry one noise draw,
    which cancels in the patches' channel differences; where these read no more than 8-bit rounding
    (:data:`ONE_DRAW`), each channel is read on its own and their levels combined as their root
    mean square.
    observed: optional (H, W) bool mask of the pixels that carry a measurement (others are ignored).
    weak_texture: select weak-texture patches (False: every patch, for a blurred measurement).
    Raises ValueError when too few (fully observed) patches remain.
    """
    if image.ndim != 3:
        raise ValueError(f"estimate_sigma takes one image (C, H, W), got shape {tuple(image.shape)}")
    if observed is not None and tuple(observed.shape) != tuple(image.shape[1:]):
        raise ValueError(f"observed mask of shape {tuple(observed.shape)} for an image of shape {tuple(image.shape)}")
    if not bool(torch.isfinite(image).all()):
        raise ValueError("measurement contains NaN or Inf")
    img = image.detach().cpu().double()[None]
    if img.shape[1] > 1 and bool((img - img[:, :1]).abs().max() <= 1e-6):
        img = img[:, :1]  # a gray image stored as equal channels: its copies are not independent noise
    mask = None if observed is None else observed.detach().cpu().double()[None, None]
    level = _patch_sigma(img, mask, weak_texture)
    if level is not None and level <= ONE_DRAW and img.shape[1] > 1 and _one_gray(img[0], observed):
        levels = [_patch_sigma(img[:, c:c + 1], mask, weak_texture) for c in range(img.shape[1])]
        if None not in levels:  # each channel on its own, combined
            return max(float(np.sqrt(np.mean(np.square(levels)))), FLOOR)
    if level is not None:
        return level
    size = f"{image.shape[1]}x{image.shape[2]}"
    if observed is None:
        raise ValueError(f"the measurement ({size}) is too small to estimate its noise level: give the noise level")
    raise ValueError(f"too few observed pixels to estimate the noise level ({int(observed.sum())} of {size}, "
                     f"too few of them side by side): give the noise level")


#: the most the median pixel of a channel may differ from an affine function of another and still
#: be one gray image with it: 8-bit rounding of both (median ~0.3 / 255) passes, independent noise
#: of std sigma (median >= 0.67 sigma) from sigma ~0.003 on, a colour photo's colours
SAME_GRAY = 0.5 / 255
#: a joint estimate at most this over channels that are one gray image is their shared noise draw
#: cancelling (what is left is rounding: 8-bit rounding reads up to 0.00114): they are then read
#: one by one
ONE_DRAW = 1.5 * FLOOR
#: at most this many pixels (a seeded random subset) in :func:`_one_gray`'s fits
MAX_PIXELS = 200_000


def _one_gray(img: Tensor, observed: Tensor | None) -> bool:
    """Whether every channel of ``img`` (C, H, W) is an affine function of the channel of largest
    spread at most of the (observed) pixels: a least-squares fit, refit on its better half, whose
    median absolute residual is at most :data:`SAME_GRAY`."""
    pixels = img.flatten(1) if observed is None else img[:, observed.to(img.device).bool()]
    if pixels.shape[1] > MAX_PIXELS:
        keep = torch.randperm(pixels.shape[1], generator=torch.Generator().manual_seed(0))[:MAX_PIXELS]
        pixels = pixels[:, keep]
    if pixels.shape[1] < 16:
        return False
    ref = pixels[int(pixels.std(dim=1).argmax())]
    for channel in pixels:
        design = torch.stack([ref, torch.ones_like(ref)], 1)
        use = torch.ones_like(ref, dtype=torch.bool)
        for _ in range(2):  # the fit, then the fit on the half of the pixels it explains best
            coef = torch.linalg.lstsq(design[use], channel[use, None]).solution
            residual = (design @ coef)[:, 0].sub(channel).abs()
            use = residual <= residual.median()
        if float(residual.median()) > SAME_GRAY:
            return False
    return True


def _patch_sigma(img: Tensor, mask: Tensor | None, weak_texture: bool) -> float | None:
    """:func:`estimate_sigma` of ``img`` (1, C, H, W), all channels of a patch together, at the pixels
    ``mask`` (1, 1, H, W) observes; None when too few patches remain."""
    first = None
    for shape in PATCHES if mask is None else MASKED_PATCHES:
        if shape[0] > img.shape[2] or shape[1] > img.shape[3]:
            continue
        patches = torch.nn.functional.unfold(img, shape)[0].T
        if mask is not None:
            patches = patches[torch.nn.functional.unfold(mask, shape)[0].T.min(dim=1).values > 0]
        if len(patches) > MAX_PATCHES:
            keep = torch.randperm(len(patches), generator=torch.Generator().manual_seed(0))[:MAX_PATCHES]
            patches = patches[keep.sort().values]
        patches = patches.numpy()
        if len(patches) < PATCHES_PER_DIM * patches.shape[1]:
            continue
        sigma = _pca_sigma(patches)
        if not weak_texture:
            return max(sigma, FLOOR)
        first = sigma if first is None else first
        weak = _weak_texture_sigma(patches, _gradient_form(img.shape[1], *shape), max(sigma, FLOOR))
        if weak is not None:
            return max(weak, FLOOR)
    if first is not None:  # no patch size left enough weak-texture patches: every patch of the largest
        return max(first, FLOOR)
    return None


def measurement_sigma(y: Tensor, operator) -> list[float]:
    """Per image of ``y`` (B, C, h, w), a measurement of ``operator`` in [0, 1] units, its noise std.

    A measurement of an operator with a ``pixel_mask()`` (inpainting) is read at its observed pixels
    only, a blurred one (the blur family, an operator with ``blurred_measurement`` true) at every
    patch; a sharp one's read is corrected for its texture's (:func:`texture_corrected`: 0 where it
    is the texture alone).
    ValueError for a measurement that is not an image (phase retrieval's Fourier amplitudes).
    """
    if not operator.image_measurement:
        raise ValueError(f"sigma_y='auto': a {type(operator).__name__} measurement is not an image, so its noise "
                         f"level cannot be read from it; give the noise level")
    if y.ndim != 4:
        raise ValueError(f"sigma_y='auto' takes a batch (B, C, h, w), got shape {tuple(y.shape)}")
    blurred = operator.family == "blur" or operator.blurred_measurement
    mask = operator.pixel_mask()
    observed = None if mask is None else mask > 0
    out = []
    for b in range(y.shape[0]):
        level = estimate_sigma(y[b], observed, weak_texture=not blurred)
        out.append(level if blurred else texture_corrected(level))
    return out


def texture_corrected(level: float) -> float:
    """A sharp measurement's read without its texture's share: 0 below :data:`TEXTURE_ONLY`, else
    sqrt(level^2 - TEXTURE_READ^2)."""
    return 0.0 if level < TEXTURE_ONLY else float(np.sqrt(level**2 - TEXTURE_READ**2))

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

Shot noise (``noise="poisson-gaussian:auto"``, ``"poisson:auto"``; :func:`estimate_shot_noise`): a local
mean-variance fit (Foi, Trimeche, Katkovnik and Egiazarian, "Practical Poissonian-Gaussian noise
modeling and fitting for single-image raw-data", IEEE TIP 2008): each channel's patches binned by
their mean intensity, each bin's variance read as above, var = mean / peak + sigma^2 fitted over the
bins by non-negative least squares. :func:`estimated_models` gives the model of either estimate.

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

from .noise import EstimatedNoise, GaussianNoise, NoiseModel, PoissonGaussianNoise, PoissonNoise

__all__ = ["FLOOR", "estimate_sigma", "measurement_sigma", "texture_corrected", "estimate_shot_noise",
           "measurement_shot_noise", "estimated_models"]

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
    found = _weak_texture(patches, form, sigma)
    return None if found is None else found[0]


def _weak_texture(patches: np.ndarray, form: np.ndarray, sigma: float) -> tuple[float, np.ndarray] | None:
    """Liu et al.'s re-selection from ``sigma``: (the noise std, the (N,) bool mask of the weak-texture
    patches it was read at); None when too few weak-texture patches remain."""
    energy = np.einsum("ij,jk,ik->i", patches, form, patches)
    tr, tr2 = np.trace(form), np.trace(form @ form)
    shape = tr**2 / (2 * tr2)  # the gamma law of sigma^2 * sum(lambda_i chi2_1), by its first two moments
    for _ in range(MAX_ROUNDS):
        weak = energy < stats.gamma.ppf(WEAK_QUANTILE, shape, scale=sigma**2 * tr / shape)
        if weak.sum() < WEAK_PER_DIM * patches.shape[1]:
            return None
        new = max(_pca_sigma(patches[weak]), FLOOR)
        if abs(new - sigma) <= 1e-4 * sigma:
            return new, weak
        sigma = new
    return sigma, weak


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
        patches = _patches(img, mask, shape)
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
    observed, blurred = _readable(y, operator, "sigma_y='auto'", "noise level")
    out = []
    for b in range(y.shape[0]):
        level = estimate_sigma(y[b], observed, weak_texture=not blurred)
        out.append(level if blurred else texture_corrected(level))
    return out


def _readable(y: Tensor, operator, what: str, noun: str) -> tuple[Tensor | None, bool]:
    """(the (H, W) bool mask of the pixels ``operator``'s measurement ``y`` (B, C, h, w) observes, or
    None for all; whether it is blurred: read at every patch). ValueError naming ``what`` for a
    measurement that is not an image (phase retrieval's Fourier amplitudes) or not a batch."""
    if not operator.image_measurement:
        raise ValueError(f"{what}: a {type(operator).__name__} measurement is not an image, so its {noun} "
                         f"cannot be read from it; give the {noun}")
    if y.ndim != 4:
        raise ValueError(f"{what} takes a batch (B, C, h, w), got shape {tuple(y.shape)}")
    mask = operator.pixel_mask()
    return None if mask is None else mask > 0, operator.family == "blur" or operator.blurred_measurement


def texture_corrected(level: float) -> float:
    """A sharp measurement's read without its texture's share: 0 below :data:`TEXTURE_ONLY`, else
    sqrt(level^2 - TEXTURE_READ^2)."""
    return 0.0 if level < TEXTURE_ONLY else float(np.sqrt(level**2 - TEXTURE_READ**2))


# --------------------------------------------------------------------------------------------
# shot noise: Poisson-Gaussian parameters from a local mean-variance fit

#: intensity bins per channel (quantiles of the patches' means) of the mean-variance fit
SHOT_BINS = 8
#: the fewest bins per channel a patch shape must give (else the next smaller shape is tried)
SHOT_MIN_BINS = 2
#: the largest peak returned: a variance slope below 1 / ``PEAK_CAP`` per unit of intensity is no
#: shot noise a sensor shows (a sensor pixel holds up to about 1e6 photons)
PEAK_CAP = 1e6
#: the least span of the bins' mean intensities ([0, 1] units) that tells shot noise (slope) from
#: read noise (offset)
MIN_INTENSITY_SPAN = 0.1
#: a sharp measurement's read variance offset of a noise-free photograph (its own fine texture), as a
#: std: taken off the fitted offset in quadrature
SHOT_TEXTURE_READ = TEXTURE_READ
#: a measurement is clipped at 0 (at 1) where at least this share of its pixels lie exactly there and
#: none beyond; its bins whose mean lies within ``CLIP_MARGIN`` of their noise std of a clipped
#: bound are left out of the fit (clipping there takes off part of their noise)
CLIPPED_SHARE, CLIP_MARGIN = 1e-3, 2.0


def estimate_shot_noise(image: Tensor, observed: Tensor | None = None, weak_texture: bool = True,
                        read_noise: bool = True, name: str = "the measurement") -> tuple[float, float]:
    """(peak, sigma) of Poisson-Gaussian noise in ``image`` (C, H, W), [0, 1] units: y = Poisson(peak
    x) / peak + sigma n, so Var[y | x] = x / peak + sigma^2 (peak: photons at a clean value of 1).

    A local mean-variance fit (Foi et al. 2008): each channel's patches are split into quantile bins
    of their mean (at most :data:`SHOT_BINS`), a bin's noise variance is read as
    :func:`estimate_sigma` reads a level (patch PCA at the bin's weak-texture patches with
    ``weak_texture``, a bin with too few left out; at every patch without), and var = a mean + b is
    fitted over every channel's bins by non-negative least squares weighted by the bins' patch
    counts: peak = 1 / a (at most :data:`PEAK_CAP`: no shot noise), sigma = sqrt(b) (0 with
    ``read_noise`` False: pure Poisson, b = 0). A sharp measurement's (``weak_texture``) offset is
    corrected for its texture's share (:data:`SHOT_TEXTURE_READ`, in quadrature); bins next to a
    bound the measurement is clipped at are left out (:data:`CLIP_MARGIN`).
    observed: optional (H, W) bool mask of the pixels that carry a measurement.
    ValueError naming ``name`` when the measurement is too small, or too flat (its bins' means span
    less than :data:`MIN_INTENSITY_SPAN`, or lie at 0), to fit.
    """
    if image.ndim != 3:
        raise ValueError(f"estimate_shot_noise takes one image (C, H, W), got shape {tuple(image.shape)}")
    if observed is not None and tuple(observed.shape) != tuple(image.shape[1:]):
        raise ValueError(f"observed mask of shape {tuple(observed.shape)} for an image of shape {tuple(image.shape)}")
    if not bool(torch.isfinite(image).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    img = image.detach().cpu().double()[None]
    if img.shape[1] > 1 and bool((img - img[:, :1]).abs().max() <= 1e-6):
        img = img[:, :1]  # a gray image stored as equal channels: one noise draw
    mask = None if observed is None else observed.detach().cpu().double()[None, None]
    clipped = _clipped_bounds(img, observed)
    bins = _fitted_bins(img, mask, weak_texture, clipped)
    give = "give the noise (e.g. poisson-gaussian:30,0.01)"
    if bins is None:
        pixels = "" if observed is None else f", {int(observed.sum())} observed pixels"
        raise ValueError(f"{name} ({image.shape[1]}x{image.shape[2]}{pixels}) is too small to fit its shot noise"
                         f"{_clipping_note(clipped)}: {give}")
    means = bins[0]
    if float(means.max()) <= 0 or (read_noise and float(means.max() - means.min()) < MIN_INTENSITY_SPAN):
        raise ValueError(f"{name} is too flat to fit its shot noise: its patches' mean intensities span "
                         f"{means.min():.3g} to {means.max():.3g} (a span of at least {MIN_INTENSITY_SPAN:g} "
                         f"tells shot noise from read noise){_clipping_note(clipped)}: {give}")
    slope, offset = _mean_variance_fit(*bins, read_noise)
    if weak_texture and read_noise:
        offset = max(offset - SHOT_TEXTURE_READ**2, 0.0)
    peak = PEAK_CAP if slope <= 1 / PEAK_CAP else 1 / slope
    return float(peak), float(np.sqrt(offset))


def _patches(img: Tensor, mask: Tensor | None, shape: tuple[int, int]) -> np.ndarray:
    """The (N, C * ph * pw) overlapping patches of ``img`` (1, C, H, W) of ``shape`` whose pixels
    ``mask`` (1, 1, H, W) observes, in unfold's order (at most :data:`MAX_PATCHES`, a seeded subset)."""
    patches = torch.nn.functional.unfold(img, shape)[0].T
    if mask is not None:
        patches = patches[torch.nn.functional.unfold(mask, shape)[0].T.min(dim=1).values > 0]
    if len(patches) > MAX_PATCHES:
        keep = torch.randperm(len(patches), generator=torch.Generator().manual_seed(0))[:MAX_PATCHES]
        patches = patches[keep.sort().values]
    return patches.numpy()


def _clipped_bounds(img: Tensor, observed: Tensor | None) -> tuple[float, ...]:
    """The bounds (0, 1 or both) at which ``img`` (1, C, H, W) is clipped at its observed pixels
    (:data:`CLIPPED_SHARE`)."""
    pixels = img.flatten(2) if observed is None else img[..., observed.to(img.device).bool()]
    share = {bound: float((pixels == bound).double().mean()) for bound in (0.0, 1.0)}
    inside = {0.0: float(pixels.min()) >= 0, 1.0: float(pixels.max()) <= 1}
    return tuple(b for b in (0.0, 1.0) if inside[b] and share[b] >= CLIPPED_SHARE)


def _fitted_bins(img: Tensor, mask: Tensor | None, weak_texture: bool,
                 clipped: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(means, variances, counts) of the intensity bins of every channel of ``img`` (1, C, H, W) the
    fit is made on, at the largest patch shape that gives each channel :data:`SHOT_MIN_BINS` bins
    (with ``weak_texture``: bins read at their weak-texture patches, at the largest shape that leaves
    :data:`SHOT_MIN_BINS` such bins; where none does, every patch of the largest shape), less the
    bins next to a ``clipped`` bound; None when no shape gives enough."""
    first = None
    for shape in PATCHES if mask is None else MASKED_PATCHES:
        if shape[0] > img.shape[2] or shape[1] > img.shape[3]:
            continue
        read = [_channel_bins(_patches(img[:, c:c + 1], mask, shape), shape, weak_texture)
                for c in range(img.shape[1])]
        if any(bins is None for bins in read):
            continue
        weak, every = ([b for bins in read for b in bins[i] if not _near(b, clipped)] for i in (0, 1))
        if len(every) < SHOT_MIN_BINS:
            continue
        if not weak_texture:
            return _columns(every)
        first = every if first is None else first
        if len(weak) >= SHOT_MIN_BINS:
            return _columns(weak)
    return None if first is None else _columns(first)


def _clipping_note(clipped: tuple[float, ...]) -> str:
    """What a refusal adds about the ``clipped`` bounds (nothing where there are none)."""
    if not clipped:
        return ""
    return (f" (it is clipped at {' and '.join(f'{b:g}' for b in clipped)}: patches within {CLIP_MARGIN:g} noise "
            f"stds of it are left out)")


def _near(found: tuple[float, float, int], bounds: tuple[float, ...]) -> bool:
    """Whether a bin (mean, variance, count) lies within :data:`CLIP_MARGIN` noise stds of a bound."""
    return any(abs(found[0] - bound) < CLIP_MARGIN * np.sqrt(found[1]) for bound in bounds)


def _columns(bins: list[tuple[float, float, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.array(v) for v in zip(*bins))


def _channel_bins(patches: np.ndarray, shape: tuple[int, int], weak_texture: bool) -> tuple[list, list] | None:
    """The quantile bins of one channel's ``patches`` (N, D) of ``shape`` (at most :data:`SHOT_BINS`,
    :data:`PATCHES_PER_DIM` patches per dimension each), each as (mean intensity, noise variance,
    patches read): (those read at their weak-texture patches (Liu et al.'s selection in the bin;
    a bin with too few is left out), those read at every patch). None for fewer than
    :data:`SHOT_MIN_BINS` bins. Patches are sorted by the mean of one checkerboard half of their
    pixels and a bin's intensity is the mean of the other half, whose noise the sorting did not
    select (a bin of the darkest noisy means lies darker than the intensity its noise comes from)."""
    count = min(SHOT_BINS, len(patches) // (PATCHES_PER_DIM * patches.shape[1]))
    if count < SHOT_MIN_BINS or patches.shape[1] < 2:
        return None
    form = _gradient_form(1, *shape)
    rows, cols = np.indices(shape)
    sorting = ((rows + cols) % 2 == 0).ravel()
    weak_bins, every = [], []
    order = np.argsort(patches[:, sorting].mean(axis=1), kind="stable")
    for part in np.array_split(order, count):
        sigma = max(_pca_sigma(patches[part]), FLOOR)
        every.append((float(patches[part][:, ~sorting].mean()), sigma**2, len(part)))
        found = _weak_texture(patches[part], form, sigma) if weak_texture else None
        if found is not None:
            weak_bins.append((float(patches[part][found[1]][:, ~sorting].mean()), found[0] ** 2, int(found[1].sum())))
    return weak_bins, every


def _mean_variance_fit(means: np.ndarray, variances: np.ndarray, counts: np.ndarray,
                       with_offset: bool) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum_i counts_i (variances_i - a means_i - b)^2 (b = 0 when not
    ``with_offset``): the two-parameter non-negative least squares, its boundary cases in closed form."""
    w = counts / counts.sum()

    def slope_only() -> float:
        return max(float((w * means * variances).sum() / max((w * means**2).sum(), 1e-300)), 0.0)

    if not with_offset:
        return slope_only(), 0.0
    mean_m, mean_v = float((w * means).sum()), float((w * variances).sum())
    spread = float((w * (means - mean_m) ** 2).sum())
    slope = float((w * (means - mean_m) * (variances - mean_v)).sum()) / spread if spread > 0 else 0.0
    offset = mean_v - slope * mean_m
    if slope <= 0:
        return 0.0, max(mean_v, 0.0)
    if offset < 0:
        return slope_only(), 0.0
    return slope, offset


def measurement_shot_noise(y: Tensor, operator, read_noise: bool = True) -> list[tuple[float, float]]:
    """Per image of ``y`` (B, C, h, w), a measurement of ``operator`` in [0, 1] units, its (peak,
    sigma) by :func:`estimate_shot_noise` (sigma 0 where ``read_noise`` is False), read at the
    pixels and patches :func:`measurement_sigma` reads (observed pixels only; every patch of a
    blurred measurement). ValueError, naming the image, for a measurement that is not an image or
    cannot be fitted."""
    what = "poisson-gaussian:auto" if read_noise else "poisson:auto"
    observed, blurred = _readable(y, operator, what, "noise")
    return [estimate_shot_noise(y[b], observed, weak_texture=not blurred, read_noise=read_noise,
                                name=f"{what}: " + ("the measurement" if len(y) == 1 else f"image {b} of {len(y)}"))
            for b in range(y.shape[0])]


def estimated_models(y: Tensor, operator, estimated: EstimatedNoise) -> list[NoiseModel]:
    """Per image of ``y`` (B, C, h, w), a measurement of ``operator`` in [0, 1] units, the noise model
    of ``estimated``'s kind with the parameters read from it: Gaussian (:func:`measurement_sigma`),
    Poisson or Poisson-Gaussian (:func:`measurement_shot_noise`)."""
    if estimated.kind == "gaussian":
        return [GaussianNoise(sigma) for sigma in measurement_sigma(y, operator)]
    read_noise = estimated.kind == "poisson-gaussian"
    pairs = measurement_shot_noise(y, operator, read_noise=read_noise)
    return [PoissonGaussianNoise(peak, sigma) if read_noise else PoissonNoise(peak) for peak, sigma in pairs]

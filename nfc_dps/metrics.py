"""Image quality metrics on batched tensors: PSNR and SSIM, one value per image.

Inputs are (B, C, H, W) float tensors, compared **as given**: the metrics do not clip. Callers
clamp to [0, 1] first (the protocol: PSNR/SSIM on [0, 1] clipped images, data_range 1).

SSIM convention: scikit-image's ``structural_similarity`` defaults, i.e. a 7x7 uniform window,
K1 = 0.01, K2 = 0.03, sample covariance (N / (N - 1), N = 49), computed per channel on the
"valid" region (the 3-pixel border that skimage crops is excluded), averaged over pixels then
channels. It equals ``skimage.metrics.structural_similarity(x, y, data_range=data_range,
channel_axis=-1)`` (gray: no channel_axis). Not the Gaussian-weighted SSIM of Wang et al. or
torchmetrics' default, which give different numbers. Computed in float64.

Calibration of a K-sample uncertainty map (:func:`coverage`): the fraction of pixels whose
error |mean - truth| lies within c times the per-pixel sample std (the ``std`` map of
``restore(..., num_samples=K)``: unbiased, K - 1 degrees of freedom). For an exact posterior
sampler and Gaussian pixel posteriors this fraction is P(|T_{K-1}| <= c / sqrt(1 + 1/K))
(:func:`expected_coverage`), which tends to 68.3 % / 95.4 % for c = 1 / 2 as K grows.

Distance between two sets of draws (:func:`sliced_wasserstein`): the sliced 2-Wasserstein
distance over random directions, the metric of the Gaussian-mixture benchmark of Cardoso et al.
(2023, "Monte Carlo guided diffusion for Bayesian linear inverse problems").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["psnr", "ssim", "mse", "restoration_metrics", "coverage", "expected_coverage", "sliced_wasserstein"]

_WIN = 7
_K1, _K2 = 0.01, 0.03


def _check_pair(x: Tensor, y: Tensor, data_range: float) -> None:
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must have shape (B, C, H, W), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if not (isinstance(data_range, (int, float)) and data_range > 0):
        raise ValueError(f"data_range must be a positive number, got {data_range!r}")


def mse(x: Tensor, y: Tensor) -> Tensor:
    """Mean squared error per image, (B,) float64."""
    _check_pair(x, y, 1.0)
    return (x.double() - y.double()).pow(2).flatten(1).mean(1)


def psnr(x: Tensor, y: Tensor, data_range: float = 1.0) -> Tensor:
    """PSNR in dB per image, (B,): 10 log10(data_range^2 / MSE) over all channels and pixels,
    as ``skimage.metrics.peak_signal_noise_ratio``. Identical images give +inf. No clipping."""
    _check_pair(x, y, data_range)
    err = mse(x, y)
    return 10 * torch.log10(float(data_range) ** 2 / err)


def rotation_twin_aligned(x: Tensor, truth: Tensor) -> Tensor:
    """x (B, C, H, W) or its 180-degree rotation, per image whichever is nearer ``truth`` in MSE:
    the estimate a phase retrieval is scored by (both measure the same)."""
    turned = x.flip(-1, -2)
    nearer = (mse(turned, truth) < mse(x, truth)).view(-1, *([1] * (x.ndim - 1)))
    return torch.where(nearer, turned, x)


def ssim(x: Tensor, y: Tensor, data_range: float = 1.0) -> Tensor:
    """Mean SSIM per image, (B,), with scikit-image's default conventions (see module doc).

    H and W must be at least 7. No clipping.
    """
    _check_pair(x, y, data_range)
    if min(x.shape[-2:]) < _WIN:
        raise ValueError(f"SSIM needs images of at least {_WIN}x{_WIN}, got {tuple(x.shape[-2:])}")
    b, c, h, w = x.shape
    X = x.double().reshape(b * c, 1, h, w)
    Y = y.double().reshape(b * c, 1, h, w)
    # uniform 7x7 means over the valid region = skimage's filtered maps cropped by 3 pixels
    stats = F.avg_pool2d(torch.cat([X, Y, X * X, Y * Y, X * Y], 1), _WIN, stride=1)
    ux, uy, uxx, uyy, uxy = stats.unbind(1)
    n = _WIN * _WIN
    cov_norm = n / (n - 1)
    vx = cov_norm * (uxx - ux * ux)
    vy = cov_norm * (uyy - uy * uy)
    vxy = cov_norm * (uxy - ux * uy)
    c1 = (_K1 * data_range) ** 2
    c2 = (_K2 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.reshape(b, c, -1).mean(-1).mean(-1)


def coverage(samples: Tensor, truth: Tensor, widths: tuple[float, ...] = (1.0, 2.0)) -> Tensor:
    """(B, len(widths)) float64: per image, the fraction of pixels (and channels) with
    |mean - truth| <= c * std for each width c, mean and unbiased std over the K samples.

    samples: (K, B, C, H, W) with K >= 2; truth: (B, C, H, W); any units (the same for both).
    """
    if not isinstance(samples, Tensor) or not isinstance(truth, Tensor):
        raise TypeError("samples and truth must be torch.Tensors")
    if samples.ndim != 5 or samples.shape[0] < 2:
        raise ValueError(f"samples must be (K, B, C, H, W) with K >= 2, got shape {tuple(samples.shape)}")
    if tuple(truth.shape) != tuple(samples.shape[1:]):
        raise ValueError(f"truth must have shape {tuple(samples.shape[1:])}, got {tuple(truth.shape)}")
    s = samples.double()
    err = (s.mean(0) - truth.double()).abs()
    std = s.std(0)
    return torch.stack([(err <= float(c) * std).double().flatten(1).mean(1) for c in widths], dim=1)


def expected_coverage(k: int, width: float) -> float:
    """What :func:`coverage` gives in expectation for K exact draws from a Gaussian pixel
    posterior: P(|T_{K-1}| <= width / sqrt(1 + 1/K)), T Student-t (mean of K draws and the truth
    differ by N(0, v (1 + 1/K)); the unbiased variance has K - 1 degrees of freedom)."""
    from scipy import stats

    if k < 2 or not width > 0:
        raise ValueError(f"need k >= 2 and width > 0, got k={k}, width={width}")
    return float(2 * stats.t.cdf(width / (1 + 1 / k) ** 0.5, k - 1) - 1)


def sliced_wasserstein(a: Tensor, b: Tensor, directions: Tensor) -> float:
    """Sliced 2-Wasserstein distance sqrt(mean_theta W2^2(theta.a, theta.b)) between the empirical
    measures of draws a (n, ...) and b (m, ...), m a multiple of n (each sorted projection of a
    is matched to m / n consecutive ones of b: the exact 1-D W2 between equal-weight atoms).

    directions: (L, D) unit vectors, D the number of elements of one draw. Same units as a, b.
    """
    a2, b2 = a.reshape(a.shape[0], -1).double(), b.reshape(b.shape[0], -1).double()
    n, m = a2.shape[0], b2.shape[0]
    if n < 1 or m % n:
        raise ValueError(f"the second set's size must be a multiple of the first's, got {n} and {m}")
    if a2.shape[1] != b2.shape[1] or directions.ndim != 2 or directions.shape[1] != a2.shape[1]:
        raise ValueError(f"draws of {a2.shape[1]} and {b2.shape[1]} elements and directions of shape "
                         f"{tuple(directions.shape)} do not match")
    d = directions.to(a2)
    pa = (a2 @ d.T).sort(0).values.repeat_interleave(m // n, 0)
    pb = (b2 @ d.T).sort(0).values
    return float((pa - pb).pow(2).mean().sqrt())


def restoration_metrics(x: Tensor, ref: Tensor) -> dict[str, float | None]:
    """The protocol's numbers for one restoration: PSNR (dB, data_range 1), SSIM and MSE of the
    first image of ``x`` clipped to [0, 1] against ``ref`` as given; both (B, C, H, W), computed
    in float64 on the CPU. SSIM is None when a side is under the 7-pixel window."""
    x = x.detach().cpu().double().clamp(0, 1)
    ref = ref.detach().cpu().double()
    out: dict[str, float | None] = {"psnr": float(psnr(x, ref)[0]), "mse": float(mse(x, ref)[0])}
    out["ssim"] = float(ssim(x, ref)[0]) if min(x.shape[-2:]) >= _WIN else None
    return out

"""NFC's data step: the Gaussian conditional p(x0 | x0_hat, y) and what it needs.

The inner step of NFC / DAPS draws from (or takes the mean of)
p(x) ∝ exp(-||W (y - A x)||^2 / (2 sigma_y^2)) N(x; x0_hat, C), with C isotropic (sigma_k^2 I)
or spectral (Fourier-diagonal, from a power spectrum S: :func:`spectral_prior_variance`).
Closed form where the operator's decomposition diagonalises C and the band too (Fourier:
:func:`~nfc_dps.frequency.fourier_gaussian_mean`) or the case is isotropic and unweighted (the
operator's prox, itself from its decomposition where it has one); conjugate gradients otherwise,
preconditioned by :func:`normal_preconditioner` from the operator's :class:`PixelCoverage`.
All in the prior's [-1, 1] model units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..frequency import fit_power_law, fourier_filter, fourier_gaussian_mean, power_law_spectrum, radial_frequency
from ..generators import Generators, randn_per_image
from ..operators.base import LinearOperator, conjugate_gradient, pixel_gain
from ..operators.blur import BlurOperator
from ..operators.decomposition import Decomposition


def spectral_prior_variance(spectrum: Tensor, sigma: float) -> Tensor:
    """Cov(x0 | x_sigma) per frequency for a Gaussian prior with power spectrum S: S sigma^2 / (S + sigma^2).

    ``spectrum`` (B|1, 1, H, W) on the full FFT grid (ortho convention); +inf entries give sigma^2.
    """
    s2 = sigma**2
    return torch.where(torch.isinf(spectrum), torch.full_like(spectrum, s2), spectrum * s2 / (spectrum + s2))


def spectral_crossing(spectrum: Tensor, level: float) -> Tensor:
    """Per image, the largest normalised radius r with S(r) >= level (0 if none): where the
    image spectrum meets the diffusion noise. (B,) tensor."""
    h, w = spectrum.shape[-2:]
    r = radial_frequency(h, w, device=spectrum.device, dtype=spectrum.dtype)
    above = spectrum >= level
    return torch.where(above, r.expand_as(spectrum), torch.zeros_like(spectrum)).flatten(1).amax(1)


def fit_spectrum_from_measurement(operator: LinearOperator, y_m: Tensor, image_shape: Sequence[int]) -> Tensor:
    """Power-law spectrum (B, 1, H, W) fitted to the pseudo-inverse of the measurement, on low
    radii where signal dominates noise and aliasing (a power law fitted to the measurement, as in the spectral covariance)."""
    amplitude, alpha = fit_power_law(operator.A_pinv(y_m), r_min=0.02, r_max=0.2)
    return power_law_spectrum(amplitude, alpha, image_shape)


@dataclass(frozen=True)
class NormalEigenvalues:
    """The eigenvalues of A^T A that matched re-noising averages over (one per component), and the
    operator's decomposition where it has one: the basis the eigenvalues are ordered in."""

    values: Tensor
    decomposition: Decomposition | None


def normal_eigenvalues(operator: LinearOperator, image_shape: Sequence[int], dtype: torch.dtype = torch.float32,
                       device: torch.device | str | None = None) -> NormalEigenvalues:
    """The operator's ``approximate_gram_eigenvalues`` on ``image_shape``'s (h, w) (exact where it
    declares them; a reflect-boundary blur's are those of the circular blur with its kernel), in
    ``dtype``. ValueError for an operator that has none."""
    gram = operator.approximate_gram_eigenvalues(*image_shape[-2:])
    if gram is None:
        raise ValueError(f"renoise='matched' needs the eigenvalues of A^T A, which {type(operator).__name__} "
                         f"({operator.name}, family {operator.family}) does not declare; use renoise='fresh'")
    return NormalEigenvalues(gram.to(device=device, dtype=dtype), operator.decomposition())


def conditional_error_variance(gram: NormalEigenvalues, sigma_y: float, prior_var: float | Tensor,
                               temperature: float) -> Tensor:
    """(B|1,) expected squared error per pixel of the inner step's output, under its own Gaussian model.

    The model: x ~ N(center, C) and y = A x + sigma_y n; the conditional covariance is
    P = (A^T A / sigma_y^2 + C^-1)^-1. The mean is off by P (trace per pixel), a draw at temperature
    t by (1 + t^2) P. ``gram``: :func:`normal_eigenvalues`.
    ``prior_var``: r^2, or the spectral C (B|1, 1, H, W) on the FFT grid; C is diagonal beside the
    eigenvalues where the decomposition's basis diagonalises it (``stationary_diagonal``: Fourier);
    else its mean stands for it (the isotropic prior of the same total variance). Not counted: the
    band weight and the Haar fuse that may follow the step.
    """
    values = gram.values
    if isinstance(prior_var, Tensor):
        diagonal = None if gram.decomposition is None else gram.decomposition.stationary_diagonal(prior_var)
        if diagonal is not None and diagonal[0].numel() != values.numel():
            raise ValueError(f"{values.numel()} eigenvalues for a prior variance of shape {tuple(prior_var.shape)}")
        c = diagonal.flatten(1) if diagonal is not None else prior_var.flatten(1).mean(1, keepdim=True)
    else:
        c = torch.tensor([[prior_var]], dtype=values.dtype, device=values.device)
    per_component = 1.0 / (values[None] / sigma_y**2 + 1.0 / c)
    return (1 + temperature**2) * per_component.mean(1)


def gaussian_conditional(
    operator: LinearOperator,
    y: Tensor,
    center: Tensor,
    sigma_y: float,
    prior_var: float | Tensor,
    generators: Generators,
    band: Tensor | None = None,
    sample: bool = True,
    cg_iters: int = 20,
    temperature: float = 1.0,
    coverage: PixelCoverage | None = None,
) -> Tensor:
    """Sample (or the mean of) p(x) ∝ exp(-||W (y - A x)||^2 / (2 sigma_y^2)) N(x; center, C).

    Args:
        y: (B, C, h, w) measurement, model units.
        center: (B, C, H, W) prior mean (the predictor's x0_hat).
        prior_var: isotropic variance r^2 (float) or per-frequency variance (B|1, 1, H, W) on
            the full FFT grid of the image (spectral covariance).
        band: optional real full-grid weight W (B|1, 1, h, w) on the measurement grid.
        coverage: the operator's :func:`pixel_coverage` for the CG preconditioner; it depends
            on the operator only, so samplers compute it once per run (computed here if None).
    Perturb-and-solve: x~ = center + C^1/2 e, u~ = W y + sigma_y e', then
    x = argmin ||u~ - W A x||^2 / (2 sigma_y^2) + ||x - x~||_C^-1^2 / 2 is an exact sample.
    Closed form where the operator's decomposition diagonalises C and W (circulant operators: Fourier)
    and for the isotropic, unweighted case (the operator's prox); conjugate gradients otherwise. ``temperature`` t
    scales both perturbations,
    so the draw has the same mean and t^2 times the covariance (t = 1: exact; t = 0: the mean).
    """
    spectral = isinstance(prior_var, Tensor)
    x_t, y_t = center, y
    sample = sample and temperature > 0
    if sample:
        e = temperature * randn_per_image(center.shape, generators, center.dtype, center.device)
        x_t = center + (fourier_filter(e, prior_var.sqrt()) if spectral else prior_var**0.5 * e)
    if band is not None:
        y_t = fourier_filter(y, band)
    if sample:
        y_t = y_t + temperature * sigma_y * randn_per_image(y.shape, generators, y.dtype, y.device)

    if not spectral and band is None:
        return operator.prox(y_t, x_t, sigma_y, prior_var**0.5)

    closed = _stationary_gaussian_mean(operator.decomposition(), y_t, x_t, sigma_y, prior_var, band)
    if closed is not None:
        return closed

    band2 = None if band is None else band**2
    inv_c = 1.0 / prior_var

    def apply_inv_c(v: Tensor) -> Tensor:
        return fourier_filter(v, inv_c) if spectral else v * inv_c

    def normal(v: Tensor) -> Tensor:  # A^T W^T W A / sigma_y^2 + C^-1, W^T W in one FFT pair
        av = operator.A(v)
        return operator.A_adjoint(av if band2 is None else fourier_filter(av, band2)) / sigma_y**2 + apply_inv_c(v)

    rhs = operator.A_adjoint(y_t if band is None else fourier_filter(y_t, band)) / sigma_y**2 + apply_inv_c(x_t)
    precondition = None
    if spectral:
        precondition = normal_preconditioner(coverage or pixel_coverage(operator, center), prior_var, sigma_y)
    return conjugate_gradient(normal, rhs, x_t.clone(), max_iter=cg_iters, tol=1e-5, precondition=precondition)


def _stationary_gaussian_mean(decomposition: Decomposition | None, y: Tensor, x: Tensor, sigma_y: float,
                              prior_var: float | Tensor, band: Tensor | None) -> Tensor | None:
    """The inner step's solve in closed form where the decomposition's basis diagonalises the prior
    covariance and the band weight too (``stationary_diagonal``: Fourier), else None."""
    if decomposition is None:
        return None
    h, w = x.shape[-2:]
    inv_c = 1.0 / prior_var if isinstance(prior_var, Tensor) else torch.full((h, w), 1.0 / prior_var, dtype=x.dtype,
                                                                              device=x.device)
    inv_c = decomposition.stationary_diagonal(inv_c)
    weight = None if band is None else decomposition.stationary_diagonal(band)
    if inv_c is None or (band is not None and weight is None):
        return None
    d = decomposition.diagonal(h, w, x.dtype, x.device)
    X = fourier_gaussian_mean(d, decomposition.U_adjoint(y) * (1.0 if weight is None else weight), sigma_y**2,
                              prior_mean=decomposition.V_adjoint(x), prior_precision=inv_c,
                              weight2=None if weight is None else weight**2)
    return decomposition.V(X)


def _dilate(mask: Tensor, size: int) -> Tensor:
    """Binary dilation of a (..., H, W) 0/1 mask by a size x size square (zero outside the image),
    as a row pass then a column pass of shifted maxima."""
    half = size // 2
    for dim, pad in ((-1, (half, half, 0, 0)), (-2, (0, 0, half, half))):
        padded = torch.nn.functional.pad(mask, pad)
        n = mask.shape[dim]
        out = padded.narrow(dim, 0, n)
        for shift in range(1, size):
            out = torch.maximum(out, padded.narrow(dim, shift, n))
        mask = out
    return mask


#: side (pixels) of the square that a hole must contain to count as wide (see normal_preconditioner):
#: 17 keeps random masks up to 95 % missing free of wide parts (at 9, a 90 % mask already had some,
#: and the split then converged more slowly than the Fourier-diagonal form)
WIDE_HOLE_SIZE = 17


@dataclass(frozen=True)
class PixelCoverage:
    """How an operator covers the image, from g = A^T A 1 (:func:`pixel_gain`).

    observed_fraction: (B, 1, 1, 1) mean of g (the observed fraction for inpainting, 1/s^2 for SR x s).
    wide_holes: (B, C, H, W) 0/1 indicator of the wide parts of the unobserved holes (pixels with
        g = 0 in a fully unobserved ``WIDE_HOLE_SIZE``-px square: a morphological opening;
        outside the image counts as unobserved), or None when there are none.
    """

    observed_fraction: Tensor
    wide_holes: Tensor | None


def pixel_coverage(operator: LinearOperator, like: Tensor) -> PixelCoverage:
    """The operator's :class:`PixelCoverage` on images shaped like ``like`` (B, C, H, W)."""
    gain = pixel_gain(operator, like)
    fraction = gain.flatten(1).mean(1).view(-1, 1, 1, 1)
    hole = (gain <= 0).to(like.dtype)
    if min(hole.shape[-2:]) < WIDE_HOLE_SIZE or not bool(hole.any()):
        return PixelCoverage(fraction, None)
    wide = _dilate(1 - _dilate(1 - hole, WIDE_HOLE_SIZE), WIDE_HOLE_SIZE)  # opening = dilation of the erosion
    return PixelCoverage(fraction, wide if bool(wide.any()) else None)


def normal_preconditioner(coverage: PixelCoverage, prior_var: Tensor, sigma_y: float) -> Callable[[Tensor], Tensor]:
    """An SPD approximation of (C^-1 + A^T A / sigma_y^2)^-1 for the inner step's conjugate gradients.

    * Everywhere: the Fourier-diagonal P = (C^-1 + rho / sigma_y^2)^-1, rho the observed
      fraction, one FFT pair.
    * On the wide parts of the holes nothing pins the image and the normal operator is C^-1
      alone, so there M = C, split from the rest by the holes' indicator h:
      M v = (1 - h) P (1 - h) v + h C h v. On box inpainting this reaches a smaller error
      (relative to the next level's noise) in fewer iterations than the Fourier-diagonal form.
      Scattered holes (random masks up to 95 % missing) have no wide part and keep the
      Fourier-diagonal form, which is the better one there.
    prior_var: (B|1, 1, H, W) per-frequency prior variance C on the full FFT grid.
    """
    approx_inv = 1.0 / (1.0 / prior_var + coverage.observed_fraction / sigma_y**2)
    wide = coverage.wide_holes
    if wide is None:
        return lambda v: fourier_filter(v, approx_inv)
    rest = 1 - wide
    return lambda v: rest * fourier_filter(rest * v, approx_inv) + wide * fourier_filter(wide * v, prior_var)


def is_nonwrapping_blur(operator: LinearOperator) -> bool:
    """A blur whose boundary does not wrap (reflect or valid), on the image grid itself: it declares
    a kernel, is not circulant and is not a padded canvas (``image_region``), which keeps the
    periodic treatment of its inner operator."""
    return operator.blur_kernel() is not None and not operator.is_circulant and operator.image_region() is None


def _spectrum_on_grid(spectrum: Tensor, gh: int, gw: int) -> Tensor:
    """A spectrum given on an (h, w) FFT grid read on a (gh, gw) one (the power spectrum of a
    stationary process, orthonormal FFT, does not depend on the grid size): at each frequency of
    the new grid, the log-linear interpolation of the two nearest frequencies of the old one along
    each axis (a power law stays a power law between them)."""
    log = spectrum.log()
    for dim, g in ((-2, gh), (-1, gw)):
        n = log.shape[dim]
        pos = torch.fft.fftfreq(g, dtype=torch.float64) * n  # position on the old grid, signed
        low = torch.floor(pos)
        t = (pos - low).to(log.dtype).to(log.device)
        shape = [1] * log.ndim
        shape[dim] = g
        i0, i1 = (low.long() % n).to(log.device), ((low.long() + 1) % n).to(log.device)
        log = log.index_select(dim, i0) * (1 - t).view(shape) + log.index_select(dim, i1) * t.view(shape)
    return log.exp()


def _largest_prime_factor(m: int) -> int:
    p, largest = 2, 1
    while m > 1:
        while m % p == 0:
            m, largest = m // p, p
        p += 1
    return largest


def _half_sample(n: int) -> bool:
    """Whether an axis of length n extends by half-sample symmetry (``c b a | a b c``, period 2n)
    rather than whole-sample symmetry (``c b | a b c``, period 2(n - 1)): the one whose period is
    the faster FFT length (the smaller largest prime factor), half-sample on a tie or when n < 3."""
    return n < 3 or _largest_prime_factor(2 * n) <= _largest_prime_factor(2 * (n - 1))


def _extend(v: Tensor, dim: int, half: bool) -> Tensor:
    """v followed by its reflection along ``dim`` (one period of the symmetric extension)."""
    back = v.flip(dim)
    return torch.cat([v, back if half else back.narrow(dim, 1, v.shape[dim] - 2)], dim)


def _fold(u: Tensor, dim: int, n: int, half: bool) -> Tensor:
    """The adjoint of :func:`_extend`: each pixel's copies summed back onto it."""
    front, back = u.narrow(dim, 0, n), u.narrow(dim, n, u.shape[dim] - n).flip(dim)
    if half:
        return front + back
    front = front.clone()
    front.narrow(dim, 1, n - 2).add_(back)
    return front


def symmetric_prior_precision(spectrum: Tensor, h: int, w: int) -> Callable[[Tensor], Tensor]:
    """v -> Q v, the precision of a stationary Gaussian prior with power spectrum S seen on the
    image's symmetric extension rather than on its own periodic grid: the image reflected about
    each border (periodic, no jump anywhere), Q = E^T F^-1 diag(1 / S) F E / 4 with E the extension.
    Each axis reflects with or without repeating its edge sample, whichever period is the faster
    FFT length (:func:`_half_sample`). The periodic grid's prior joins each border to the opposite
    one and so penalises the jump between them; a photograph's opposite borders are unrelated, and a
    non-circulant blur measures them as such. ``spectrum`` (B|1, 1, h, w), finite and > 0."""
    hh, hw = _half_sample(h), _half_sample(w)
    gh, gw = (2 * h if hh else 2 * (h - 1)), (2 * w if hw else 2 * (w - 1))
    inv = 1.0 / _spectrum_on_grid(spectrum, gh, gw)[..., : gw // 2 + 1]

    def apply(v: Tensor) -> Tensor:
        ext = _extend(_extend(v, -2, hh), -1, hw)
        out = torch.fft.irfft2(torch.fft.rfft2(ext, norm="ortho") * inv, s=(gh, gw), norm="ortho")
        return _fold(_fold(out, -2, h, hh), -1, w, hw) / 4.0

    return apply


def blur_wiener_estimate(operator: LinearOperator, y: Tensor, level: Tensor, sigma_y: float, spectrum: Tensor,
                         max_iter: int, tol: float = 1e-5) -> Tensor:
    """E[x | y] for a blur that does not wrap (:func:`is_nonwrapping_blur`) under
    x ~ N(level, Q^-1) with Q :func:`symmetric_prior_precision`: conjugate gradients on
    (A^T A / sigma_y^2 + Q) x = A^T y / sigma_y^2 + Q level, preconditioned by the circulant
    Wiener filter (|H|^2 / sigma_y^2 + 1 / S)^-1 of the circular blur with the same kernel.
    ``level`` (B, C, H, W), ``spectrum`` (B|1, 1, H, W) finite and > 0."""
    h, w = level.shape[-2:]
    q = symmetric_prior_precision(spectrum, h, w)
    gram = BlurOperator(operator.blur_kernel(), "circular").transfer_function(h, w, level.dtype, level.device).abs().square()
    gain = 1.0 / (gram / sigma_y**2 + 1.0 / spectrum)
    rhs = operator.A_adjoint(y) / sigma_y**2 + q(level)
    return conjugate_gradient(lambda v: operator.normal(v) / sigma_y**2 + q(v), rhs, level.clone(), max_iter=max_iter,
                              tol=tol, precondition=lambda v: fourier_filter(v, gain))

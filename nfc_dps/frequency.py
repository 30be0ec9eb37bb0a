"""The spectral toolkit: radial grids, ring averages, power laws, soft low-pass masks,
band-limiting, the Fourier-diagonal Gaussian solve, and orthonormal Haar wavelets.

Conventions.
* Frequencies live on the unshifted FFT grid of an (H, W) image (``torch.fft.fftfreq``).
  One radius: |omega| in cycles per pixel (:func:`frequency_radius`, each component in
  [-0.5, 0.5)); the *normalised* radius r = |omega| / max |omega| over that grid
  (:func:`radial_frequency`, the corner radius is :func:`corner_radius`) is the same radius in
  units of the corner frequency: r = 1.0 at the corner (Nyquist in both axes for even sizes),
  r = 0 at DC. Non-square images use their own grid in each axis, so a normalised cutoff is a
  fraction of the band whatever the image size. Cutoffs, fit ranges and the fitted power laws
  S(r) = amplitude * r^-alpha use the normalised radius; the Gaussian oracles' smooth law
  (:func:`smooth_power_law`) is stated in cycles per pixel, a size-independent density.
* Ring averages (:func:`ring_mean`) bin a per-frequency quantity by radius: equal-width rings
  in r (``bins`` of them, :func:`radial_power_spectrum`) or rings 1 / max(H, W) cycles/pixel
  wide (:func:`fit_power_law` with ``exact=True``).
* Masks are real, radial and symmetric, so band-limiting a real image gives a real image. The
  FFT is orthonormal (``norm="ortho"``): Parseval holds and a mask of ones is the identity.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor


def frequency_radius(h: int, w: int, rfft: bool = False, dtype: torch.dtype = torch.float64,
                     device: torch.device | str | None = None) -> Tensor:
    """(h, w), or (h, w//2+1) if ``rfft``: |omega| in cycles per pixel on the ``fftfreq`` grid (0 at [0, 0])."""
    fy = torch.fft.fftfreq(h, dtype=dtype, device=device)
    fx = torch.fft.rfftfreq(w, dtype=dtype, device=device) if rfft else torch.fft.fftfreq(w, dtype=dtype, device=device)
    return (fy[:, None] ** 2 + fx[None, :] ** 2).sqrt()


def corner_radius(h: int, w: int) -> float:
    """max |omega| over the (h, w) ``fftfreq`` grid, cycles per pixel (sqrt(0.5) for even sizes; 0 for 1 x 1)."""
    fy = torch.fft.fftfreq(h, dtype=torch.float64)
    fx = torch.fft.fftfreq(w, dtype=torch.float64)
    return math.sqrt(float(fy.abs().max()) ** 2 + float(fx.abs().max()) ** 2)


@functools.lru_cache(maxsize=64)
def _radial_frequency_cpu(h: int, w: int, rfft: bool) -> Tensor:
    r = frequency_radius(h, w, rfft)
    r_max = corner_radius(h, w)  # the full grid's corner, also for the rfft half-grid
    return (r / r_max if r_max > 0 else r).clamp(max=1.0)


def radial_frequency(h: int, w: int, rfft: bool = False, device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float32) -> Tensor:
    """(H, W) or (H, W//2+1) if ``rfft``: normalised radial frequency in [0, 1] (1 = corner)."""
    return _radial_frequency_cpu(int(h), int(w), bool(rfft)).to(device=device, dtype=dtype)


def lowpass_mask(h: int, w: int, cutoff: float, transition: float = 0.1, rfft: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Raised-cosine radial low-pass: 1 for r <= cutoff, cos^2 roll-off to 0 at r = cutoff + transition.

    ``cutoff`` in [0, 1] (fraction of the corner frequency); cutoff >= 1 is all-pass *exactly*
    (every grid radius is <= 1), and the mask is monotone non-decreasing in the cutoff.
    A hard disk (``transition=0``) is allowed but rings (Gibbs).
    """
    if not math.isfinite(cutoff) or cutoff < 0:
        raise ValueError(f"cutoff must be a finite number >= 0, got {cutoff}")
    if transition < 0:
        raise ValueError(f"transition must be >= 0, got {transition}")
    r = radial_frequency(h, w, rfft, device, torch.float64)
    if cutoff >= 1.0:
        return torch.ones_like(r, dtype=dtype)
    if transition == 0:
        return (r <= cutoff).to(dtype)
    t = ((r - cutoff) / transition).clamp(0, 1)
    return (torch.cos(0.5 * math.pi * t) ** 2).to(dtype)


def fourier_filter(x: Tensor, transfer: Tensor) -> Tensor:
    """Filter the last two dims of a real x by a real, symmetric transfer function T(ω) = T(-ω)
    (a radial mask, a power spectrum, a posterior variance): F^-1(T · F x), orthonormal FFT.

    ``transfer`` is (H, W//2+1) on the rfft grid or (H, W) on the full grid (then only its rfft
    half is read, which is exact for a symmetric T); leading dims broadcast, e.g. (B, 1, H, W).
    Computed with rfft2/irfft2: half the work of a complex FFT pair.
    """
    h, w = x.shape[-2:]
    half = w // 2 + 1
    if transfer.shape[-2:] == (h, w):
        transfer = transfer[..., :half]
    elif transfer.shape[-2:] != (h, half):
        raise ValueError(f"transfer function of shape {tuple(transfer.shape)} does not fit images of size {(h, w)}")
    return torch.fft.irfft2(torch.fft.rfft2(x, norm="ortho") * transfer, s=(h, w), norm="ortho")


def fourier_gaussian_mean(H: Tensor, Y: Tensor, noise_var: float | Tensor, *, prior_mean: Tensor | None = None,
                          prior_precision: float | Tensor | None = None, prior_var: Tensor | None = None,
                          weight2: Tensor | None = None) -> Tensor:
    """Fourier coefficients of E[x | y] for y = A x + n, n ~ N(0, noise_var I), x ~ N(x_bar, C),
    with A = F^-1 diag(H) F and C = F^-1 diag(c) F both diagonal in the same Fourier basis:

        X = (conj(H) Y / noise_var + X_bar / c) / (|H|^2 W^2 / noise_var + 1 / c)   (precision form)
          = (c conj(H) Y + noise_var X_bar) / (c |H|^2 + noise_var)                (covariance form)

    Pass exactly one of ``prior_precision`` (1 / c; 0 = a flat prior, where |H| = 0 gives X_bar, or 0
    without a prior mean; needs noise_var > 0) or
    ``prior_var`` (c >= 0; noise_var = 0 allowed; where c |H|^2 + noise_var = 0 nothing is
    measured and the result is X_bar, or 0 without a prior mean). ``weight2``: an optional real
    frequency weight W^2 on the likelihood (precision form only); Y is then the caller's weighted
    coefficients. Y, ``prior_mean`` = X_bar: coefficients on H's grid (full FFT or rfft half, any
    FFT normalisation, as long as all agree); everything broadcasts, e.g. H (h, w), Y (B, C, h, w),
    noise_var and c (B, 1, 1, 1) or (B|1, 1, h, w). The operation order is fixed (the operators'
    prox, the samplers' inner step, the Gaussian oracle and the Wiener baseline share it).
    """
    if (prior_precision is None) == (prior_var is None):
        raise ValueError("pass exactly one of prior_precision and prior_var")
    if prior_precision is not None:
        gain2 = H.abs() ** 2
        if weight2 is not None:
            gain2 = gain2 * weight2
        num = H.conj() * Y / noise_var
        if prior_mean is not None:
            num = num + prior_mean * prior_precision
        den = gain2 / noise_var + prior_precision
        if not bool((den == 0).any()):
            return num / den
        # a flat prior (precision 0) at a frequency that H does not pass (|H| = 0): nothing is
        # known there; the limit of the solution as the precision goes to 0 is the prior mean
        fallback = prior_mean if prior_mean is not None else torch.zeros((), dtype=num.dtype, device=num.device)
        return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), fallback)
    if weight2 is not None:
        raise ValueError("weight2 is supported in the precision form only")
    den = H.abs().square() * prior_var + noise_var
    safe = den.clamp_min(1e-300)
    if prior_mean is None:  # the Wiener gain c conj(H) / den, then applied to Y
        return torch.where(den > 0, H.conj() * prior_var / safe * Y, torch.zeros((), dtype=Y.dtype, device=Y.device))
    return torch.where(den > 0, (prior_var * H.conj() * Y + noise_var * prior_mean) / safe, prior_mean)


def ring_mean(values: Tensor, index: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Mean of ``values`` (..., N) over rings: ``index`` (N,) long, each entry's ring in [0, n).

    The one ring-binning routine of the package. Returns (means (..., n), NaN where a ring is
    empty; counts (n,), entries per ring), in ``values``' dtype.
    """
    counts = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(
        0, index, torch.ones_like(index, dtype=values.dtype))
    sums = values.new_zeros((*values.shape[:-1], n)).index_add_(values.ndim - 1, index, values)
    return sums / counts.where(counts > 0, torch.full_like(counts, float("nan"))), counts


def radial_power_spectrum(x: Tensor, bins: int = 32) -> tuple[Tensor, Tensor]:
    """Radially averaged power |F x|^2 (ortho FFT, mean removed, averaged over channels) per image,
    in ``bins`` equal-width rings of the normalised radius (rfft half-grid).

    x: (B, C, H, W). Returns (radii (bins,), the ring centres; power (B, bins)); empty rings hold NaN.
    """
    h, w = x.shape[-2:]
    power = torch.fft.rfft2(x - x.mean(dim=(-2, -1), keepdim=True), norm="ortho").abs().square().mean(1)
    r = radial_frequency(h, w, rfft=True, device=x.device, dtype=x.dtype)
    idx = (r * bins).long().clamp(max=bins - 1).flatten()
    radii = (torch.arange(bins, dtype=x.dtype, device=x.device) + 0.5) / bins
    return radii, ring_mean(power.flatten(1), idx, bins)[0]


def fit_power_law(x: Tensor, r_min: float = 0.02, r_max: float = 0.5, bins: int = 32, *, exact: bool = False,
                  spectrum: bool = False) -> tuple[Tensor, Tensor]:
    """Fit S(r) = amplitude * r^(-alpha), r the normalised radius, to radially averaged power.

    Log-log least squares over the rings whose radius lies in [r_min, r_max] (above r_max a
    measurement's spectrum is dominated by noise or the operator's null space). Returns
    (amplitude, alpha) as float tensors, amplitude in (model units)^2 per orthonormal Fourier
    coefficient.

    * ``exact=False`` (per image, the samplers' and training's fit): x (B, C, H, W); ``bins``
      equal-width rings (:func:`radial_power_spectrum`, fewer on small images), weighted by
      non-emptiness; an image with fewer than 2 rings in range uses every ring. (B,) tensors,
      alpha clamped to [0.5, 4].
    * ``exact=True`` (one law for all of x, the Gaussian oracle's fit): x images (..., H, W)
      (power averaged over all leading axes, any mean: DC excluded) or, with ``spectrum=True``,
      an (H, W) power spectrum on the ``fftfreq`` grid; rings 1 / max(H, W) cycles/pixel wide
      (``bins`` unused), each at its effective radius (mean of r^-alpha)^(-1/alpha) refined with
      the fitted alpha (a few fixed-point passes), so an exact power law is recovered exactly.
      0-d float64 tensors, alpha unclamped; ValueError if fewer than 2 rings are usable.
    """
    if exact:
        return _fit_power_law_rings(x, r_min, r_max, spectrum)
    if max(x.shape[-2:]) < 2:
        raise ValueError(f"a {x.shape[-2]}x{x.shape[-1]} image has no frequency besides its mean: too small to fit "
                         f"a power spectrum (images need at least 2 pixels along one side)")
    bins = max(4, min(bins, max(x.shape[-2:]) // 2))  # no empty rings on small images
    radii, power = radial_power_spectrum(x, bins)
    keep = (radii >= r_min) & (radii <= r_max)
    usable = torch.isfinite(power) & (power > 0)
    valid = keep[None, :] & usable
    few = valid.sum(1, keepdim=True) < 2  # too few rings in range: that image uses every ring
    valid = torch.where(few, usable, valid)
    wgt = valid.to(x.dtype)
    n = wgt.sum(1).clamp_min(1)
    lr = radii.log()[None, :].expand_as(power)
    lp = torch.where(valid, power, torch.ones_like(power)).log()
    lr_mean = (wgt * lr).sum(1) / n
    lp_mean = (wgt * lp).sum(1) / n
    cov = (wgt * (lr - lr_mean[:, None]) * (lp - lp_mean[:, None])).sum(1)
    var = (wgt * (lr - lr_mean[:, None]) ** 2).sum(1).clamp_min(1e-12)
    alpha = (-cov / var).clamp(0.5, 4.0)
    log_amp = lp_mean + alpha * lr_mean
    return log_amp.exp(), alpha


def _fit_power_law_rings(x: Tensor, r_min: float, r_max: float, spectrum: bool) -> tuple[Tensor, Tensor]:
    """:func:`fit_power_law`'s ``exact=True`` branch (see there)."""
    x = torch.as_tensor(x)
    h, w = x.shape[-2:]
    if spectrum:
        if x.ndim != 2:
            raise ValueError(f"a spectrum must be (h, w), got shape {tuple(x.shape)}")
        p = x.to(torch.float64)
    else:
        xf = torch.fft.fft2(x.to(torch.float64), norm="ortho")
        p = (xf.real**2 + xf.imag**2).reshape(-1, h, w).mean(0)
    r = frequency_radius(h, w, device=p.device).flatten()[1:]  # DC dropped
    ring = torch.round(r * max(h, w)).long()
    n = int(ring.max()) + 1
    power, counts = ring_mean(p.flatten()[1:], ring, n)
    occupied = counts > 0
    power, radius = power[occupied], ring_mean(r, ring, n)[0][occupied]
    corner = corner_radius(h, w)
    sel = (radius >= r_min * corner) & (radius <= r_max * corner) & (power > 0)
    if int(sel.sum()) < 2:
        raise ValueError(f"fit_power_law: fewer than 2 usable frequency rings in normalised radius [{r_min}, {r_max}] "
                         f"(image {tuple(x.shape[-2:])})")
    ly = power[sel].log()
    alpha = float("nan")
    log_amp = torch.zeros((), dtype=torch.float64)
    r_eff = radius
    for _ in range(6):  # the fit in cycles per pixel, log(amplitude) moved to the normalised radius below
        lx = r_eff[sel].log()
        design = torch.stack([torch.ones_like(lx), lx], dim=1)
        coef = torch.linalg.lstsq(design, ly[:, None]).solution.flatten()
        new_alpha, log_amp = float(-coef[1]), coef[0]
        if abs(new_alpha) < 1e-6 or abs(new_alpha - alpha) < 1e-10:
            alpha = new_alpha
            break
        alpha = new_alpha
        r_eff = ring_mean(r ** (-alpha), ring, n)[0][occupied] ** (-1.0 / alpha)
    # S = a_c |omega|^-alpha = a_c corner^-alpha r^-alpha
    return (log_amp - alpha * math.log(corner)).exp(), torch.tensor(alpha, dtype=torch.float64)


def power_law_spectrum(amplitude: Tensor, alpha: Tensor, shape: tuple[int, ...], infinite_dc: bool = True) -> Tensor:
    """S(r) = amplitude * r^-alpha per image on the full FFT grid, (B, 1, H, W), r floored at half
    a grid step. ``infinite_dc``: DC set to +inf (the mean is not shrunk towards anything);
    otherwise DC keeps the floored value (for callers that treat the mean themselves)."""
    h, w = shape[-2:]
    r = radial_frequency(h, w, device=amplitude.device, dtype=amplitude.dtype).clamp_min(0.5 / max(h, w))
    spec = amplitude.view(-1, 1, 1, 1) * r ** (-alpha.view(-1, 1, 1, 1))
    if infinite_dc:
        spec[..., 0, 0] = float("inf")
    return spec


def smooth_power_law(h: int, w: int, amplitude: float, alpha: float, omega0: float,
                     dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> Tensor:
    """(h, w) S = amplitude * (|omega|^2 + omega0^2)^(-alpha/2), |omega| in cycles per pixel on the
    ``fftfreq`` grid: the Gaussian oracles' spectrum (omega0 > 0 keeps DC finite)."""
    r2 = frequency_radius(h, w, dtype=dtype, device=device) ** 2
    return amplitude * (r2 + omega0**2) ** (-alpha / 2)


# --------------------------------------------------------------------------- Haar wavelets

def _haar_step(x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    a, b = x[..., 0::2, 0::2], x[..., 0::2, 1::2]
    c, d = x[..., 1::2, 0::2], x[..., 1::2, 1::2]
    ll = (a + b + c + d) / 2
    lh = (a - b + c - d) / 2  # horizontal detail (differences along W)
    hl = (a + b - c - d) / 2  # vertical detail (differences along H)
    hh = (a - b - c + d) / 2
    return ll, (lh, hl, hh)


def _haar_step_inverse(ll: Tensor, details: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    lh, hl, hh = details
    a = (ll + lh + hl + hh) / 2
    b = (ll - lh + hl - hh) / 2
    c = (ll + lh - hl - hh) / 2
    d = (ll - lh - hl + hh) / 2
    out = ll.new_empty(*ll.shape[:-2], 2 * ll.shape[-2], 2 * ll.shape[-1])
    out[..., 0::2, 0::2], out[..., 0::2, 1::2] = a, b
    out[..., 1::2, 0::2], out[..., 1::2, 1::2] = c, d
    return out


def haar_decompose(x: Tensor, levels: int) -> tuple[Tensor, list[tuple[Tensor, Tensor, Tensor]], list[tuple[int, int]]]:
    """Multi-level orthonormal 2-D Haar transform of the last two dims.

    Returns (ll, details, sizes): ``details[0]`` is the finest level's (LH, HL, HH), ``sizes[i]``
    the (H, W) input size at level i. Odd sizes: before each level the image is extended by one
    replicated row/column; :func:`haar_reconstruct` crops it off again, so the round trip is exact
    (the transform is orthonormal on even sizes, injective on odd ones).
    """
    if levels < 0:
        raise ValueError(f"levels must be >= 0, got {levels}")
    details, sizes = [], []
    ll = x
    for _ in range(levels):
        h, w = ll.shape[-2:]
        sizes.append((h, w))
        if h % 2 or w % 2:
            ll = torch.nn.functional.pad(ll.reshape(-1, 1, h, w), (0, w % 2, 0, h % 2), mode="replicate").reshape(
                *ll.shape[:-2], h + h % 2, w + w % 2)
        ll, det = _haar_step(ll)
        details.append(det)
    return ll, details, sizes


def haar_reconstruct(ll: Tensor, details: list[tuple[Tensor, Tensor, Tensor]], sizes: list[tuple[int, int]]) -> Tensor:
    """Exact inverse of :func:`haar_decompose`."""
    for det, (h, w) in zip(reversed(details), reversed(sizes)):
        ll = _haar_step_inverse(ll, det)[..., :h, :w]
    return ll


def haar_fuse(refined: Tensor, predicted: Tensor, low_weight: float, detail_weight: float, levels: int) -> Tensor:
    """Blend two images in the Haar domain: coarse (LL) band weighted ``low_weight`` towards
    ``refined``, every detail band weighted ``detail_weight``. Weights of 1 return ``refined``.

    Computed as predicted + H^-1(W * H(refined - predicted)) (the transform is linear).
    """
    if low_weight == 1.0 and detail_weight == 1.0:
        return refined
    ll, details, sizes = haar_decompose(refined - predicted, levels)
    details = [tuple(detail_weight * d for d in det) for det in details]
    return predicted + haar_reconstruct(low_weight * ll, details, sizes)

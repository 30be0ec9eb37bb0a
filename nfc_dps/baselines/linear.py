"""The classical restorations of linear operators: what a user would pick instead of a diffusion sampler.

Each takes y (B, C, h, w) in [0, 1] and returns (B, C, H, W); ``sigma_y`` is the measurement
noise std in [0, 1] pixel units (the API's convention). The catalogue
(:mod:`nfc_dps.baselines.catalogue`) says which applies to an operator and clips their results to
[0, 1]; one called on an operator it does not apply to raises :class:`NotApplicable` (a
``ValueError``) with the reason.

* ``"wiener"`` -- linear MMSE (Wiener) deconvolution with a power-law image spectrum
  S(r) = a r^-alpha fitted per image to the measurement (:func:`fit_measurement_spectrum`):
  X = H* S Y / (|H|^2 S + sigma^2) per frequency, the mean passed through (DC gain 1/H(0)).
  Circulant blur and denoising: closed form by FFT. Reflect-boundary blur and super-resolution:
  the same Gaussian model with the true operator, (A^T A / sigma^2 + C^-1) x = A^T y / sigma^2
  (a generalised Wiener filter), by conjugate gradients; for reflect blur preconditioned and
  started with the same kernel's circulant Wiener filter. (Mirror-padding y and filtering
  circularly is exact only for symmetric kernels: a motion kernel's mirror images are flipped.)
  Inpainting: not applicable (a stationary Gaussian fill of a hole is a blur; use "biharmonic").
* ``"tv"`` -- total-variation regularised least squares for any linear operator,
  min_x ||A x - y||^2 / 2 + lam TV(x), by FISTA (accelerated proximal gradient) with
  scikit-image's Chambolle TV denoiser as the proximal step (weight = lam * step; scikit-image
  denoises each colour channel on its own: channel-wise, not vectorial, TV), step 1/L with
  L = ||A^T A|| from power iterations, 100 iterations. The iterates are float64; ``A`` and its
  adjoint are called in the operator's own dtype (:func:`operator_dtype`: a user's function or
  deepinv physics computes in float32) and their results taken back to float64.
  lam = c_family * sigma_y (:data:`TV_LAMBDA_PER_SIGMA`), floored at 1e-4 for noiseless data.
  The constants were calibrated once on TRAINING images only (see :func:`calibrate_tv`; the
  held-out evaluation images were never used).
* ``"bicubic"`` -- super-resolution only: bicubic upsampling of y (torch, half-pixel centres,
  no antialiasing for upsampling).
* ``"biharmonic"`` -- inpainting only: scikit-image's biharmonic inpainting of the missing
  pixels (observed pixels kept as measured).
* ``"qcs_tv"`` -- JPEG only (an operator with quantisation cells, task ``jpeg``): JPEG deblocking,
  TV denoising alternated with the projection onto the file's quantisation cells (:func:`qcs_tv`).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..frequency import fourier_filter, fourier_gaussian_mean, power_law_spectrum, radial_frequency, ring_mean
from ..operators import build_operator
from ..operators.base import LinearOperator, check_image, conjugate_gradient
from ..operators.blur import BlurOperator
from ..priors.training_data import HELDOUT_IMAGES, load_skimage_image

__all__ = [
    "NotApplicable", "wiener", "wiener_problem", "tv_restore", "bicubic_upsample", "biharmonic_inpaint",
    "fit_measurement_spectrum", "tv_lambda", "operator_family", "TV_LAMBDA_PER_SIGMA", "TV_LAMBDA_FLOOR", "calibrate_tv",
    "operator_dtype", "qcs_tv", "has_quantisation_cells", "QCS_TV_WEIGHT_PER_SIGMA", "QCS_TV_ITERATIONS",
]

#: lam = c * sigma_y for ||A x - y||^2 / 2 + lam TV(x), [0, 1] units, per operator family.
#: Calibrated by :func:`calibrate_tv` on 64x64 crops of 4 TRAINING images (rocket, brick, coins,
#: retina; centre crops of 128 px area-averaged to 64), sigma_y in {0.0125, 0.025, 0.05}, the
#: local protocol's operators (Gaussian blur 25/2.0, SR x4 bicubic, 70% random inpainting,
#: denoising), 100 FISTA iterations: the c minimising the mean MSE over images and noise levels
#: on the grid {0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2}. The MSE curves are flat
#: near the optimum (blur: 0.0021 at c = 0.1 vs 0.0023 at 0.05 and 0.2).
TV_LAMBDA_PER_SIGMA: dict[str, float] = {
    "blur": 0.1,
    "sr": 0.1,
    "inpaint": 0.35,
    "denoise": 0.75,
    "other": 0.1,
}
TV_LAMBDA_FLOOR = 1e-4


class NotApplicable(ValueError):
    """A classical method that does not apply to this operator or noise (the message says why)."""


def operator_family(operator: LinearOperator) -> str:
    """'blur', 'sr', 'inpaint', 'denoise' or 'other': the operator's declared ``family``."""
    return operator.family


def has_quantisation_cells(operator: LinearOperator) -> bool:
    """Whether the operator's measurement is a set of quantisation cells (a JPEG's: it declares
    ``stored_integers`` and ``project``)."""
    return hasattr(operator, "stored_integers") and hasattr(operator, "project")


# --------------------------------------------------------------------------------- Wiener

def fit_measurement_spectrum(y: Tensor, gain2: Tensor | None, sigma: float, r_min: float = 0.02,
                             r_max: float = 1.0, bins: int = 32) -> tuple[Tensor, Tensor]:
    """Power law S(r) = a r^-alpha of the *unblurred* image, fitted to a measurement.

    The measurement's radially averaged power P(r) (ortho FFT, mean removed, averaged over
    channels) is E|H|^2 S + sigma^2, so S is estimated as (P - sigma^2) / mean_ring |H|^2 on the
    rings where that is reliable (|H|^2 > 0.05, P > 2 sigma^2, r in [r_min, r_max]) and a line is
    fitted in log-log. ``gain2``: (h, w) |H|^2 on the full FFT grid (None = 1). Falls back to
    alpha = 2 through the mean power when fewer than 3 rings qualify. Returns (a (B,), alpha (B,)),
    alpha clamped to [0.5, 4].
    """
    b = y.shape[0]
    h, w = y.shape[-2:]
    y64 = y.double()
    power = torch.fft.fft2(y64 - y64.mean(dim=(-2, -1), keepdim=True), norm="ortho").abs().square().mean(1)  # (B,h,w)
    r = radial_frequency(h, w, dtype=torch.float64)
    idx = (r * bins).long().clamp(max=bins - 1).flatten()
    p_ring, counts = ring_mean(power.flatten(1), idx, bins)  # NaN on empty rings, which `keep` excludes
    g2 = torch.ones(h, w, dtype=torch.float64) if gain2 is None else gain2.double().cpu()
    g_ring, _ = ring_mean(g2.flatten(), idx, bins)
    radii = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins
    s2 = float(sigma) ** 2
    amps, alphas = [], []
    for i in range(b):
        est = (p_ring[i] - s2) / g_ring.clamp_min(1e-12)
        keep = (counts > 0) & (g_ring > 0.05) & (p_ring[i] > 2 * s2) & (radii >= r_min) & (radii <= r_max) & (est > 0)
        if int(keep.sum()) >= 3:
            lr, lp = radii[keep].log(), est[keep].log()
            lr_c = lr - lr.mean()
            alpha = float((-(lp - lp.mean()) @ lr_c / lr_c.square().sum()).clamp(0.5, 4.0))
            log_amp = float(lp.mean() + alpha * lr.mean())
        else:  # too little signal: alpha = 2 with the total power above the noise
            alpha = 2.0
            rr = r.clamp_min(0.5 / max(h, w))
            excess = max(float(power[i].mean()) - s2, 1e-12)
            log_amp = math.log(excess / float((rr ** -alpha).mean()))
        amps.append(math.exp(log_amp))
        alphas.append(alpha)
    return torch.tensor(amps, dtype=torch.float64), torch.tensor(alphas, dtype=torch.float64)


def _circular_wiener(y: Tensor, H: Tensor, sigma: float, amp: Tensor, alpha: Tensor) -> Tensor:
    """Wiener deconvolution of y (B, C, h, w) by a circulant transfer function H (h, w) with the
    power law (amp, alpha) per image: X = H* S Y / (|H|^2 S + sigma^2), the mean passed through."""
    h, w = y.shape[-2:]
    y64 = y.double().cpu()
    H = H.to(torch.complex128).cpu()
    S = power_law_spectrum(amp.double().cpu(), alpha.double().cpu(), (h, w), infinite_dc=False)
    mean = y64.mean(dim=(-2, -1), keepdim=True)  # blur and identity have DC gain 1
    X = fourier_gaussian_mean(H, torch.fft.fft2(y64 - mean, norm="ortho"), float(sigma) ** 2, prior_var=S)
    X[..., 0, 0] = 0.0  # the mean was removed; it is put back unchanged
    x = torch.fft.ifft2(X, norm="ortho").real + mean
    return x.to(dtype=y.dtype, device=y.device)


def wiener_problem(operator: LinearOperator) -> str | None:
    """Why Wiener filtering cannot restore ``operator`` (None: it can): it needs a blur, denoising,
    SR or circulant operator."""
    family = operator_family(operator)
    if family in ("blur", "denoise", "sr") or operator.is_circulant:
        return None
    if family == "inpaint":
        return "Wiener filtering does not apply to inpainting (use 'biharmonic')"
    return f"Wiener filtering needs a blur, denoising or SR operator, got {type(operator).__name__}"


def wiener(operator: LinearOperator, y: Tensor, sigma_y: float, cg_iters: int = 200) -> Tensor:
    """Wiener / linear-MMSE restoration with a power-law spectrum fitted to y (see module doc)."""
    fam = operator_family(operator)
    h, w = y.shape[-2:]
    if operator.is_circulant:
        H = operator.transfer_function(h, w, dtype=torch.float64)
        amp, alpha = fit_measurement_spectrum(y, H.abs().square().cpu(), sigma_y)
        return _circular_wiener(y, H, sigma_y, amp, alpha)
    if fam == "blur":
        # reflect or valid boundary: the same Gaussian model with the true operator, solved by conjugate
        # gradients preconditioned (and started) with the same kernel's circulant Wiener filter
        circ = BlurOperator(operator.blur_kernel(), "circular")
        Hc = circ.transfer_function(h, w, dtype=torch.float64)
        amp, alpha = fit_measurement_spectrum(y, Hc.abs().square().cpu(), sigma_y)
        image_hw = tuple(operator.image_shape(y.shape)[-2:])
        if image_hw != (h, w):  # valid boundary: the preconditioner works on the larger image
            Hc = circ.transfer_function(*image_hw, dtype=torch.float64)
        return _cg_wiener(operator, y, sigma_y, cg_iters, amp, alpha, Hc)
    if fam == "sr":
        factor = operator.downsampling_factor
        # the pseudo-inverse carries the image below the measurement's Nyquist (r ~ 0.7 / factor)
        amp, alpha = fit_measurement_spectrum(operator.A_pinv(y.double()), None, 0.0, r_max=0.5 / factor, bins=64)
        return _cg_wiener(operator, y, sigma_y, cg_iters, amp, alpha, None)
    raise NotApplicable(wiener_problem(operator) or "Wiener filtering does not apply")


def _cg_wiener(operator: LinearOperator, y: Tensor, sigma_y: float, iters: int, amp: Tensor, alpha: Tensor,
               H_approx: Tensor | None) -> Tensor:
    """Generalised Wiener for a non-circulant A with A(1) = 1 (reflect blur, SR): x = mu + d,
    (A^T A / s^2 + C^-1) d = A^T (y - mu) / s^2, C^-1 = F^-1 diag(1 / S) F (0 at DC), by
    conjugate gradients, preconditioned with (|H_approx|^2 / s^2 + 1 / S)^-1 when given."""
    s = max(float(sigma_y), 1e-3)
    y64 = y.double()
    shape = operator.image_shape(y.shape)
    h, w = shape[-2:]
    inv_s = (1.0 / power_law_spectrum(amp.double().cpu(), alpha.double().cpu(), (h, w), infinite_dc=False)).to(y.device)
    inv_s[..., 0, 0] = 0.0
    mean = y64.mean(dim=(-2, -1), keepdim=True)
    rhs = operator.A_adjoint(y64 - mean) / s**2

    def apply(v: Tensor) -> Tensor:
        return operator.A_adjoint(operator.A(v)) / s**2 + fourier_filter(v, inv_s)

    if H_approx is None:
        d = conjugate_gradient(apply, rhs, operator.A_pinv(y64) - mean, max_iter=iters, tol=1e-7)
        return (d + mean).to(y.dtype)
    Hc = H_approx.to(torch.complex128).to(y.device)
    precond_gain = 1.0 / (Hc.abs().square() / s**2 + inv_s)
    x0 = fourier_filter(rhs, precond_gain)  # = the circulant Wiener filter of y
    d = conjugate_gradient(apply, rhs, x0, max_iter=iters, tol=1e-7,
                           precondition=lambda v: fourier_filter(v, precond_gain))
    return (d + mean).to(y.dtype)


# --------------------------------------------------------------------------------- TV

def operator_dtype(operator: LinearOperator) -> torch.dtype:
    """The floating dtype the solvers here call ``operator.A`` / ``A_adjoint`` in: the operator's
    declared ``dtype`` where it has one (a :class:`~nfc_dps.operators.FunctionOperator`'s, a
    deepinv physics' :class:`~nfc_dps.interop.PhysicsOperator`'s), a wrapper's ``inner``
    operator's, else float64 (the built-in operators compute in their input's dtype)."""
    seen = 0
    while operator is not None and seen < 16:  # a chain of wrappers (CroppedOperator.inner)
        declared = getattr(operator, "dtype", None)
        if isinstance(declared, torch.dtype) and declared.is_floating_point:
            return declared
        operator, seen = getattr(operator, "inner", None), seen + 1
    return torch.float64


class _InDtype:
    """``operator`` seen by a float64 solver: its inputs cast to ``dtype`` (the operator's own),
    its outputs back to float64; the rest of its interface as is."""

    def __init__(self, operator: LinearOperator, dtype: torch.dtype) -> None:
        self.operator, self.dtype = operator, dtype

    def A(self, x: Tensor) -> Tensor:
        return self.operator.A(x.to(self.dtype)).to(torch.float64)

    def A_adjoint(self, y: Tensor) -> Tensor:
        return self.operator.A_adjoint(y.to(self.dtype)).to(torch.float64)

    def __getattr__(self, name: str):
        if name == "operator":  # not set yet
            raise AttributeError(name)
        return getattr(self.operator, name)


def tv_lambda(operator: LinearOperator, sigma_y: float) -> float:
    """The calibrated rule lam = c_family * sigma_y (floored at 1e-4), [0, 1] units."""
    return max(TV_LAMBDA_PER_SIGMA[operator_family(operator)] * float(sigma_y), TV_LAMBDA_FLOOR)


def _operator_norm2(operator: LinearOperator, shape: Sequence[int], iters: int = 30) -> float:
    """||A^T A|| by power iterations (deterministic start), with a 2% safety margin."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn((1, *shape[1:]), generator=g, dtype=torch.float64)
    v = v / v.norm()
    lam = 1.0
    for _ in range(iters):
        u = operator.A_adjoint(operator.A(v))
        lam = float(u.norm())
        if lam == 0:
            return 1.0
        v = u / lam
    return lam * 1.02


def _tv_prox(v: Tensor, weight: float, inner_iters: int) -> Tensor:
    from skimage.restoration import denoise_tv_chambolle

    out = np.empty(v.shape, dtype=np.float64)
    arr = v.detach().cpu().double().numpy()
    for b in range(arr.shape[0]):
        if arr.shape[1] == 1:
            out[b, 0] = denoise_tv_chambolle(arr[b, 0], weight=weight, max_num_iter=inner_iters)
        else:
            out[b] = np.moveaxis(denoise_tv_chambolle(np.moveaxis(arr[b], 0, -1), weight=weight,
                                                      max_num_iter=inner_iters, channel_axis=-1), -1, 0)
    return torch.from_numpy(out)


def _initial_guess(operator: LinearOperator, y: Tensor) -> Tensor:
    """A^T y / A^T A 1 where that is > 0.05 (blur: ~y, SR: a crude upsampling, inpainting:
    the observed pixels), the mean of y elsewhere."""
    shape = operator.image_shape(y.shape)
    ones = torch.ones((1, *shape[1:]), dtype=y.dtype)
    norm = operator.A_adjoint(operator.A(ones))
    back = operator.A_adjoint(y)
    mask = operator.pixel_mask()
    if mask is not None:
        m = mask.to(y.dtype)
        mean = (y * m).sum(dim=(-2, -1), keepdim=True) / m.sum().clamp_min(1)
    else:
        mean = y.mean(dim=(-2, -1), keepdim=True)
    ok = norm > 0.05
    return torch.where(ok, back / torch.where(ok, norm, torch.ones_like(norm)), mean.expand(shape))


def tv_restore(operator: LinearOperator, y: Tensor, sigma_y: float, lam: float | None = None, iters: int = 100,
               inner_iters: int = 40) -> Tensor:
    """FISTA on ||A x - y||^2 / 2 + lam TV(x) (see module doc); lam defaults to :func:`tv_lambda`."""
    lam = tv_lambda(operator, sigma_y) if lam is None else float(lam)
    y64 = y.double().cpu()
    operator = _InDtype(operator, operator_dtype(operator))
    shape = operator.image_shape(y.shape)
    step = 1.0 / _operator_norm2(operator, shape)
    x = _initial_guess(operator, y64)
    z, t = x, 1.0
    for _ in range(iters):
        grad = operator.A_adjoint(operator.A(z) - y64)
        x_new = _tv_prox(z - step * grad, lam * step, inner_iters)
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        z = x_new + ((t - 1) / t_new) * (x_new - x)
        x, t = x_new, t_new
    return x.to(dtype=y.dtype, device=y.device)


# --------------------------------------------------------------------------------- JPEG

#: qcs_tv's TV weight per sigma_y (weight = c * q_min / sqrt(12)) and its alternations, chosen on
#: validation crops of motorcycle_left only (``scripts/jpeg_validation.py --tune``): more alternations
#: or a larger weight converge towards the least-TV image of the cells, which is further from the truth
QCS_TV_WEIGHT_PER_SIGMA = 0.25
QCS_TV_ITERATIONS = 4


def qcs_tv(operator: LinearOperator, y: Tensor, sigma_y: float | None = None, weight: float | None = None,
           iters: int = QCS_TV_ITERATIONS, inner_iters: int = 40) -> Tensor:
    """JPEG deblocking by projection onto the quantisation constraint set: from the dequantised image
    (``A_pinv(y)``), ``iters`` times a TV denoising (scikit-image's Chambolle, channel-wise, ``weight``)
    then the projection onto the stored integers' cells (``operator.project``). ``y`` (B, C, Hp, Wp) a
    JPEG measurement (:func:`nfc_dps.operators.jpeg.jpeg_measurement`); ``sigma_y`` its noise std (default
    the operator's, q_min / sqrt(12)); weight = :data:`QCS_TV_WEIGHT_PER_SIGMA` * sigma_y by default.
    Computed in float64 on the CPU; returns (B, C, H, W) in [0, 1] in y's dtype and device."""
    if not has_quantisation_cells(operator):
        raise NotApplicable(f"QCS deblocking needs a JPEG operator (quantisation cells), got {type(operator).__name__}")
    check_image(y, "y")
    sigma_y = operator.sigma_y if sigma_y is None else float(sigma_y)
    weight = QCS_TV_WEIGHT_PER_SIGMA * sigma_y if weight is None else float(weight)
    y64 = y.detach().double().cpu()
    k = operator.stored_integers(y64)
    x = operator.project(operator.A_pinv(y64), k)
    for _ in range(int(iters)):
        x = operator.project(_tv_prox(x, weight, inner_iters), k)
    return x.clamp(0, 1).to(dtype=y.dtype, device=y.device)


# --------------------------------------------------------------------------------- SR, inpainting

def bicubic_upsample(y: Tensor, factor: int) -> Tensor:
    """Bicubic upsampling by ``factor`` (half-pixel centres as the SR operator; no antialias)."""
    return F.interpolate(y, scale_factor=int(factor), mode="bicubic", align_corners=False)


def biharmonic_inpaint(operator: LinearOperator, y: Tensor) -> Tensor:
    """scikit-image's biharmonic inpainting of the missing pixels of the operator's ``pixel_mask()``."""
    from skimage.restoration import inpaint_biharmonic

    mask = operator.pixel_mask()
    if mask is None:
        raise NotApplicable(f"biharmonic inpainting needs an operator with a pixel mask, got {type(operator).__name__}")
    missing = (mask == 0).cpu().numpy()
    arr = y.detach().cpu().double().numpy()
    out = np.empty_like(arr)
    for b in range(arr.shape[0]):
        if not missing.any():
            out[b] = arr[b]
        elif arr.shape[1] == 1:
            out[b, 0] = inpaint_biharmonic(arr[b, 0], missing)
        else:
            out[b] = np.moveaxis(inpaint_biharmonic(np.moveaxis(arr[b], 0, -1), missing, channel_axis=-1), -1, 0)
    return torch.from_numpy(out).to(dtype=y.dtype, device=y.device)


# --------------------------------------------------------------------------------- calibration

def calibrate_tv(
    image_names: Iterable[str] = ("rocket", "brick", "coins", "retina"),
    sigmas: Sequence[float] = (0.0125, 0.025, 0.05),
    size: int = 64,
    zoom: int = 2,
    grid: Sequence[float] = (0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
    iters: int = 100,
) -> dict[str, dict[float, float]]:
    """Mean MSE of TV with lam = c * sigma_y for each c in ``grid``, per operator family.

    Uses TRAINING images only (raises if a held-out name is passed). Returns
    {family: {c: mean MSE over images and sigmas}}; pick the argmin per family.
    """
    names = list(image_names)
    bad = set(names) & set(HELDOUT_IMAGES)
    if bad:
        raise ValueError(f"calibrate on training images only; {sorted(bad)} are held out")
    ops = {
        "blur": build_operator("deblur_gaussian", size, kernel_size=25, kernel_std=2.0, boundary="circular"),
        "sr": build_operator("sr_bicubic", size, factor=4),
        "inpaint": build_operator("inpaint_random", size, seed=1, missing_fraction=0.7),
        "denoise": build_operator("denoise", size),
    }
    xs = []
    for n in names:
        img = load_skimage_image(n)
        side = size * zoom
        h, w = img.shape[:2]
        t, l = max(0, (h - side) // 2), max(0, (w - side) // 2)
        crop = torch.from_numpy(np.ascontiguousarray(img[t:t + side, l:l + side])).permute(2, 0, 1)[None]
        xs.append(F.avg_pool2d(crop, zoom) if zoom > 1 else crop)
    x = torch.cat(xs).double()
    out: dict[str, dict[float, float]] = {}
    for fam, op in ops.items():
        res = {}
        for c in grid:
            errs = []
            for i, s in enumerate(sigmas):
                y = op.measure(x, s, torch.Generator().manual_seed(100 + i))
                xr = tv_restore(op, y, s, lam=max(c * s, TV_LAMBDA_FLOOR), iters=iters).clamp(0, 1)
                errs.append(float((xr - x).square().mean()))
            res[float(c)] = float(np.mean(errs))
        out[fam] = res
    return out

"""Blind deblurring's kernel estimation: the blur kernel of a photograph, from the photograph alone
or given an estimate of the sharp image, and the kernels' error up to a shift.

The measurement is a photograph's blur: the valid part of a true convolution, ``y = valid(k * x)``
(:class:`nfc_dps.operators.blur.BlurOperator` with ``boundary="valid"``), so an (H, W) scene gives
an (H - s + 1, W - s + 1) photo for an (s, s) kernel.

* :func:`kernel_step`: the kernel given an image estimate, least squares on the image gradients,
  ``min_k sum_d ||valid(k * d x) - d y||^2 + gamma ||k||^2``, by conjugate gradients on the exact
  valid model (FFTs on the scene's grid), then projected: positive, entries below ``threshold`` of
  the peak and the connected components with less than a tenth of the largest one's mass dropped
  (a shake's path is one stroke), sum 1, centred. With ``salient`` < 1 only the strongest image
  gradients enter the fit (Cho and Lee 2009).
* :func:`estimate_kernel`: the kernel from the photo alone, coarse to fine (Xu et al. 2013, Pan et
  al. 2014): from a 5-px kernel on a reduced copy of the photo up to the full size, alternating an
  L0-gradient image step (:func:`l0_deblur`: the sharpest piecewise-flat image the current kernel
  explains) and the kernel step. The L0 step is what keeps the trivial answer (a delta kernel and
  the blurred photo) away: its sharp edges cannot be explained by a kernel narrower than the blur.

Images here are gray (the channels' mean), float64 torch tensors (H, W); kernels (s, s), s odd,
sum 1, their centre of mass at (s // 2, s // 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.ndimage as ndi
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["KernelEstimator", "centred_kernel", "check_estimable", "check_kernel_size", "default_kernel_size",
           "estimate_kernel", "kernel_error", "kernel_step", "l0_deblur",
           "shock_filtered"]

#: the kernel size at 256 px when none is given, scaled with the photo's shorter side
DEFAULT_KERNEL_SIZE_256 = 31
#: the smallest kernel of the coarse-to-fine pyramid, px
COARSEST_KERNEL = 5
#: the photo's longest side the kernel is estimated on; a larger photo is estimated on its centre crop
ESTIMATION_SIDE = 384



def _gray(y: Tensor) -> Tensor:
    """(H, W) float64 gray, on the CPU, of a (C, H, W) or (H, W) tensor."""
    y = y.detach().cpu().double()
    return y.mean(0) if y.ndim == 3 else y


def _gradients(x: Tensor) -> tuple[Tensor, Tensor]:
    """Forward differences along rows and columns ('valid': one row / column fewer)."""
    return x[1:, :] - x[:-1, :], x[:, 1:] - x[:, :-1]


class _ValidConvolution:
    """k -> valid(k * x) for a fixed image x (H, W) and (s, s) kernels, and its adjoint r -> k, by
    FFTs on x's grid (the valid part of a circular convolution there never wraps)."""

    def __init__(self, x: Tensor, size: int) -> None:
        self.shape, self.size = x.shape, size
        self.X = torch.fft.rfft2(x)

    def __call__(self, k: Tensor) -> Tensor:
        s = self.size
        out = torch.fft.irfft2(torch.fft.rfft2(k, s=self.shape) * self.X, s=self.shape)
        return out[s - 1:, s - 1:]

    def adjoint(self, r: Tensor) -> Tensor:
        s = self.size
        canvas = torch.zeros(self.shape, dtype=r.dtype)
        canvas[s - 1:, s - 1:] = r
        return torch.fft.irfft2(torch.fft.rfft2(canvas) * self.X.conj(), s=self.shape)[:s, :s]


def _conjugate_gradient(normal, rhs: Tensor, x0: Tensor, iterations: int, precondition=None) -> Tensor:
    """(Preconditioned) conjugate gradients for ``normal(x) = rhs`` from ``x0``."""
    x = x0.clone()
    r = rhs - normal(x)
    z = precondition(r) if precondition is not None else r
    p, rz = z.clone(), (r * z).sum()
    for _ in range(iterations):
        if rz.abs() <= 1e-30:
            break
        q = normal(p)
        alpha = rz / (p * q).sum()
        x, r = x + alpha * p, r - alpha * q
        z = precondition(r) if precondition is not None else r
        rz_new = (r * z).sum()
        p, rz = z + (rz_new / rz) * p, rz_new
    return x


def centred_kernel(k: Tensor) -> Tensor:
    """``k`` shifted by whole pixels so that its centre of mass is nearest its centre (the part
    shifted out of the support is dropped), sum 1."""
    k = k.clamp(min=0)
    s = k.shape[0]
    total = k.sum()
    if not total > 0:
        out = torch.zeros_like(k)
        out[s // 2, s // 2] = 1
        return out
    grid = torch.arange(s, dtype=k.dtype)
    cy = float((k.sum(1) * grid).sum() / total)
    cx = float((k.sum(0) * grid).sum() / total)
    dy, dx = s // 2 - int(round(cy)), s // 2 - int(round(cx))
    out = torch.zeros_like(k)
    ys, yd = slice(max(0, -dy), min(s, s - dy)), slice(max(0, dy), min(s, s + dy))
    xs, xd = slice(max(0, -dx), min(s, s - dx)), slice(max(0, dx), min(s, s + dx))
    out[yd, xd] = k[ys, xs]
    return out / out.sum()


def _project(k: Tensor, threshold: float) -> Tensor:
    """Positive, entries below ``threshold`` x the peak dropped, only the connected components with at
    least a tenth of the largest one's mass kept (the path of a shake is one stroke), sum 1, centred."""
    k = k.clamp(min=0)
    peak = float(k.max())
    if not peak > 0:
        return centred_kernel(k)
    k = torch.where(k >= threshold * peak, k, torch.zeros_like(k))
    labels, n = ndi.label(k.numpy() > 0, structure=np.ones((3, 3)))
    if n > 1:
        mass = ndi.sum(k.numpy(), labels, index=np.arange(1, n + 1))
        keep = np.isin(labels, 1 + np.flatnonzero(mass >= 0.1 * mass.max()))
        k = k * torch.from_numpy(keep)
    return centred_kernel(k)


def kernel_step(x: Tensor, y: Tensor, size: int, k0: Tensor | None = None, gamma: float = 1e-2,
                threshold: float = 0.05, iterations: int = 30, salient: float = 1.0) -> Tensor:
    """The (size, size) kernel that best explains the photo ``y`` from the image estimate ``x``.

    x: (H, W) or (C, H, W) image estimate on the scene's grid, y: (H - size + 1, W - size + 1) or
    (C, ...) photo (gray is taken). Least squares on the gradients with Tikhonov weight ``gamma``
    (relative to the gradients' energy, the normal matrix's diagonal), by ``iterations`` of
    conjugate gradients from ``k0`` (default: the delta), then projected (:func:`_project`);
    ``salient``: the fraction of the strongest gradients that enter the fit. Returns (size, size)
    float64, sum 1, centred.
    """
    x, y = _gray(x), _gray(y)
    if tuple(y.shape) != (x.shape[0] - size + 1, x.shape[1] - size + 1):
        raise ValueError(f"kernel_step: an image of {tuple(x.shape)} and a kernel of {size} px give a photo of "
                         f"{(x.shape[0] - size + 1, x.shape[1] - size + 1)}, got {tuple(y.shape)}")
    if not 0.0 < salient <= 1.0:
        raise ValueError(f"kernel_step: salient must be in (0, 1], got {salient!r}")
    grads = _gradients(x)
    if salient < 1.0:  # only the strongest edges (Cho and Lee 2009): errors in flat regions would flatten k
        magnitude = torch.cat([g.abs().flatten() for g in grads])
        cut = magnitude.kthvalue(max(1, int(round((1.0 - salient) * magnitude.numel())))).values
        grads = tuple(torch.where(g.abs() >= cut, g, torch.zeros_like(g)) for g in grads)
    pairs = [(_ValidConvolution(gx, size), gy) for gx, gy in zip(grads, _gradients(y))]
    reg = gamma * sum(float((gx * gx).sum()) for gx in grads)

    def normal(k: Tensor) -> Tensor:
        return sum(op.adjoint(op(k)) for op, _ in pairs) + reg * k

    rhs = sum(op.adjoint(g) for op, g in pairs)
    if k0 is None:
        k0 = torch.zeros(size, size, dtype=torch.float64)
        k0[size // 2, size // 2] = 1
    k = _conjugate_gradient(normal, rhs, k0.double(), iterations)
    return _project(k, threshold)


def kernel_error(estimate: Tensor, truth: Tensor) -> float:
    """The kernels' relative L2 error up to a shift: min over integer shifts of ||shift(estimate) -
    truth|| / ||truth||, the two zero-padded to a common size."""
    a, b = estimate.double().cpu(), truth.double().cpu()
    s = max(a.shape[0], b.shape[0])
    pa, pb = [(s - t.shape[0]) // 2 for t in (a, b)]
    a = F.pad(a, (pa, s - a.shape[0] - pa, pa, s - a.shape[0] - pa))
    b = F.pad(b, (pb, s - b.shape[0] - pb, pb, s - b.shape[0] - pb))
    n = 2 * s
    corr = torch.fft.irfft2(torch.fft.rfft2(a, s=(n, n)) * torch.fft.rfft2(b, s=(n, n)).conj(), s=(n, n))
    best = float(corr.max())
    err2 = float((a * a).sum() + (b * b).sum()) - 2 * best
    return math.sqrt(max(err2, 0.0)) / float(b.norm())


def default_kernel_size(h: int, w: int) -> int:
    """The kernel size assumed for an (h, w) photo when none is given: ``DEFAULT_KERNEL_SIZE_256``
    at a 256-px shorter side, scaled with it, odd, at least 7 and at most a third of the shorter
    side (7 below 21 px)."""
    short = min(int(h), int(w))
    size = max(7, min(int(round(DEFAULT_KERNEL_SIZE_256 * short / 256)), short // 3))
    return size if size % 2 else size - 1


def check_kernel_size(size: object, where: str = "deblur_blind") -> int:
    """``size`` as an int; ValueError naming it unless it is an odd int >= 3."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 3 or size % 2 == 0:
        raise ValueError(f"{where}: kernel_size must be an odd int >= 3 (the kernel's side in px), got {size!r}")
    return int(size)


def check_estimable(h: int, w: int, size: int, where: str = "deblur_blind") -> None:
    """ValueError naming the sizes unless a (size, size) kernel can be estimated from an (h, w)
    photo: an odd size >= 3 and a photo at least twice the kernel on its shorter side."""
    size = check_kernel_size(size, where)
    if min(h, w) < 2 * size:
        raise ValueError(f"{where}: a {h}x{w} photo is too small to estimate a {size}-px kernel from (its shorter side "
                         f"must be at least twice the kernel, {2 * size} px); give a smaller kernel_size")


def _laplacian_spectrum(shape: tuple[int, int]) -> Tensor:
    """rfft2 of the circular gradients' normal matrix (the 5-point Laplacian) on ``shape``."""
    stencil = torch.zeros(shape, dtype=torch.float64)
    stencil[0, 0] = 4
    stencil[0, 1] = stencil[1, 0] = stencil[0, -1] = stencil[-1, 0] = -1
    return torch.fft.rfft2(stencil).real


def _gradients_adjoint(gx: Tensor, gy: Tensor) -> Tensor:
    """The adjoint of :func:`_gradients` (rows' and columns' forward differences)."""
    out = torch.zeros(gx.shape[0] + 1, gy.shape[1] + 1, dtype=gx.dtype)
    out[1:, :] += gx
    out[:-1, :] -= gx
    out[:, 1:] += gy
    out[:, :-1] -= gy
    return out


def l0_deblur(y: Tensor, k: Tensor, lam: float, x0: Tensor | None = None, beta_max: float = 1e5,
              cg_iterations: int = 8) -> Tensor:
    """The L0-gradient image (Xu et al. 2013) on the scene's grid: ``min_x ||valid(k * x) - y||^2 +
    lam ||grad x||_0`` by half-quadratic splitting (beta doubling from 2 lam up to ``beta_max``),
    each quadratic step by warm-started conjugate gradients on the exact valid model, preconditioned
    with the circular model's closed form. y: (h, w) gray photo in [0, 1], k: (s, s). Returns the
    (h + s - 1, w + s - 1) float64 estimate (start: ``x0``, else the photo edge-padded)."""
    y, k = _gray(y), k.double()
    s = k.shape[0]
    if x0 is None:
        x0 = F.pad(y[None, None], (s // 2, s - 1 - s // 2, s // 2, s - 1 - s // 2), mode="replicate")[0, 0]
    shape = tuple(x0.shape)
    K = torch.fft.rfft2(k, s=shape)

    def blur(x: Tensor) -> Tensor:
        return torch.fft.irfft2(torch.fft.rfft2(x) * K, s=shape)[s - 1:, s - 1:]

    def blur_adjoint(r: Tensor) -> Tensor:
        canvas = torch.zeros(shape, dtype=r.dtype)
        canvas[s - 1:, s - 1:] = r
        return torch.fft.irfft2(torch.fft.rfft2(canvas) * K.conj(), s=shape)

    laplacian, K2, aty = _laplacian_spectrum(shape), K.abs().square(), blur_adjoint(y)
    x, beta = x0.clone(), 2 * lam
    while beta < beta_max:
        gx, gy = (torch.where(g * g < lam / beta, torch.zeros_like(g), g) for g in _gradients(x))

        def normal(v: Tensor, b: float = beta) -> Tensor:
            return blur_adjoint(blur(v)) + b * _gradients_adjoint(*_gradients(v))

        denominator = K2 + beta * laplacian

        def precondition(r: Tensor, d: Tensor = denominator) -> Tensor:
            return torch.fft.irfft2(torch.fft.rfft2(r) / d, s=shape)

        x = _conjugate_gradient(normal, aty + beta * _gradients_adjoint(gx, gy), x, cg_iterations, precondition)
        beta *= 2
    return x


def shock_filtered(x: Tensor, steps: int, dt: float = 0.5) -> Tensor:
    """(H, W) ``x`` after ``steps`` of Osher and Rudin's shock filter, x <- x - dt sign(laplacian)
    |grad x| with central differences: edges steepened (overshooting at a ramp's corners), flat
    parts kept."""
    for _ in range(steps):
        p = F.pad(x[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
        gx, gy = (p[1:-1, 2:] - p[1:-1, :-2]) / 2, (p[2:, 1:-1] - p[:-2, 1:-1]) / 2
        laplacian = p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * x
        x = x - dt * torch.sign(laplacian) * torch.sqrt(gx * gx + gy * gy)
    return x


@dataclass(frozen=True)
class KernelEstimator:
    """The settings of :func:`estimate_kernel` (chosen on validation photos, docs/notes/blind.md).

    lam: the L0 weight of the image step at each scale's start, divided by ``lam_decay`` per
    alternation down to ``lam_min``; iterations: alternations per scale; gamma, threshold: the
    kernel step's (:func:`kernel_step`); gamma_finest: its Tikhonov weight at the full scale,
    where the photo's noise is not averaged away; scale_step: the kernel size's ratio between
    scales; shock_steps: steps of a shock filter that steepen the L0 image's edges before each
    kernel step (:func:`shock_filtered`, after Cho and Lee 2009; 0: none).
    """

    lam: float = 4e-3
    lam_decay: float = 1.1
    lam_min: float = 1e-4
    iterations: int = 5
    gamma: float = 1e-2
    gamma_finest: float = 1e-2
    threshold: float = 0.15
    scale_step: float = math.sqrt(2)
    shock_steps: int = 0


def _pyramid(size: int, step: float) -> list[int]:
    """The kernel sizes from coarse to fine: odd, from about ``COARSEST_KERNEL`` up to ``size``."""
    sizes = [size]
    while True:
        smaller = int(round(sizes[-1] / step))
        smaller -= 1 - smaller % 2
        if smaller < COARSEST_KERNEL:
            return sizes[::-1]
        sizes.append(smaller)


def _resized(img: Tensor, shape: tuple[int, int]) -> Tensor:
    return F.interpolate(img[None, None], size=shape, mode="bilinear", align_corners=False, antialias=True)[0, 0]


def _resized_kernel(k: Tensor, size: int) -> Tensor:
    if k.shape[0] == size:
        return k
    out = F.interpolate(k[None, None], size=(size, size), mode="bilinear", align_corners=True)[0, 0]
    return centred_kernel(out.clamp(min=0))


def estimate_kernel(y: Tensor, size: int, settings: KernelEstimator = KernelEstimator(),
                    callback: Callable[[int, int, Tensor], None] | None = None) -> Tensor:
    """The (size, size) blur kernel of the photo ``y`` ((C, h, w) or (h, w) in [0, 1], the valid part
    of the blur), from the photo alone, coarse to fine. A photo longer than ``ESTIMATION_SIDE`` is
    estimated on its centre crop (the blur is the same everywhere). ``callback(scale, scales,
    kernel)`` after each scale. Returns (size, size) float64, sum 1, centred."""
    y = _gray(y)
    check_estimable(*y.shape, size)
    h, w = (min(n, ESTIMATION_SIDE) for n in y.shape)
    top, left = (y.shape[0] - h) // 2, (y.shape[1] - w) // 2
    y = y[top:top + h, left:left + w]
    sizes = _pyramid(size, settings.scale_step)
    k = torch.zeros(sizes[0], sizes[0], dtype=torch.float64)
    k[sizes[0] // 2 - 1: sizes[0] // 2 + 2, sizes[0] // 2 - 1: sizes[0] // 2 + 2] = 1 / 9
    for i, s in enumerate(sizes):
        ratio = s / size
        photo = _resized(y, (max(s + 4, round(h * ratio)), max(s + 4, round(w * ratio)))) if s < size else y
        k, lam, x = _resized_kernel(k, s), settings.lam, None
        gamma = settings.gamma_finest if s == size else settings.gamma
        for _ in range(settings.iterations):
            x = l0_deblur(photo, k, lam, x)
            k = kernel_step(shock_filtered(x, settings.shock_steps), photo, s, k, gamma, settings.threshold)
            lam = max(lam / settings.lam_decay, settings.lam_min)
        if callback is not None:
            callback(i, len(sizes), k)
    return k

"""The kernel step of blind deblurring: the blur kernel that best explains a photograph given an
estimate of the sharp image, and the kernels' error up to a shift.

The measurement is a photograph's blur: the valid part of a true convolution, ``y = valid(k * x)``
(:class:`nfc_dps.operators.blur.BlurOperator` with ``boundary="valid"``), so an (H, W) scene gives
an (H - s + 1, W - s + 1) photo for an (s, s) kernel. :func:`kernel_step` solves least squares on
the image gradients, ``min_k sum_d ||valid(k * d x) - d y||^2 + gamma ||k||^2``, by conjugate
gradients on the exact valid model (FFTs on the scene's grid), then projects: positive, entries
below ``threshold`` of the peak and the connected components with less than a tenth of the largest
one's mass dropped, sum 1, centred. With ``salient`` < 1 only the strongest image gradients enter the fit (Cho and Lee
2009): errors of the estimate in flat regions would otherwise flatten the kernel.

Images here are gray (the channels' mean), float64 torch tensors (H, W); kernels (s, s), sum 1,
their centre of mass at (s // 2, s // 2).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.ndimage as ndi
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["centred_kernel", "kernel_error", "kernel_step"]


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

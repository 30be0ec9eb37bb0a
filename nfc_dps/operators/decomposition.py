"""Singular decompositions A = U diag(d) V^H, and the closed forms they give.

An operator that has one returns it from ``LinearOperator.decomposition()``; the pseudo-inverse and
the proximal solve of :class:`~nfc_dps.operators.base.LinearOperator` derive from it, and samplers
that work in the operator's basis (DDRM, DDNM+, NFC's data step) read it. On (B, C, H, W) images:

* ``V_adjoint(x)``: the image's coefficients, an orthonormal transform;
* ``U_adjoint(y)``: the measurement's coefficients, on the same grid as the image's (0 where A
  measures nothing); ``U(c)`` and ``V(c)`` map coefficients back;
* ``diagonal(h, w)``: d, broadcastable to the coefficients; A x = U(d * V_adjoint(x)). Complex in
  the Fourier basis; the singular values are |d|.

Bases: :class:`FourierDecomposition` (a circulant operator, d = its transfer function),
:class:`PixelDecomposition` (A x = d * x per pixel, e.g. a mask) and :class:`ChannelDecomposition`
(one small matrix mixing the channels of each pixel, d its singular values).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ..frequency import fourier_filter, fourier_gaussian_mean

__all__ = ["Decomposition", "FourierDecomposition", "PixelDecomposition", "ChannelDecomposition"]


def _identity(v: Tensor) -> Tensor:
    return v


class Decomposition:
    """A = U diag(d) V^H (module docstring). Subclasses give the transforms and the diagonal; the
    pseudo-inverse and the Gaussian conditional mean follow here, per coefficient."""

    def diagonal(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
        """d for (h, w) images, in ``dtype``'s precision (complex where the basis is), broadcastable
        to the coefficients."""
        raise NotImplementedError

    def V_adjoint(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def V(self, c: Tensor) -> Tensor:
        raise NotImplementedError

    def U_adjoint(self, y: Tensor) -> Tensor:
        raise NotImplementedError

    def U(self, c: Tensor) -> Tensor:
        raise NotImplementedError

    def singular_values(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                        device: torch.device | str | None = None) -> Tensor:
        """|d|, real, broadcastable to the coefficients."""
        return self.diagonal(h, w, dtype, device).abs()

    def gram_eigenvalues(self, h: int, w: int) -> Tensor:
        """The eigenvalues |d|^2 of A^T A (float64) in coefficient order: h * w values where d is
        one (h, w) grid shared by the channels, C * h * w where it differs per channel."""
        d = self.diagonal(h, w, torch.float64)
        return d.abs().square().expand(*d.shape[:-2], h, w).flatten()

    def pinv(self, y: Tensor, rcond: float | None = None) -> Tensor:
        """A^+ y = V(U^H y / d), components with |d| <= rcond * max |d| dropped (default rcond =
        sqrt(eps) of y's dtype: truncation and round-off errors of A A^+ A both stay ~sqrt(eps))."""
        d = self.diagonal(*y.shape[-2:], y.dtype, y.device)
        return self.backproject(y, _inverse(d, y.dtype, rcond))

    def gaussian_mean(self, y: Tensor, z: Tensor, s2: Tensor, r2: Tensor) -> Tensor:
        """argmin_x ||y - A x||^2 / (2 s2) + ||x - z||^2 / (2 r2) for a real diagonal; s2, r2
        (B, 1, 1, 1), r2 = inf allowed (no prior term: the least-squares solution closest to z).
        Per coefficient x_k = g_k y_k + (1 - g_k d_k) z_k with g_k = d_k r2 / (d_k^2 r2 + s2)."""
        d = self.diagonal(*z.shape[-2:], z.dtype, z.device)
        observed = d != 0
        gain = torch.where(torch.isinf(r2), torch.where(observed, 1.0 / torch.where(observed, d, 1.0), 0.0),
                           d * r2 / (d * d * r2 + s2))
        return self.V(gain * self.U_adjoint(y) + (1 - gain * d) * self.V_adjoint(z))

    def backproject(self, y: Tensor, g: Tensor) -> Tensor:
        """V diag(g) U^H y: the measurement taken to the image, its coefficient k weighted by g_k
        (g = 1 / d where d != 0: A^+ y)."""
        return self.V(self.U_adjoint(y) * g)

    def scale(self, v: Tensor, g: Tensor) -> Tensor:
        """V diag(g) V^H v: the image v with its coefficient k scaled by the real g_k."""
        return self.V(g * self.V_adjoint(v))

    def stationary_diagonal(self, transfer: Tensor) -> Tensor | None:
        """The diagonal in this basis of the stationary (shift-invariant) operator with the real
        transfer function ``transfer`` (..., H, W) on the FFT grid (a prior covariance, a
        frequency weight), or None where the basis does not diagonalise such operators."""
        return None


def _inverse(d: Tensor, dtype: torch.dtype, rcond: float | None) -> Tensor:
    """1 / d where |d| > rcond * max |d|, else 0 (the pseudo-inverse of diag(d))."""
    if rcond is None:
        rcond = float(torch.finfo(dtype).eps) ** 0.5
    mag = d.abs()
    keep = mag > rcond * mag.max()
    return torch.where(keep, 1.0 / torch.where(keep, d, torch.ones_like(d)), torch.zeros_like(d))


class FourierDecomposition(Decomposition):
    """A circulant operator: A = F^H diag(H) F, F the orthonormal 2-D DFT of each channel.

    ``transfer(h, w, dtype, device)``: the complex (h, w) transfer function H (the operator's
    ``transfer_function``). The pseudo-inverse and the prox run on the real-FFT half grid: a real
    image's spectrum is Hermitian, so half of it determines the rest, at half the cost.
    """

    def __init__(self, transfer: Callable[..., Tensor]) -> None:
        self.transfer = transfer

    def diagonal(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
        return self.transfer(int(h), int(w), dtype, device)

    def V_adjoint(self, x: Tensor) -> Tensor:
        return torch.fft.fft2(x, norm="ortho")

    def V(self, c: Tensor) -> Tensor:
        return torch.fft.ifft2(c, norm="ortho").real

    def U_adjoint(self, y: Tensor) -> Tensor:
        return self.V_adjoint(y)

    def U(self, c: Tensor) -> Tensor:
        return self.V(c)

    def _half(self, like: Tensor) -> Tensor:
        h, w = like.shape[-2:]
        return self.diagonal(h, w, like.dtype, like.device)[:, : w // 2 + 1]

    def backproject(self, y: Tensor, g: Tensor) -> Tensor:
        """For g on the full (h, w) grid."""
        return torch.fft.ifft2(torch.fft.fft2(y) * g).real

    def pinv(self, y: Tensor, rcond: float | None = None) -> Tensor:
        h, w = y.shape[-2:]
        return torch.fft.irfft2(torch.fft.rfft2(y) * _inverse(self._half(y), y.dtype, rcond), s=(h, w))

    def gaussian_mean(self, y: Tensor, z: Tensor, s2: Tensor, r2: Tensor) -> Tensor:
        inv_r2 = torch.where(torch.isinf(r2), torch.zeros_like(r2), 1.0 / r2)
        X = fourier_gaussian_mean(self._half(z), torch.fft.rfft2(y), s2, prior_mean=torch.fft.rfft2(z),
                                  prior_precision=inv_r2)
        return torch.fft.irfft2(X, s=tuple(z.shape[-2:]))

    def scale(self, v: Tensor, g: Tensor) -> Tensor:
        """For a g symmetric in frequency (g(-k) = g(k)), as any function of |H| is."""
        return fourier_filter(v, g)

    def stationary_diagonal(self, transfer: Tensor) -> Tensor:
        return transfer


class PixelDecomposition(Decomposition):
    """A x = d * x with one real (H, W) weight per pixel (a 0/1 mask for inpainting): V = U = I."""

    def __init__(self, weights: Tensor) -> None:
        if weights.ndim != 2:
            raise ValueError(f"pixel weights must have shape (H, W), got {tuple(weights.shape)}")
        self.weights = weights

    def diagonal(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
        if (int(h), int(w)) != tuple(self.weights.shape):
            raise ValueError(f"the image is {int(h)}x{int(w)} but the mask is "
                             f"{self.weights.shape[0]}x{self.weights.shape[1]}")
        return self.weights.to(dtype=dtype, device=device)

    V_adjoint = V = U_adjoint = U = staticmethod(_identity)


class ChannelDecomposition(Decomposition):
    """A mixes the C channels of each pixel by one real (m, C) matrix M, m <= C:
    (A x)[:, i] = sum_c M[i, c] x[:, c]. Its SVD M = U_M diag(s) V_M^T, applied per pixel; the
    coefficients are (B, C, H, W), d = s followed by C - m zeros, shape (C, 1, 1)."""

    def __init__(self, matrix: np.ndarray | Tensor) -> None:
        m = np.asarray(matrix, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] > m.shape[1]:
            raise ValueError(f"the channel matrix must be (m, C) with m <= C, got shape {m.shape}")
        u, s, vt = np.linalg.svd(m)
        self.u, self.vt = torch.from_numpy(u), torch.from_numpy(vt)
        self.s = torch.cat([torch.from_numpy(s), torch.zeros(m.shape[1] - m.shape[0], dtype=torch.float64)])

    @staticmethod
    def _mix(matrix: Tensor, x: Tensor) -> Tensor:
        return torch.einsum("ij,bjhw->bihw", matrix.to(dtype=x.dtype, device=x.device), x)

    def diagonal(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
        return self.s.to(dtype=dtype, device=device).view(-1, 1, 1)

    def V_adjoint(self, x: Tensor) -> Tensor:
        return self._mix(self.vt, x)

    def V(self, c: Tensor) -> Tensor:
        return self._mix(self.vt.T, c)

    def U_adjoint(self, y: Tensor) -> Tensor:
        c = self._mix(self.u.T, y)
        return torch.cat([c, c.new_zeros((c.shape[0], self.s.numel() - c.shape[1], *c.shape[2:]))], 1)

    def U(self, c: Tensor) -> Tensor:
        return self._mix(self.u, c[:, : self.u.shape[0]])

"""Denoising: the identity operator A = I (y = x + noise)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .base import LinearOperator, check_image, prox_scales
from .decomposition import FourierDecomposition

__all__ = ["Denoising"]


class Denoising(LinearOperator):
    """A = A^T = A^+ = I. Circulant with transfer function 1 (its decomposition is Fourier, which
    samplers that work in a basis use); the pseudo-inverse and the prox, which need no basis, are
    the identity's own (no FFT)."""

    name = "denoise"
    family = "denoise"
    is_circulant = True

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(measurement_shape)

    def transfer_function(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                          device: torch.device | str | None = None) -> Tensor:
        """All-ones (h, w) complex transfer function."""
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        return torch.ones((int(h), int(w)), dtype=cdtype, device=device)

    def decomposition(self) -> FourierDecomposition:
        return FourierDecomposition(self.transfer_function)

    def A(self, x: Tensor) -> Tensor:
        check_image(x, "x")
        return x.clone()

    def A_adjoint(self, y: Tensor) -> Tensor:
        check_image(y, "y")
        return y.clone()

    def A_pinv(self, y: Tensor) -> Tensor:
        check_image(y, "y")
        return y.clone()

    def normal(self, x: Tensor) -> Tensor:
        return x.clone()

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        """(r^2 y + sigma_y^2 z) / (r^2 + sigma_y^2); r = inf gives y. max_iter, tol unused."""
        check_image(y, "y")
        check_image(z, "z")
        if y.shape != z.shape:
            raise ValueError(f"y and z must have the same shape, got {tuple(y.shape)} and {tuple(z.shape)}")
        s2, r2 = prox_scales(sigma_y, r, z)
        wy = torch.where(torch.isinf(r2), torch.ones_like(r2), r2 / (r2 + s2))
        return wy * y + (1 - wy) * z

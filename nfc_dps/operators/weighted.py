"""A measurement weighted pixel by pixel: how a noise of per-pixel variance becomes Gaussian."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from .base import LinearOperator, check_image, prox_scales


class WeightedOperator(LinearOperator):
    """A' x = w * A(x) for per-pixel weights w on the measurement grid.

    ``weights``: (B, C, h, w) or (B, 1, h, w) for a batch of B measurements (B = 1 broadcasts), > 0.
    A measurement y of A with per-pixel noise variance v becomes ``w * y`` of A' with one noise
    std everywhere when w = s / sqrt(v) (:meth:`nfc_dps.noise.NoiseModel.weights`).

    Declared structure: the inner operator's family, channels, pixel mask (the weights change
    no pixel's being observed), measured frame and downsampling factor; no blur kernel, transfer function or
    decomposition (a weighted convolution is none of these). The pseudo-inverse is the inner
    operator's of y / w, the least-squares answer whatever the weights wherever A maps onto its
    measurement space (a blur, a downsampling, a mask on its observed pixels); the prox is
    elementwise for a diagonal inner operator (inpainting, denoising), else conjugate gradients.
    """

    name = "weighted"

    def __init__(self, inner: LinearOperator, weights: Tensor) -> None:
        super().__init__()
        if weights.ndim != 4:
            raise ValueError(f"weights must be (B, C, h, w), got shape {tuple(weights.shape)}")
        self.inner = inner
        self.register_buffer("weights", weights)

    @property
    def family(self) -> str:
        return self.inner.family

    @property
    def image_channels(self) -> int | None:
        return self.inner.image_channels

    @property
    def downsampling_factor(self) -> int | None:
        return self.inner.downsampling_factor

    def pixel_mask(self) -> Tensor | None:
        return self.inner.pixel_mask()

    def measured_frame(self, image_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        return self.inner.measured_frame(image_shape)

    def approximate_gram_eigenvalues(self, h: int, w: int) -> Tensor | None:
        """The inner operator's: the whitening weights are about 1 on average by construction (and
        an image's answer must not depend on its batch mates' weights)."""
        return self.inner.approximate_gram_eigenvalues(h, w)

    def norm_bound(self) -> float | Tensor:
        """The inner operator's bound times each image's largest squared weight, (B,)."""
        return self.inner.norm_bound() * self.weights.square().flatten(1).amax(1)

    def select_images(self, index: Tensor) -> "WeightedOperator":
        if self.weights.shape[0] == 1:
            return self
        return WeightedOperator(self.inner.select_images(index), self.weights[index])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inner": self.inner.describe()}

    def A_pinv(self, y: Tensor) -> Tensor:
        return self.inner.A_pinv(y / self.weights)

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        if self.inner.family not in ("inpaint", "denoise"):
            return super().prox(y, z, sigma_y, r, max_iter, tol)
        check_image(y, "y")
        check_image(z, "z")
        a = self.A(torch.ones_like(z))  # the diagonal: w * mask
        s2, r2 = prox_scales(sigma_y, r, z)
        return (a * y / s2 + z / r2) / (a.square() / s2 + 1 / r2)

    def A(self, x: Tensor) -> Tensor:
        return self.weights * self.inner.A(x)

    def A_adjoint(self, y: Tensor) -> Tensor:
        return self.inner.A_adjoint(self.weights * y)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.measurement_shape(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.image_shape(measurement_shape)

"""Restoring on a padded canvas: priors that need H, W to be multiples of 2^k."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from .base import LinearOperator


class CroppedOperator(LinearOperator):
    """A' x = A(x[..., :H, :W]) for x on a larger (H + ph, W + pw) canvas.

    The padded border is not measured: the sampler fills it from the prior, and the caller crops
    it off. Adjoint: zero-pad A^T y. The prox and pseudo-inverse fall back to the base class's
    conjugate gradients (the inner operator's closed forms do not survive the crop).

    Declared structure: the inner operator's family, channels, blur kernel and downsampling
    factor (what is applied to the image region); ``image_region()`` = (H, W). Not circulant and
    no pixel mask on the canvas (the crop is diagonal in neither basis), so no decomposition.
    """

    name = "cropped"

    def __init__(self, inner: LinearOperator, image_hw: Sequence[int], canvas_hw: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.h, self.w = (int(v) for v in image_hw)
        self.canvas_h, self.canvas_w = (int(v) for v in canvas_hw)
        if self.canvas_h < self.h or self.canvas_w < self.w:
            raise ValueError(f"canvas {tuple(canvas_hw)} is smaller than the image {tuple(image_hw)}")

    @property
    def family(self) -> str:
        return self.inner.family

    def blur_kernel(self) -> Tensor | None:
        return self.inner.blur_kernel()

    @property
    def downsampling_factor(self) -> int | None:
        return self.inner.downsampling_factor

    @property
    def image_channels(self) -> int | None:
        return self.inner.image_channels

    def image_region(self) -> tuple[int, int]:
        """(H, W) of the measured image in the top-left corner of the canvas."""
        return self.h, self.w

    def gram_eigenvalues(self, h: int, w: int) -> Tensor | None:
        """A'^T A' is A^T A on the image region and 0 on the padding: the inner operator's
        eigenvalues and one zero per padded pixel (per padded pixel and channel where the inner
        operator gives them for every channel)."""
        return self._with_padding(self.inner.gram_eigenvalues, h, w)

    def approximate_gram_eigenvalues(self, h: int, w: int) -> Tensor | None:
        """The inner operator's approximation and one zero per padded pixel."""
        return self._with_padding(self.inner.approximate_gram_eigenvalues, h, w)

    def _with_padding(self, inner_eigenvalues, h: int, w: int) -> Tensor | None:
        if (h, w) != (self.canvas_h, self.canvas_w):
            raise ValueError(f"this operator acts on a {self.canvas_h}x{self.canvas_w} canvas, not {h}x{w}")
        inner = inner_eigenvalues(self.h, self.w)
        if inner is None:
            return None
        channels = inner.numel() // (self.h * self.w)
        return torch.cat([inner, inner.new_zeros(channels * (h * w - self.h * self.w))])

    def norm_bound(self) -> float | Tensor:
        return self.inner.norm_bound()

    def select_images(self, index: Tensor) -> "CroppedOperator":
        inner = self.inner.select_images(index)
        return self if inner is self.inner else CroppedOperator(inner, (self.h, self.w), (self.canvas_h, self.canvas_w))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image_hw": [self.h, self.w], "canvas_hw": [self.canvas_h, self.canvas_w],
                "inner": self.inner.describe()}

    def A(self, x: Tensor) -> Tensor:
        return self.inner.A(x[..., : self.h, : self.w])

    def A_adjoint(self, y: Tensor) -> Tensor:
        z = self.inner.A_adjoint(y)
        return torch.nn.functional.pad(z, (0, self.canvas_w - self.w, 0, self.canvas_h - self.h))

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.measurement_shape((*image_shape[:-2], self.h, self.w))

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return (*self.inner.image_shape(measurement_shape)[:-2], self.canvas_h, self.canvas_w)


def padded_size(size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= size."""
    return -(-size // multiple) * multiple

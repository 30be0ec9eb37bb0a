"""Colorization: the measurement is the gray (luma) channel of an RGB image.

Per pixel y = w . x = sum_c w_c x_c, with fixed luma weights w (ITU-R BT.601: 0.299, 0.587,
0.114; they sum to 1, so a gray image keeps its level). A (B, 3, H, W) image gives a (B, 1, H, W)
measurement. Its singular decomposition is per pixel over the channels (one singular value ||w||,
two unobserved colour directions: :class:`~nfc_dps.operators.decomposition.ChannelDecomposition`),
so the pseudo-inverse (w y / ||w||^2) and the prox are closed form and DDRM takes it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from .base import LinearOperator, check_image
from .decomposition import ChannelDecomposition

__all__ = ["Colorization", "LUMA_WEIGHTS", "gray_measurement"]

#: ITU-R BT.601 luma weights of (R, G, B)
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


class Colorization(LinearOperator):
    """y = sum_c w_c x_c per pixel: RGB (B, 3, H, W) -> gray (B, 1, H, W).

    Args:
        weights: the three channel weights w, finite, >= 0, sum > 0 (default :data:`LUMA_WEIGHTS`).
    """

    name = "colorize"
    image_channels = 3

    def __init__(self, weights: Sequence[float] = LUMA_WEIGHTS) -> None:
        super().__init__()
        w = [float(v) for v in weights]
        if len(w) != 3 or not all(math.isfinite(v) and v >= 0 for v in w) or sum(w) <= 0:
            raise ValueError(f"weights must be three finite numbers >= 0 with a positive sum, got {tuple(weights)!r}")
        self.register_buffer("weights", torch.tensor(w, dtype=torch.float64))
        self._decomposition = ChannelDecomposition(self.weights[None].numpy())  # built once, on the CPU weights

    def extra_repr(self) -> str:
        return f"weights={tuple(self.weights.tolist())}"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "weights": self.weights.tolist()}

    def decomposition(self) -> ChannelDecomposition:
        return self._decomposition

    def _w(self, like: Tensor) -> Tensor:
        return self.weights.to(dtype=like.dtype, device=like.device).view(1, 3, 1, 1)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        if len(image_shape) != 4 or image_shape[1] != 3:
            raise ValueError(f"colorization takes RGB images (B, 3, H, W), got shape {tuple(image_shape)}")
        return (image_shape[0], 1, *image_shape[2:])

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        if len(measurement_shape) != 4 or measurement_shape[1] != 1:
            raise ValueError(f"a colorization measurement is gray (B, 1, H, W), got shape {tuple(measurement_shape)}")
        return (measurement_shape[0], 3, *measurement_shape[2:])

    def A(self, x: Tensor) -> Tensor:
        check_image(x, "x")
        self.measurement_shape(x.shape)
        return (x * self._w(x)).sum(1, keepdim=True)

    def A_adjoint(self, y: Tensor) -> Tensor:
        check_image(y, "y")
        self.image_shape(y.shape)
        return y * self._w(y)


#: the most two channels of an RGB colorize input may differ and still be one gray (JPEG rounding)
GRAY_TOLERANCE = 2 / 255


def gray_measurement(image: np.ndarray, name: str) -> np.ndarray:
    """The gray (h, w) measurement of colorization in a file's ``image`` ((h, w) or (h, w, C)): a
    gray image, or an RGB one whose three channels are equal (a scanned black-and-white photo, a
    palette PNG), as its luma. ValueError naming ``name`` for a colour image."""
    if image.ndim == 2:
        return image
    spread = float(np.ptp(image, axis=-1).max()) if image.shape[-1] == 3 else None
    if spread is None or spread > GRAY_TOLERANCE:
        what = "a colour image (its red, green and blue differ)" if spread is not None else \
            f"a {image.shape[-1]}-channel image"
        raise ValueError(f"{name} is {what}: --task colorize restores the colours of a gray photo; pass gray "
                         f"images (or RGB ones whose three channels are equal)")
    return np.ascontiguousarray(image @ np.asarray(LUMA_WEIGHTS, image.dtype))

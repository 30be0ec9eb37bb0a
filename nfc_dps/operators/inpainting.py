"""Inpainting: A x = mask * x with a binary (H, W) mask shared by all channels.

mask = 1: pixel observed, 0: missing. The measurement keeps the image's size and is **zero
outside the mask**: ``measure`` adds noise to the observed pixels only (y = mask * (x + noise)),
unlike DPS, which adds noise everywhere (harmless for A^T, but it inflates ||y - A x||). The
operator is a diagonal projection: A = A^T = A^+, and the prox is elementwise (its
decomposition is the pixel basis).

Mask makers return float32 (H, W) tensors; their randomness comes only from ``generator``
(a torch.Generator or an int seed), never from a global RNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from .base import LinearOperator, check_image
from .decomposition import PixelDecomposition
from .kernels import read_array, squeeze_to_2d

__all__ = ["Inpainting", "box_mask", "random_mask", "load_mask"]


def _torch_generator(generator: torch.Generator | int) -> torch.Generator:
    if isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"generator seed must be >= 0, got {generator}")
        return torch.Generator().manual_seed(int(generator))
    raise TypeError(f"generator must be a torch.Generator or an int seed, got {type(generator).__name__}")


def _check_hw(h: int, w: int) -> tuple[int, int]:
    for name, v in (("h", h), ("w", w)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return int(h), int(w)


def _pair(v: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(u, (int, np.integer)) for u in v):
        return int(v[0]), int(v[1])
    raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")


def box_mask(h: int, w: int, box_size: int | Sequence[int] = 128, margin: int | Sequence[int] = 16,
             generator: torch.Generator | int = 0) -> Tensor:
    """(h, w) mask, 0 inside one box_size box (int or (bh, bw)) at a random position, 1 elsewhere.

    As DPS/DAPS: top-left row uniform in [margin, h - margin - bh) (columns likewise). When the
    margins do not leave room (small images), they shrink to (h - bh) // 2 and the range to at
    least one position. Raises ValueError if the box itself does not fit in the image.
    """
    h, w = _check_hw(h, w)
    bh, bw = _pair(box_size, "box_size")
    mh, mw = _pair(margin, "margin")
    if bh < 1 or bw < 1:
        raise ValueError(f"box_size must be positive, got {box_size!r}")
    if mh < 0 or mw < 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    if bh > h or bw > w:
        raise ValueError(f"box_size {box_size!r} does not fit in an image of size {h}x{w}")
    gen = _torch_generator(generator)
    starts = []
    for n, b, m in ((h, bh, mh), (w, bw, mw)):
        m = min(m, (n - b) // 2)
        lo, hi = m, max(n - m - b, m + 1)
        starts.append(int(torch.randint(lo, hi, (1,), generator=gen).item()))
    mask = torch.ones(h, w, dtype=torch.float32)
    mask[starts[0]: starts[0] + bh, starts[1]: starts[1] + bw] = 0
    return mask


def random_mask(h: int, w: int, missing_fraction: float = 0.7, generator: torch.Generator | int = 0) -> Tensor:
    """(h, w) mask with exactly round(h * w * missing_fraction) pixels missing (0), drawn
    uniformly without replacement; the rest observed (1)."""
    h, w = _check_hw(h, w)
    if not (isinstance(missing_fraction, (int, float, np.floating, np.integer)) and 0 <= missing_fraction <= 1):
        raise ValueError(f"missing_fraction must be a number in [0, 1], got {missing_fraction!r}")
    gen = _torch_generator(generator)
    n_missing = int(round(h * w * float(missing_fraction)))
    mask = torch.ones(h * w, dtype=torch.float32)
    mask[torch.randperm(h * w, generator=gen)[:n_missing]] = 0
    return mask.view(h, w)


def load_mask(path: str | Path) -> Tensor:
    """Mask from an image (white/bright = observed, black = missing; threshold at half range, so
    JPEG noise does not matter) or a .npy array (nonzero = observed). Returns float32 (H, W);
    ValueError naming the file for a mask that observes no pixel."""
    arr = squeeze_to_2d(read_array(path, "mask"))
    if arr.ndim != 2:
        raise ValueError(f"mask file {str(path)!r} must hold a 2-D (H, W) mask, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"mask file {str(path)!r} contains NaN or Inf")
    observed = arr != 0 if Path(path).suffix.lower() == ".npy" else arr > 0.5
    if not observed.any():
        raise ValueError(f"mask file {str(path)!r} observes no pixel (all black; white = observed, black = "
                         f"missing): there is nothing to restore from. An inverted mask? Make the pixels the "
                         f"measurement holds white")
    return torch.from_numpy(observed.astype(np.float32))


class Inpainting(LinearOperator):
    """A x = mask * x, mask (H, W) or (1, 1, H, W) with 1 = observed, 0 = missing."""

    name = "inpainting"
    family = "inpaint"

    def __init__(self, mask: Tensor | np.ndarray) -> None:
        super().__init__()
        m = torch.as_tensor(np.asarray(mask) if not isinstance(mask, Tensor) else mask).detach()
        if m.ndim == 4 and m.shape[:2] == (1, 1):
            m = m[0, 0]
        if m.ndim != 2:
            raise ValueError(f"mask must have shape (H, W) or (1, 1, H, W), got {tuple(m.shape)}")
        m = m.to(torch.float64)
        if not bool(torch.isfinite(m).all()):
            raise ValueError("mask contains NaN or Inf")
        bad = (m != 0) & (m != 1)
        if bool(bad.any()):
            raise ValueError(f"mask must be binary (1 = observed, 0 = missing), found value {m[bad][0].item()!r}")
        self.register_buffer("mask", m.to(torch.float32)[None, None])

    def extra_repr(self) -> str:
        return f"size={tuple(self.mask.shape[-2:])}, observed={self.mask.mean().item():.3f}"

    def pixel_mask(self) -> Tensor:
        """The (H, W) float32 mask (a view of the (1, 1, H, W) ``mask`` buffer)."""
        return self.mask[0, 0]

    def decomposition(self) -> PixelDecomposition:
        """The pixel basis, d = the mask: the prox is elementwise, A^+ = A."""
        return PixelDecomposition(self.mask[0, 0])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "size": list(self.mask.shape[-2:]),
                "observed_fraction": float(self.mask.mean())}

    def _m(self, x: Tensor, name: str) -> Tensor:
        check_image(x, name)
        if x.shape[-2:] != self.mask.shape[-2:]:
            raise ValueError(f"{name} has spatial size {tuple(x.shape[-2:])} but the mask is {tuple(self.mask.shape[-2:])}")
        return self.mask.to(dtype=x.dtype, device=x.device)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(measurement_shape)

    def A(self, x: Tensor) -> Tensor:
        return self._m(x, "x") * x

    def A_adjoint(self, y: Tensor) -> Tensor:
        return self._m(y, "y") * y

    def normal(self, x: Tensor) -> Tensor:
        return self._m(x, "x") * x

    def measure(self, x: Tensor, sigma_y: float | Tensor | None = None, generator=None, *, noise=None) -> Tensor:
        """mask * (x + noise): noise on the observed pixels only, y = 0 elsewhere. The noise is
        drawn on the full grid (same draws as the base class), then masked."""
        y = super().measure(x, sigma_y, generator, noise=noise)
        return self._m(y, "y") * y

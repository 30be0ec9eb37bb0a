"""A decoded image file: its pixels, turned upright and split from their alpha, and what was learnt
about the file (:class:`ImageInfo`); the errors of reading one (:class:`ImageReadError`). The
readers (:mod:`.images`, :mod:`.tiff`) build on this module."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class ImageReadError(ValueError):
    """An image file could not be read; the message starts with the file's path."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


@dataclass
class ImageInfo:
    """What :func:`read_image` learnt about a file besides its pixels.

    bit_depth: bits per sample in the file (1, 8, 16, or 32 for float TIFFs).
    mode: Pillow's mode of the file ("L", "RGB", "RGBA", "I;16", ...; "RGB;16"/"RGBA;16"/"LA;16"
        for 16-bit colour PNGs decoded here). format: "PNG", "JPEG", "TIFF" or "BMP".
    alpha: the alpha channel, float32 (H, W) in [0, 1], or None.
    orientation: the EXIF orientation tag (1 = upright) that was applied.
    pages: pages (multi-page TIFF) or frames (animated PNG) in the file; only the first is read.
    """

    path: str
    format: str
    mode: str
    bit_depth: int
    shape: tuple[int, ...]
    alpha: np.ndarray | None = field(default=None, repr=False)
    orientation: int = 1
    pages: int = 1

    @property
    def has_alpha(self) -> bool:
        return self.alpha is not None

    @property
    def channels(self) -> int:
        """Colour channels of the returned array (1 or 3), alpha not counted."""
        return 1 if len(self.shape) == 2 else self.shape[2]

    @property
    def output_bit_depth(self) -> int:
        """8 or 16: the integer depth that keeps this file's precision when written back."""
        return 16 if self.bit_depth > 8 else 8

    def describe(self) -> dict[str, Any]:
        return {"format": self.format, "mode": self.mode, "bit_depth": self.bit_depth,
                "size": list(self.shape[:2]), "channels": self.channels, "alpha": self.has_alpha,
                "orientation": self.orientation}


def _orient(a: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF orientation to an (H, W[, C]) array, as PIL.ImageOps.exif_transpose does."""
    if orientation == 2:
        a = a[:, ::-1]
    elif orientation == 3:
        a = a[::-1, ::-1]
    elif orientation == 4:
        a = a[::-1]
    elif orientation == 5:
        a = a.swapaxes(0, 1)
    elif orientation == 6:
        a = np.rot90(a, -1)
    elif orientation == 7:
        a = a.swapaxes(0, 1)[::-1, ::-1]
    elif orientation == 8:
        a = np.rot90(a, 1)
    return np.ascontiguousarray(a)


def split_decoded(path: Path, fmt: str, mode: str, bits: int, arr: np.ndarray, orientation: int,
           has_alpha: bool, pending: int | None = None) -> tuple[np.ndarray, ImageInfo]:
    """arr: float (H, W, C) with C in 1..4 already in [0, 1] -> colour array + info. The file's
    ``orientation`` is recorded; ``pending`` (default: the same) is what is still to be applied
    to ``arr`` (Pillow turns TIFFs itself when it loads them)."""
    arr = _orient(arr, orientation if pending is None else pending)
    alpha = None
    if has_alpha:
        alpha = np.ascontiguousarray(arr[..., -1], dtype=np.float32)
        arr = arr[..., :-1]
    arr = np.ascontiguousarray(arr[..., 0] if arr.shape[-1] == 1 else arr, dtype=np.float32)
    if arr.size == 0:
        raise ImageReadError(path, "image has no pixels")
    return arr, ImageInfo(str(path), fmt, mode, bits, tuple(arr.shape), alpha, orientation)

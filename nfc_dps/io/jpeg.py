"""JPEG files as measurements: their quantisation tables, chroma subsampling and stored integers.

* :func:`read_jpeg`: a JPEG file's pixels as Pillow decodes them, its tables (natural order) and
  subsampling (:class:`JpegFile`); a file that is no JPEG, a CMYK or RGB-stored JPEG, or an unknown
  subsampling is a ValueError naming the file.
* :func:`decoded_planes`: the planes the encoder saw, as far as the decoded pixels tell (the file's
  measurement is :func:`nfc_dps.operators.jpeg.jpeg_measurement`).
* :func:`write_jpeg` (a real JPEG at quality Q, 4:2:0 by default) and :func:`quality_tables`.

Pillow decodes with libjpeg-turbo, which upsamples subsampled chroma by a triangle filter ("fancy
upsampling", weights 3/4 and 1/4 along each subsampled axis); its least-squares inverse gives back the
stored chroma samples. The EXIF orientation is recorded, not applied: the stored blocks are on the
file's own grid.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from PIL import Image, JpegImagePlugin, UnidentifiedImageError, features
from torch import Tensor

from . import files
from .images import ImageReadError, _exif_orientation, quantize

__all__ = ["JpegFile", "read_jpeg", "decoded_planes", "write_jpeg", "quality_tables", "SUBSAMPLINGS", "RGB_TO_YCBCR"]

#: chroma subsampling -> (vertical, horizontal) factor of the two chroma planes
SUBSAMPLINGS = {"4:4:4": (1, 1), "4:2:2": (1, 2), "4:2:0": (2, 2)}
#: JFIF's RGB -> YCbCr matrix (rows Y, Cb, Cr; the file adds 128/255 to Cb and Cr, which A leaves out)
RGB_TO_YCBCR = ((0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
#: PIL.JpegImagePlugin.get_sampling's codes
_SAMPLING_NAMES = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}


@dataclass
class JpegFile:
    """What :func:`read_jpeg` reads.

    pixels: uint8 (H, W) or (H, W, 3), as Pillow decodes them, on the file's grid (no EXIF turn).
    tables: one (8, 8) int array per plane (Y, Cb, Cr; one for gray), natural (row-major) order,
        0-255 units. subsampling: "4:2:0", "4:2:2" or "4:4:4" ("4:4:4" for gray).
    progressive: the file is progressive. orientation: its EXIF orientation tag (1 = upright).
    """

    path: str
    pixels: np.ndarray
    tables: tuple[np.ndarray, ...]
    subsampling: str
    progressive: bool = False
    orientation: int = 1

    @property
    def channels(self) -> int:
        return 1 if self.pixels.ndim == 2 else 3


def read_jpeg(path: str | Path) -> JpegFile:
    """Read a baseline or progressive JPEG (gray or YCbCr colour) with its tables and subsampling.

    Raises :class:`~nfc_dps.io.ImageReadError` (a ValueError naming the file, saying what to do) for
    a missing or unreadable file, a file that is not a JPEG, a CMYK or RGB-stored JPEG, or a chroma
    subsampling other than 4:4:4, 4:2:2 and 4:2:0.
    """
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(path, "no such file" if not path.exists() else "is not a file")
    try:
        im = Image.open(path)
    except UnidentifiedImageError as e:
        raise ImageReadError(path, "not a readable image; the jpeg task reads JPEG files as a camera or "
                                   "encoder wrote them") from e
    except OSError as e:
        raise ImageReadError(path, f"cannot read: {e}") from e
    with im:
        if im.format not in ("JPEG", "MPO"):
            raise ImageReadError(path, f"is a {im.format} file, not a JPEG: the jpeg task restores a JPEG "
                                       f"from the quantisation tables in the file, which a {im.format} does "
                                       f"not keep; pass the original .jpg")
        if im.mode not in ("L", "RGB"):
            raise ImageReadError(path, f"is a {im.mode} JPEG; the jpeg task reads gray and YCbCr colour "
                                       f"JPEGs (a camera's or a web photo's), not {im.mode} ones (print "
                                       f"files): restore an RGB JPEG of it instead")
        if im.mode == "RGB" and im.info.get("adobe_transform") == 0:
            raise ImageReadError(path, "stores its colour as RGB, not YCbCr (an Adobe JPEG without colour "
                                       "transform); the jpeg task reads YCbCr JPEGs")
        layers = getattr(im, "layer", [])
        tables_by_id = {int(k): np.asarray(list(v), dtype=np.int64).reshape(8, 8)
                        for k, v in getattr(im, "quantization", {}).items()}
        try:
            tables = tuple(tables_by_id[int(layer[3])] for layer in layers)
        except (KeyError, IndexError, TypeError):
            tables = ()
        if len(tables) != (1 if im.mode == "L" else 3) or any(t.size != 64 for t in tables):
            raise ImageReadError(path, f"its quantisation tables could not be read (components {layers!r}, "
                                       f"tables {sorted(tables_by_id)})")
        if im.mode == "L":
            subsampling = "4:4:4"
        else:
            code = JpegImagePlugin.get_sampling(im)
            if code not in _SAMPLING_NAMES:
                raise ImageReadError(path, f"its chroma subsampling (components {layers!r}) is none of "
                                           f"{', '.join(_SAMPLING_NAMES.values())}; re-encode it with one of those")
            subsampling = _SAMPLING_NAMES[code]
        progressive = bool(im.info.get("progressive") or im.info.get("progression"))
        orientation = _exif_orientation(im)
        try:
            im.load()
        except OSError as e:
            raise ImageReadError(path, f"corrupt or truncated JPEG ({e})") from e
        pixels = np.asarray(im, dtype=np.uint8).copy()
    return JpegFile(str(path), pixels, tables, subsampling, progressive, orientation)


def decoded_planes(jf: JpegFile) -> list[Tensor]:
    """The planes the file's encoder saw, as far as the decoded pixels tell: full-resolution linear
    YCbCr (chroma offsets removed), float64; a subsampled chroma plane is the least-squares inverse of
    the decoder's upsampling, repeated over its 2x2 (or 2x1) pixels. Gray: one (1, 1, H, W) plane."""
    a = jf.pixels.astype(np.float64) / 255.0
    if a.ndim == 2:
        return [torch.from_numpy(a)[None, None]]
    ycc = np.einsum("pc,hwc->phw", np.asarray(RGB_TO_YCBCR), a)
    h, w = a.shape[:2]
    sv, sh = SUBSAMPLINGS[jf.subsampling]
    planes = [ycc[0]]
    fancy = features.check_feature("libjpeg_turbo") and -(-w // sh) > 2
    for chroma in ycc[1:]:
        if (sv, sh) != (1, 1):
            low = _unupsample(chroma, sv, sh, fancy)
            chroma = low.repeat(sv, 0).repeat(sh, 1)[:h, :w]
        planes.append(chroma)
    return [torch.from_numpy(np.ascontiguousarray(p))[None] for p in planes]


def _upsampling_matrix(n: int, factor: int, fancy: bool) -> scipy.sparse.csr_matrix:
    """(n, ceil(n / factor)) libjpeg-turbo's upsampling of one axis: sample i to pixels 2i and 2i + 1
    with weights 3/4 on it and 1/4 on its neighbour on that side (the edge sample repeated) when
    ``fancy``, else repeated; factor 1: the identity."""
    nc = -(-n // factor)
    if factor == 1:
        return scipy.sparse.identity(n, format="csr")
    rows, cols, vals = [], [], []
    for o in range(n):
        i = o // 2
        if fancy:
            other = max(i - 1, 0) if o % 2 == 0 else min(i + 1, nc - 1)
            rows += [o, o]
            cols += [i, other]
            vals += [0.75, 0.25]
        else:
            rows.append(o)
            cols.append(i)
            vals.append(1.0)
    return scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(n, nc))


def _unupsample(plane: np.ndarray, sv: int, sh: int, fancy: bool) -> np.ndarray:
    """The (ceil(H / sv), ceil(W / sh)) samples whose upsampling is nearest to ``plane`` (H, W) in
    least squares (per axis: the upsampling is separable)."""
    out = plane
    for axis, factor in ((0, sv), (1, sh)):
        if factor == 1:
            continue
        u = _upsampling_matrix(plane.shape[axis], factor, fancy)
        solve = scipy.sparse.linalg.splu((u.T @ u).tocsc()).solve
        moved = np.moveaxis(out, axis, 0)
        out = np.moveaxis(solve(np.ascontiguousarray(u.T @ moved)), 0, axis)
    return out


def write_jpeg(path: str | Path, image: np.ndarray, quality: int, subsampling: str = "4:2:0",
               progressive: bool = False) -> Path:
    """Write ``image`` ((H, W) gray or (H, W, 3) RGB, float in [0, 1] or uint8) as a JPEG at Pillow's
    ``quality`` (1-100) with ``subsampling`` ("4:2:0", "4:2:2", "4:4:4"; colour only), atomically."""
    path = Path(path)
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
        raise ValueError(f"{path}: quality must be an int in 1..100, got {quality!r}")
    if subsampling not in SUBSAMPLINGS:
        raise ValueError(f"{path}: subsampling must be one of {tuple(SUBSAMPLINGS)}, got {subsampling!r}")
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3):
        raise ValueError(f"{path}: a JPEG holds (H, W) gray or (H, W, 3) RGB images, got shape {a.shape}")
    q = a if a.dtype == np.uint8 else quantize(a)
    buf = io.BytesIO()
    Image.fromarray(q).save(buf, format="JPEG", quality=int(quality), progressive=progressive,
                            subsampling=subsampling if q.ndim == 3 else 0)
    return files.atomic_write_bytes(path, buf.getvalue())


@lru_cache(maxsize=None)
def quality_tables(quality: int) -> tuple[np.ndarray, np.ndarray]:
    """The (luma, chroma) (8, 8) tables Pillow writes at ``quality``, natural order, 0-255 units."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="JPEG", quality=int(quality))
    with Image.open(buf) as im:
        tables = im.quantization
        return tuple(np.asarray(list(tables[i]), dtype=np.int64).reshape(8, 8) for i in (0, 1))

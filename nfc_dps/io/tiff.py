"""TIFF files that Pillow cannot read as they are, and measurements written as float TIFFs.

* :func:`read_deep_tiff`: 16-bit colour, 16-bit gray turned by its orientation tag, 16-bit gray +
  alpha and float colour TIFFs, read with tifffile (whose LZW and other codecs are imagecodecs').
* :func:`quiet_third_party`: reads a file without tifffile's log records, Python warnings or
  libtiff's stderr, keeping their first line as the detail of an :class:`ImageReadError`.
* :func:`write_measurement`: a measurement of any finite values, written exactly as a float32 TIFF.

:func:`nfc_dps.io.images.read_image` is the entry point for reading and calls the first two. This
module uses :mod:`.decoded`'s types.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from . import files
from .decoded import ImageInfo, ImageReadError, split_decoded

# --------------------------------------------------------------------------------------------
# reading


def read_deep_tiff(path: Path, mode: str, orientation: int | None, any_range: bool = False) -> tuple[np.ndarray, ImageInfo]:
    """TIFFs Pillow reduces to 8 bits (16-bit colour), garbles (16-bit gray turned by its orientation
    tag) or does not open (16-bit gray + alpha, float colour), read with tifffile from the first page's own tags:
    planar or interleaved samples,
    extra samples (associated alpha is divided out, as Pillow does for 8-bit files; unspecified
    ones are dropped), "min is white" gray inverted. ``orientation`` None: the page's tag 274."""
    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages[0]
            raw = page.asarray()
            planar = int(page.planarconfig) == 2
            extras = [int(e) for e in page.extrasamples]  # 0 unspecified, 1 associated alpha, 2 unassociated
            photometric = int(page.photometric)
            if orientation is None:
                tag = page.tags.get(274)
                orientation = int(tag.value) if tag is not None else 1
    except (tifffile.TiffFileError, ValueError, OSError, IndexError) as e:
        if "imagecodecs" in str(e):  # tifffile's codecs (LZW, JPEG, ...) are imagecodecs': one it lacks
            raise ImageReadError(path, f"this {mode} TIFF is read with tifffile, and its compression needs a "
                                       f"codec the installed imagecodecs package lacks ({e}): pip install "
                                       f"imagecodecs (a full build), or save it uncompressed or with deflate") from e
        raise ImageReadError(path, f"not a readable image (corrupt TIFF: {e})") from e
    if raw.size == 0:
        raise ImageReadError(path, "not a readable image (corrupt TIFF: no pixel data)")
    if raw.ndim == 3 and planar:
        raw = np.moveaxis(raw, 0, -1)
    if raw.ndim == 2:
        raw = raw[..., None]
    colour = raw.shape[-1] - len(extras) if raw.ndim == 3 else 0
    if colour not in (1, 3):
        raise ImageReadError(path, f"unsupported TIFF layout {raw.shape} ({len(extras)} extra sample(s))")
    if raw.dtype == np.uint16:
        arr, bits = raw.astype(np.float32) / 65535.0, 16
    elif raw.dtype == np.uint8:
        arr, bits = raw.astype(np.float32) / 255.0, 8
    elif raw.dtype.kind == "f":
        arr, bits = raw.astype(np.float32), 32
        if not np.isfinite(arr).all() or ((arr.min() < 0 or arr.max() > 1) and not any_range):
            raise ImageReadError(path, "float image values must be finite and lie in [0, 1]")
    else:
        raise ImageReadError(path, f"unsupported TIFF sample type {raw.dtype}")
    alpha_at = next((colour + i for i, e in enumerate(extras) if e in (1, 2)), None)
    pixels = arr[..., :colour]
    if photometric == 0 and colour == 1:
        pixels = 1.0 - pixels
    if alpha_at is not None:
        alpha = arr[..., alpha_at:alpha_at + 1]
        if extras[alpha_at - colour] == 1:  # premultiplied colour: straight colour, as Pillow returns it
            pixels = np.where(alpha > 0, np.clip(pixels / np.maximum(alpha, 1e-12), 0, 1), 0.0)
        pixels = np.concatenate([pixels, alpha], -1)
    label = ("LA" if colour == 1 else "RGBA") if alpha_at is not None else ("L" if colour == 1 else "RGB")
    return split_decoded(path, "TIFF", f"{label};{bits}" if bits != 8 else label, bits, pixels.astype(np.float32),
                  orientation, alpha_at is not None)


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.lines.append(record.getMessage())


@contextlib.contextmanager
def quiet_third_party(path: Path, tiff: bool):
    """Read a file without tifffile's log records, Python warnings, or (``tiff``) what libtiff writes
    to the process's stderr: a broken TIFF printed a dozen such lines before our one. An
    :class:`ImageReadError` raised inside gets the first of them as its detail."""
    lines: list[str] = []
    logger = logging.getLogger("tifffile")
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers[:] = [_Collect(lines)]
    logger.propagate = False
    saved_fd, captured = None, None
    if tiff:  # libtiff (through Pillow) writes to file descriptor 2 itself
        try:
            sys.stderr.flush()
            captured = tempfile.TemporaryFile()
            saved_fd = os.dup(2)
            os.dup2(captured.fileno(), 2)
        except (OSError, ValueError, AttributeError):
            saved_fd = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                lines.extend(str(w.message) for w in caught)
    except ImageReadError as e:
        raise _with_detail(e, lines, saved_fd, captured) from e.__cause__
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised naming the file, with the third party's first line
        raise _with_detail(ImageReadError(path, f"corrupt or unreadable image ({type(e).__name__}: {e})"),
                           lines, saved_fd, captured) from e
    finally:
        logger.handlers[:] = handlers
        logger.propagate = propagate
        _restore_stderr(saved_fd, captured, lines)


def _restore_stderr(saved_fd: int | None, captured: Any, lines: list[str]) -> None:
    """Put file descriptor 2 back (once) and add what was written to it to ``lines``."""
    if saved_fd is None or captured is None or captured.closed:
        return
    os.dup2(saved_fd, 2)
    os.close(saved_fd)
    captured.seek(0)
    lines.extend(line.strip() for line in captured.read().decode("utf-8", "replace").splitlines() if line.strip())
    captured.close()


def _with_detail(error: ImageReadError, lines: list[str], saved_fd: int | None, captured: Any) -> ImageReadError:
    _restore_stderr(saved_fd, captured, lines)
    detail = next((line for line in lines if line not in error.reason), None)
    return ImageReadError(error.path, f"{error.reason}; {detail}") if detail else error


# --------------------------------------------------------------------------------------------
# writing


def write_measurement(path: str | Path, array: np.ndarray) -> Path:
    """Write a measurement of any finite values, (H, W) or (H, W, 3), exactly: a float32 TIFF
    (``path`` must end in .tif or .tiff), atomically; :func:`read_image` with ``any_range`` reads it."""
    path = Path(path)
    if path.suffix.lower() not in (".tif", ".tiff"):
        raise ValueError(f"{path}: a measurement outside [0, 1] is written as a float TIFF (.tif)")
    arr = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise FloatingPointError(f"{path}: the measurement holds NaN or Inf; not written")
    buf = io.BytesIO()
    tifffile.imwrite(buf, arr, photometric="rgb" if arr.ndim == 3 else "minisblack")
    return files.atomic_write_bytes(path, buf.getvalue())

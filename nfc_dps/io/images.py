"""Reading and writing image files.

Images are float32 numpy arrays in [0, 1]: (H, W) for gray, (H, W, 3) for colour. An alpha
channel is never part of the array: :func:`read_image` sets it aside in the returned
:class:`ImageInfo` and :func:`write_image` re-attaches it on request.

* Formats: PNG, JPEG, TIFF, BMP; 1-, 8- and 16-bit integer images and [0, 1] float TIFFs; gray,
  gray + alpha, palette, RGB, RGBA (CMYK / YCbCr are converted to RGB). Pillow truncates 16-bit
  colour PNGs and TIFFs to 8 bits, so those are read and written with imagecodecs (PNG, libpng)
  or tifffile (TIFF, whose LZW and other codecs are imagecodecs'; :mod:`.tiff`).
* EXIF orientation is applied (``PIL.ImageOps.exif_transpose``), so arrays are upright.
* Values are never min-max rescaled: writing clips to [0, 1] and rounds to the bit depth.
* Writes are atomic (:func:`nfc_dps.io.files.atomic_write_bytes`).
* Errors name the file: :class:`ImageReadError` for missing, empty, corrupt or unsupported files.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from PIL import Image, PngImagePlugin, UnidentifiedImageError

from . import files
from .decoded import ImageInfo, ImageReadError, split_decoded
from .tiff import quiet_third_party, read_deep_tiff

#: file extensions read_image accepts (lower case)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
#: integer image dtypes taken as [0, 1] images (by write_image and restore), and the value that maps to 1.0
INTEGER_SCALES = {"uint8": 255.0, "uint16": 65535.0}
#: Pillow format names accepted (the file's content decides, not its extension)
_FORMATS = {"PNG", "JPEG", "MPO", "TIFF", "BMP", "DIB"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the first bytes of a TIFF (classic and BigTIFF, little and big endian)
_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


# --------------------------------------------------------------------------------------------
# reading


def read_image(path: str | Path, any_range: bool = False) -> tuple[np.ndarray, ImageInfo]:
    """Read an image as float32 (H, W) or (H, W, 3) in [0, 1], plus its :class:`ImageInfo`.

    ``any_range``: a float TIFF's values may be any finite numbers (a measurement that leaves
    [0, 1]: Poisson counts / peak, Fourier amplitudes; :func:`.tiff.write_measurement` writes them).

    Raises :class:`ImageReadError` (a ValueError naming the file) for a missing, empty, corrupt
    or unsupported file.
    """
    path = Path(path)
    if not path.exists():
        raise ImageReadError(path, "no such file")
    if path.is_dir():
        raise ImageReadError(path, "is a folder, not an image file")
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        raise ImageReadError(path, f"unsupported file type {path.suffix or '(no extension)'!r}; "
                                   f"supported: {', '.join(IMAGE_EXTENSIONS)}")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ImageReadError(path, f"cannot read: {e.strerror or e}") from e
    if size == 0:
        raise ImageReadError(path, "empty file (0 bytes)")
    try:
        with open(path, "rb") as f:
            head = f.read(33)
    except OSError as e:
        raise ImageReadError(path, f"cannot read: {e.strerror or e}") from e
    try:
        if head[:8] == _PNG_SIGNATURE and len(head) >= 33 and head[12:16] == b"IHDR":
            bit_depth, colour_type = head[24], head[25]
            if bit_depth == 16 and colour_type in (2, 4, 6):
                return _read_png16(path, head)
        with quiet_third_party(path, head[:4] in _TIFF_SIGNATURES):
            arr, info = _read_pillow(path, any_range)
            info.pages = _page_count(path)
        return arr, info
    except ImageReadError:
        raise
    except MemoryError as e:
        raise ImageReadError(path, "image too large to load into memory") from e
    except Exception as e:  # noqa: BLE001 - decoder errors of every kind, re-raised naming the file
        raise ImageReadError(path, f"corrupt or unreadable image ({type(e).__name__}: {e})") from e


def _page_count(path: Path) -> int:
    """Pages or frames in an image file (1 when the format has none or the count cannot be read)."""
    try:
        with Image.open(path) as im:
            return max(int(getattr(im, "n_frames", 1)), 1)
    except Exception:  # noqa: BLE001 - the pixels were read; the count is only for a note
        return 1


def _exif_orientation(im) -> int:
    try:
        value = int(im.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block must not make the image unreadable
        return 1
    return value if 1 <= value <= 8 else 1


def _read_pillow(path: Path, any_range: bool = False) -> tuple[np.ndarray, ImageInfo]:
    try:
        im = Image.open(path)
    except UnidentifiedImageError as e:
        if path.suffix.lower() in (".tif", ".tiff"):  # layouts Pillow does not open (16-bit gray + alpha, float RGB)
            return read_deep_tiff(path, "TIFF", None, any_range)
        raise ImageReadError(path, "not a readable image (corrupt, or not a PNG/JPEG/TIFF/BMP file)") from e
    with im:
        fmt = im.format or "?"
        if fmt not in _FORMATS:
            raise ImageReadError(path, f"unsupported image format {fmt}; supported: PNG, JPEG, TIFF, BMP")
        fmt = {"MPO": "JPEG", "DIB": "BMP"}.get(fmt, fmt)
        before_load = _exif_orientation(im)
        if fmt == "TIFF":
            bits = im.tag_v2.get(258, (8,))
            bits = bits if isinstance(bits, tuple) else (bits,)
            # 16-bit colour: Pillow would reduce it to 8 bits; 16-bit gray turned by the orientation
            # tag: Pillow, which turns TIFFs as it loads them, garbles a quarter turn of those. Both
            # are read as stored, then turned here.
            turned_gray = before_load != 1 and im.tag_v2.get(262) in (0, 1)
            if max(bits) > 8 and (im.mode in ("RGB", "RGBA", "LA", "RGBX") or turned_gray):
                return read_deep_tiff(path, im.mode, before_load)
        try:
            im.load()
        except OSError as e:
            raise ImageReadError(path, f"corrupt or truncated image ({e})") from e
        # what is left to apply: a TIFF of another kind is turned by Pillow as it loads (the tag is
        # dropped); a PNG's eXIf chunk after the pixels is known only once they are loaded
        pending = _exif_orientation(im)
        orientation = before_load if before_load != 1 else pending
        mode = im.mode
        if mode == "1":
            arr, bits = np.asarray(im.convert("L"), np.float32)[..., None] / 255.0, 1
            return split_decoded(path, fmt, mode, bits, arr, orientation, False, pending)
        if mode in ("I;16", "I;16L", "I;16B", "I;16N"):
            arr = np.asarray(im).astype(np.float32)[..., None] / 65535.0
            if fmt == "TIFF" and im.tag_v2.get(262) == 0:  # "min is white" (Pillow inverts only 8-bit ones)
                arr = 1.0 - arr
            return split_decoded(path, fmt, mode, 16, arr, orientation, False, pending)
        if mode == "I":
            raw = np.asarray(im)
            if raw.size and (raw.min() < 0 or raw.max() > 65535):
                raise ImageReadError(path, "unsupported 32-bit integer image (values outside 0..65535)")
            return split_decoded(path, fmt, mode, 16, raw.astype(np.float32)[..., None] / 65535.0, orientation, False,
                          pending)
        if mode == "F":
            raw = np.asarray(im, dtype=np.float32)
            if not np.isfinite(raw).all():
                raise ImageReadError(path, "float image contains NaN or Inf")
            if raw.size and (raw.min() < 0 or raw.max() > 1) and not any_range:
                raise ImageReadError(path, f"float image values must lie in [0, 1], found [{raw.min():g}, {raw.max():g}]")
            return split_decoded(path, fmt, mode, 32, raw[..., None], orientation, False, pending)
        if mode in ("L", "LA", "La"):
            target = "LA" if mode != "L" else "L"
        elif mode in ("P", "PA"):
            target = "RGBA" if (mode == "PA" or "transparency" in im.info) else "RGB"
        elif mode in ("RGBA", "RGBa"):
            target = "RGBA"
        else:  # RGB, RGBX, CMYK, YCbCr, LAB, HSV
            target = "RGB"
        try:
            conv = im.convert(target) if im.mode != target else im
        except (ValueError, OSError) as e:
            raise ImageReadError(path, f"unsupported image mode {mode}") from e
        arr = np.asarray(conv, np.float32)
        if arr.ndim == 2:
            arr = arr[..., None]
        return split_decoded(path, fmt, mode, 8, arr / 255.0, orientation, target in ("LA", "RGBA"), pending)


def _read_png16(path: Path, head: bytes) -> tuple[np.ndarray, ImageInfo]:
    """16-bit RGB / RGBA / gray+alpha PNGs, decoded with imagecodecs (libpng) at full precision.

    The pixel count is checked on the header (``head``: the file's first 33 bytes) before anything
    is decompressed; Pillow opens the file for its EXIF block and frame count only.
    """
    w, h = struct.unpack(">II", head[16:24])
    if w == 0 or h == 0:
        raise ImageReadError(path, "image has no pixels")
    limit = Image.MAX_IMAGE_PIXELS  # Pillow's decompression-bomb limit, which this decoder bypasses
    if limit is not None and w * h > 2 * limit:
        raise ImageReadError(path, f"{w}x{h} pixels is more than twice PIL.Image.MAX_IMAGE_PIXELS ({limit}): "
                                   f"refused as a possible decompression bomb (raise that limit to read it)")
    with Image.open(path) as im:  # reads the chunks before the image data, decodes nothing
        exif = im.info.get("exif")
        pages = max(int(getattr(im, "n_frames", 1)), 1)
    if exif is None:
        exif = _png_exif_after_image_data(path)
    orientation = _orientation_of(exif)
    try:
        raw = imagecodecs.png_decode(path.read_bytes())
    except imagecodecs.PngError as e:
        raise ImageReadError(path, f"corrupt or truncated PNG ({e})") from e
    if raw.ndim == 2:
        raw = raw[..., None]
    channels = raw.shape[-1]
    if raw.dtype != np.uint16 or channels not in (2, 3, 4):
        raise ImageReadError(path, f"unexpected decoded PNG layout {raw.dtype} {raw.shape}")
    arr = raw.astype(np.float32) / 65535.0
    mode = {2: "LA;16", 3: "RGB;16", 4: "RGBA;16"}[channels]
    arr, info = split_decoded(path, "PNG", mode, 16, arr, orientation, channels in (2, 4))
    info.pages = pages
    return arr, info


def _png_exif_after_image_data(path: Path) -> bytes | None:
    """The eXIf chunk of a PNG that places it after the image data (libpng may write it there,
    and Pillow sees it only once the pixels are loaded), found with Pillow's chunk reader
    skipping over every other chunk; nothing is decompressed. None when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(8)
            chunks = PngImagePlugin.ChunkStream(f)
            while True:
                cid, _, length = chunks.read()
                if cid == b"eXIf":
                    body = f.read(length)
                    return body if len(body) == length else None
                if cid == b"IEND":
                    return None
                f.seek(length + 4, os.SEEK_CUR)  # the body and its CRC
    except (OSError, SyntaxError, ValueError, struct.error):  # broken structure: the decoder reports it
        return None


def _orientation_of(exif: bytes | None) -> int:
    """The orientation tag (1..8) of an EXIF block, 1 when there is none or it cannot be read."""
    if not exif:
        return 1
    try:
        parsed = Image.Exif()
        parsed.load(exif)
        value = int(parsed.get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block must not make the image unreadable
        return 1
    return value if 1 <= value <= 8 else 1


# --------------------------------------------------------------------------------------------
# writing


def quantize(array: np.ndarray, bit_depth: int = 8) -> np.ndarray:
    """Clip to [0, 1] (never rescale) and round to uint8 / uint16."""
    if bit_depth not in (8, 16):
        raise ValueError(f"bit_depth must be 8 or 16, got {bit_depth!r}")
    a = np.asarray(array, dtype=np.float64)
    if not np.isfinite(a).all():
        raise FloatingPointError("image contains NaN or Inf")
    peak = 255 if bit_depth == 8 else 65535
    return np.rint(np.clip(a, 0.0, 1.0) * peak).astype(np.uint8 if bit_depth == 8 else np.uint16)


def _unit_values(a: np.ndarray, what: str) -> np.ndarray:
    """Floats (and bools) as they are; uint8 / uint16 divided by :data:`INTEGER_SCALES`, as
    restore() reads them; other integer types a TypeError (clipping them to [0, 1] would turn
    them binary)."""
    if a.dtype.kind in "fb":
        return a
    if a.dtype.name in INTEGER_SCALES:
        return a.astype(np.float64) / INTEGER_SCALES[a.dtype.name]
    raise TypeError(f"{what} of dtype {a.dtype.name}: pass floats in [0, 1], or uint8 / uint16 images")


def encode_image(array: np.ndarray, fmt: str, bit_depth: int = 8, alpha: np.ndarray | None = None) -> bytes:
    """Encode a [0, 1] float image (H, W) / (H, W, C) as PNG, JPEG, TIFF or BMP bytes (uint8 and
    uint16 arrays are taken as 0..255 and 0..65535)."""
    a = _unit_values(np.asarray(array), "image")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise ValueError(f"image must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {a.shape}")
    if alpha is not None:
        alpha = _unit_values(np.asarray(alpha), "alpha")
        if alpha.shape != a.shape[:2]:
            raise ValueError(f"alpha of shape {alpha.shape} does not match the image's {a.shape[:2]}")
        if a.ndim == 3 and a.shape[2] == 4:
            raise ValueError("image already has 4 channels; pass alpha=None")
        a = np.concatenate([a if a.ndim == 3 else a[..., None], alpha[..., None]], axis=2)
    q = quantize(a, bit_depth)
    if q.ndim == 2:
        q = q[..., None]
    c = q.shape[2]
    if fmt == "PNG" and bit_depth == 16:  # Pillow writes no 16-bit colour PNGs
        return bytes(imagecodecs.png_encode(q[..., 0] if c == 1 else q))
    if fmt == "TIFF" and bit_depth == 16:
        buf = io.BytesIO()
        tifffile.imwrite(buf, q[..., 0] if c == 1 else q,
                         photometric="minisblack" if c <= 2 else "rgb",
                         extrasamples=["unassalpha"] if c in (2, 4) else None, compression="zlib")
        return buf.getvalue()
    if bit_depth == 16:
        raise ValueError(f"{fmt} cannot store 16-bit images; write PNG or TIFF")
    if fmt in ("JPEG", "BMP") and c in (2, 4):  # a 32-bit BMP's fourth byte is read back as padding
        raise ValueError(f"{fmt} cannot store an alpha channel; write PNG or TIFF")
    im = Image.fromarray(q[..., 0] if c == 1 else q)
    buf = io.BytesIO()
    kwargs = {"quality": 95} if fmt == "JPEG" else {"compression": "tiff_deflate"} if fmt == "TIFF" else {}
    im.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


_WRITE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP"}


def write_image(path: str | Path, array: np.ndarray, bit_depth: int = 8, alpha: np.ndarray | None = None) -> Path:
    """Write a [0, 1] float image atomically; the format follows the extension.

    Values are clipped to [0, 1] and rounded, never rescaled (uint8 / uint16 arrays are taken as
    0..255 / 0..65535, as restore() takes them). ``alpha`` (H, W) in [0, 1] is appended as an
    alpha channel (PNG, TIFF; JPEG and BMP refuse it). Raises FloatingPointError (nothing written) if the image holds
    NaN or Inf, ValueError for an unknown extension or a depth the format cannot store, TypeError for
    an array of another dtype (integers other than uint8 / uint16); each message names the file.
    """
    path = Path(path)
    fmt = _WRITE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: cannot write {path.suffix or 'files without extension'!r}; "
                         f"use one of {', '.join(_WRITE_FORMATS)}")
    try:
        data = encode_image(array, fmt, bit_depth, alpha)
    except (ValueError, TypeError) as e:  # TypeError: an array dtype that is no image
        raise type(e)(f"{path}: {e}") from e
    except FloatingPointError as e:  # quantize's check, image and alpha together
        raise FloatingPointError(f"{path}: {e}; not written") from e
    return files.atomic_write_bytes(path, data)


def image_opens(path: str | Path) -> bool:
    """True if ``path`` is a complete, decodable image (used to verify finished outputs)."""
    try:
        read_image(path)
    except (ImageReadError, OSError):
        return False
    return True

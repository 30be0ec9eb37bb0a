"""Reading and writing images and result files.

Images are float32 numpy arrays in [0, 1]: (H, W) for gray, (H, W, 3) for colour. An alpha
channel is never part of the array: :func:`read_image` sets it aside in the returned
:class:`ImageInfo` and :func:`write_image` re-attaches it on request.

* Formats: PNG, JPEG, TIFF, BMP; 1-, 8- and 16-bit integer images and [0, 1] float TIFFs; gray,
  gray + alpha, palette, RGB, RGBA (CMYK / YCbCr are converted to RGB). Pillow truncates 16-bit
  colour PNGs and TIFFs to 8 bits, so those are decoded here (PNG) or with tifffile (TIFF).
* EXIF orientation is applied (``PIL.ImageOps.exif_transpose``), so arrays are upright.
* Values are never min-max rescaled: writing clips to [0, 1] and rounds to the bit depth.
* Every write is atomic: a temporary file in the destination folder, then ``os.replace``. A run
  killed mid-write leaves either the old file or the new one, never a torn one; its stray
  temporary file (``.<name>.<random>.nfc-dps-tmp``) is removed by :func:`remove_stale_temp_files`.
* Errors name the file: :class:`ImageReadError` for missing, empty, corrupt or unsupported files.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "IMAGE_EXTENSIONS", "ImageReadError", "ImageInfo", "read_image", "write_image", "list_images",
    "list_folder", "unusable_reason", "atomic_write_bytes", "atomic_write_text", "write_json", "write_csv",
    "remove_stale_temp_files", "TEMP_SUFFIX", "quantize", "image_opens",
]

#: file extensions read_image accepts (lower case)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
#: integer image dtypes taken as [0, 1] images (by write_image and restore), and the value that maps to 1.0
INTEGER_SCALES = {"uint8": 255.0, "uint16": 65535.0}
#: Pillow format names accepted (the file's content decides, not its extension)
_FORMATS = {"PNG", "JPEG", "MPO", "TIFF", "BMP", "DIB"}
#: suffix of the temporary files of atomic writes
TEMP_SUFFIX = ".nfc-dps-tmp"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


# --------------------------------------------------------------------------------------------
# reading


def read_image(path: str | Path) -> tuple[np.ndarray, ImageInfo]:
    """Read an image as float32 (H, W) or (H, W, 3) in [0, 1], plus its :class:`ImageInfo`.

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
                return _read_png16(path)
        arr, info = _read_pillow(path)
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
    from PIL import Image

    try:
        with Image.open(path) as im:
            return max(int(getattr(im, "n_frames", 1)), 1)
    except Exception:  # noqa: BLE001 - the pixels were read; the count is only for a note
        return 1


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


def _exif_orientation(im) -> int:
    try:
        value = int(im.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block must not make the image unreadable
        return 1
    return value if 1 <= value <= 8 else 1


def _split(path: Path, fmt: str, mode: str, bits: int, arr: np.ndarray, orientation: int,
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


def _read_pillow(path: Path) -> tuple[np.ndarray, ImageInfo]:
    from PIL import Image, UnidentifiedImageError

    try:
        im = Image.open(path)
    except UnidentifiedImageError as e:
        if path.suffix.lower() in (".tif", ".tiff"):  # layouts Pillow does not open (16-bit gray + alpha, float RGB)
            return _read_tiff_deep(path, "TIFF", None)
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
                return _read_tiff_deep(path, im.mode, before_load)
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
            return _split(path, fmt, mode, bits, arr, orientation, False, pending)
        if mode in ("I;16", "I;16L", "I;16B", "I;16N"):
            arr = np.asarray(im).astype(np.float32)[..., None] / 65535.0
            if fmt == "TIFF" and im.tag_v2.get(262) == 0:  # "min is white" (Pillow inverts only 8-bit ones)
                arr = 1.0 - arr
            return _split(path, fmt, mode, 16, arr, orientation, False, pending)
        if mode == "I":
            raw = np.asarray(im)
            if raw.size and (raw.min() < 0 or raw.max() > 65535):
                raise ImageReadError(path, "unsupported 32-bit integer image (values outside 0..65535)")
            return _split(path, fmt, mode, 16, raw.astype(np.float32)[..., None] / 65535.0, orientation, False,
                          pending)
        if mode == "F":
            raw = np.asarray(im, dtype=np.float32)
            if not np.isfinite(raw).all():
                raise ImageReadError(path, "float image contains NaN or Inf")
            if raw.size and (raw.min() < 0 or raw.max() > 1):
                raise ImageReadError(path, f"float image values must lie in [0, 1], found [{raw.min():g}, {raw.max():g}]")
            return _split(path, fmt, mode, 32, raw[..., None], orientation, False, pending)
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
        return _split(path, fmt, mode, 8, arr / 255.0, orientation, target in ("LA", "RGBA"), pending)


def _read_tiff_deep(path: Path, mode: str, orientation: int | None) -> tuple[np.ndarray, ImageInfo]:
    """TIFFs Pillow reduces to 8 bits (16-bit colour), garbles (16-bit gray turned by its orientation
    tag) or does not open (16-bit gray + alpha, float colour), read with tifffile from the first page's own tags: planar or interleaved samples,
    extra samples (associated alpha is divided out, as Pillow does for 8-bit files; unspecified
    ones are dropped), "min is white" gray inverted. ``orientation`` None: the page's tag 274."""
    import tifffile

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
        if "imagecodecs" in str(e):  # tifffile decodes LZW and JPEG compression only with that package
            raise ImageReadError(path, f"this {mode} TIFF is read with tifffile, and its compression needs the "
                                       f"imagecodecs package ({e}): pip install imagecodecs, or save it "
                                       f"uncompressed or with deflate") from e
        raise ImageReadError(path, f"not a readable image (corrupt TIFF: {e})") from e
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
        if not np.isfinite(arr).all() or arr.min() < 0 or arr.max() > 1:
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
    return _split(path, "TIFF", f"{label};{bits}" if bits != 8 else label, bits, pixels.astype(np.float32),
                  orientation, alpha_at is not None)


def _png_chunks(data: bytes, path: Path):
    pos = 8
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = data[pos + 8 + length:pos + 12 + length]
        if len(body) != length or len(crc) != 4:
            raise ImageReadError(path, "corrupt or truncated PNG (chunk runs past the end of the file)")
        if struct.unpack(">I", crc)[0] != zlib.crc32(ctype + body) & 0xFFFFFFFF:
            raise ImageReadError(path, f"corrupt PNG (bad CRC in {ctype.decode('latin-1')!r} chunk)")
        yield ctype, body
        if ctype == b"IEND":
            return
        pos += 12 + length
    raise ImageReadError(path, "corrupt or truncated PNG (no IEND chunk)")


def _unfilter_sequential(ftype: int, line: bytes, up: list[int], bpp: int) -> bytearray:
    """One row of PNG filter 3 (Average) or 4 (Paeth) undone; each byte depends on the one ``bpp``
    before it, so this loops over Python ints (numpy per pixel was ~20 us a pixel)."""
    cur = bytearray(len(line))
    if ftype == 3:
        for i, v in enumerate(line):
            cur[i] = (v + (((cur[i - bpp] if i >= bpp else 0) + up[i]) >> 1)) & 0xFF
        return cur
    for i, v in enumerate(line):
        b = up[i]
        if i >= bpp:
            a, c = cur[i - bpp], up[i - bpp]
        else:
            a = c = 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        cur[i] = (v + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return cur


def _unfilter(raw: bytes, h: int, w: int, bpp: int, path: Path) -> np.ndarray:
    """Undo PNG scanline filters; returns (h, w * bpp) uint8."""
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        raise ImageReadError(path, "corrupt or truncated PNG (image data has the wrong length)")
    data = np.frombuffer(raw, np.uint8).reshape(h, stride + 1)
    out = np.empty((h, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        ftype, line = int(data[y, 0]), data[y, 1:].astype(np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 1:  # Sub: running sum along the row, per byte of a pixel
            cur = line.reshape(w, bpp).cumsum(0).reshape(-1) & 0xFF
        elif ftype == 2:  # Up
            cur = (line + prev) & 0xFF
        elif ftype in (3, 4):  # Average, Paeth: sequential along the row, so plain ints, byte by byte
            cur = np.frombuffer(_unfilter_sequential(ftype, data[y, 1:].tobytes(), prev.tolist(), bpp),
                                np.uint8).astype(np.int32)
        else:
            raise ImageReadError(path, f"corrupt PNG (unknown filter type {ftype} in row {y})")
        out[y] = cur
        prev = cur
    return out


def _read_png16(path: Path) -> tuple[np.ndarray, ImageInfo]:
    """16-bit RGB / RGBA / gray+alpha PNGs (non-interlaced)."""
    data = path.read_bytes()
    idat, header, orientation = [], None, 1
    for ctype, body in _png_chunks(data, path):
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"eXIf":
            from PIL import Image

            with contextlib.suppress(Exception):
                exif = Image.Exif()
                exif.load(body)
                orientation = int(exif.get(0x0112, 1))
                orientation = orientation if 1 <= orientation <= 8 else 1
    if header is None or not idat:
        raise ImageReadError(path, "corrupt PNG (missing IHDR or image data)")
    w, h, bits, ctype, _, _, interlace = header
    if interlace:
        raise ImageReadError(path, "unsupported: interlaced 16-bit colour PNG (save it without interlacing)")
    if w == 0 or h == 0:
        raise ImageReadError(path, "image has no pixels")
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS  # Pillow's decompression-bomb limit, which this decoder bypasses
    if limit is not None and w * h > 2 * limit:
        raise ImageReadError(path, f"{w}x{h} pixels is more than twice PIL.Image.MAX_IMAGE_PIXELS ({limit}): "
                                   f"refused as a possible decompression bomb (raise that limit to read it)")
    channels = {2: 3, 4: 2, 6: 4}[ctype]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise ImageReadError(path, f"corrupt PNG (compressed data: {e})") from e
    rows = _unfilter(raw, h, w, channels * 2, path)
    arr = rows.view(">u2").reshape(h, w, channels).astype(np.float32) / 65535.0
    mode = {2: "RGB;16", 4: "LA;16", 6: "RGBA;16"}[ctype]
    return _split(path, "PNG", mode, 16, arr, orientation, channels in (2, 4))


# --------------------------------------------------------------------------------------------
# writing


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then os.replace).

    An OSError (full disk, quota, read-only folder) leaves any old file as it was and carries
    ``path`` as its ``filename``, so its message names the file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    except OSError as e:
        if e.errno is None:
            raise
        raise _naming(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None:
            raise _naming(e, path) from e
        raise
    return path


def _naming(e: OSError, path: Path) -> OSError:
    """The same error (same errno, so the same OSError subclass) with ``path`` as its file name."""
    return OSError(e.errno, e.strerror, str(path))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``text`` as UTF-8; a file name that is not valid UTF-8 in it (surrogate escapes) is written
    as its escape sequence (``caf\\udce9.png``), so the file stays valid UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite_json(obj: Any) -> Any:
    """NaN/Inf -> None, so the file stays strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomic, indented, strict JSON (NaN/Inf written as null)."""
    text = json.dumps(_finite_json(obj), indent=2, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def write_csv(path: str | Path, rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]) -> Path:
    """Atomic CSV with a header; floats with 4 decimals, missing values empty."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fieldnames), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else
                             ("" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v))
                         for k, v in row.items()})
    return atomic_write_text(path, buf.getvalue())


def quantize(array: np.ndarray, bit_depth: int = 8) -> np.ndarray:
    """Clip to [0, 1] (never rescale) and round to uint8 / uint16."""
    if bit_depth not in (8, 16):
        raise ValueError(f"bit_depth must be 8 or 16, got {bit_depth!r}")
    a = np.asarray(array, dtype=np.float64)
    if not np.isfinite(a).all():
        raise FloatingPointError("image contains NaN or Inf")
    peak = 255 if bit_depth == 8 else 65535
    return np.rint(np.clip(a, 0.0, 1.0) * peak).astype(np.uint8 if bit_depth == 8 else np.uint16)


def _png16_bytes(q: np.ndarray) -> bytes:
    """PNG (16-bit gray / gray+alpha / RGB / RGBA) from a uint16 (H, W, C) array."""
    h, w, c = q.shape
    ctype = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    rows = q.astype(">u2").reshape(h, w * c).view(np.uint8).reshape(h, w, 2 * c).astype(np.int16)
    sub = rows.copy()
    sub[:, 1:] -= rows[:, :-1]  # Sub filter: difference to the pixel on the left, per byte
    filtered = np.concatenate([np.ones((h, 1), np.uint8), (sub & 0xFF).astype(np.uint8).reshape(h, -1)], 1)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (_PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(filtered.tobytes(), 6)) + chunk(b"IEND", b""))


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
    if fmt == "PNG" and bit_depth == 16:
        return _png16_bytes(q)
    if fmt == "TIFF" and bit_depth == 16:
        import tifffile

        buf = io.BytesIO()
        tifffile.imwrite(buf, q[..., 0] if c == 1 else q,
                         photometric="minisblack" if c <= 2 else "rgb",
                         extrasamples=["unassalpha"] if c in (2, 4) else None, compression="zlib")
        return buf.getvalue()
    if bit_depth == 16:
        raise ValueError(f"{fmt} cannot store 16-bit images; write PNG or TIFF")
    if fmt in ("JPEG", "BMP") and c in (2, 4):  # a 32-bit BMP's fourth byte is read back as padding
        raise ValueError(f"{fmt} cannot store an alpha channel; write PNG or TIFF")
    from PIL import Image

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
    NaN or Inf, ValueError for an unknown extension or a depth the format cannot store.
    """
    path = Path(path)
    fmt = _WRITE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: cannot write {path.suffix or 'files without extension'!r}; "
                         f"use one of {', '.join(_WRITE_FORMATS)}")
    try:
        data = encode_image(array, fmt, bit_depth, alpha)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    except FloatingPointError as e:  # quantize's check, image and alpha together
        raise FloatingPointError(f"{path}: {e}; not written") from e
    return atomic_write_bytes(path, data)


def image_opens(path: str | Path) -> bool:
    """True if ``path`` is a complete, decodable image (used to verify finished outputs)."""
    try:
        read_image(path)
    except (ImageReadError, OSError):
        return False
    return True


# --------------------------------------------------------------------------------------------
# folders


def list_folder(folder: str | Path) -> tuple[list[Path], list[Path]]:
    """(images, others) of a folder's non-hidden entries, each list sorted by name.

    ``images`` are regular files (or links to them) with a supported extension
    (:data:`IMAGE_EXTENSIONS`, any case). ``others`` are what a user may have meant as an input
    but cannot be read as one: files of other types, broken symbolic links, folders named like
    images (``x.png/``) and special files; :func:`unusable_reason` says why. Other subfolders
    are not inputs and are left out.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder")
    images, others = [], []
    for p in sorted(folder.iterdir(), key=lambda q: q.name):
        if p.name.startswith("."):
            continue
        if p.is_file():
            (images if p.suffix.lower() in IMAGE_EXTENSIONS else others).append(p)
        elif not p.is_dir() or p.suffix.lower() in IMAGE_EXTENSIONS:  # broken link, special file, x.png/
            others.append(p)
    return images, others


def scan_images(folder: str | Path, exclude: Sequence[Path] = ()) -> tuple[list[Path], list[Path]]:
    """(images, others) under ``folder``, recursively, sorted by relative path.

    Hidden files and folders are skipped, and so are the folders in ``exclude`` (e.g. a work or
    output folder inside it). ``others`` are files of other types.
    """
    folder, skip = Path(folder), [p.resolve() for p in exclude]
    images, others = [], []
    for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).as_posix()):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        try:
            rp = p.resolve()
        except (RuntimeError, OSError):  # a symbolic-link loop: not an image, said as such
            others.append(p)
            continue
        if any(rp == s or s in rp.parents for s in skip) or p.is_dir():
            continue
        (images if p.suffix.lower() in IMAGE_EXTENSIONS else others).append(p)
    return images, others


def images_in_subfolders(folder: str | Path, exclude: Sequence[Path] = ()) -> int:
    """How many image files lie in ``folder``'s non-hidden subfolders (which :func:`list_folder`
    leaves out), not counting those under ``exclude`` (e.g. an output folder inside it)."""
    folder = Path(folder)
    return sum(len(p.relative_to(folder).parts) > 1 for p in scan_images(folder, exclude)[0])


def unusable_reason(path: str | Path) -> str:
    """Why ``path`` (one of :func:`list_folder`'s ``others``) is not an input image."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            path.resolve(strict=True)
        except RuntimeError:
            return f"symbolic link in a loop (it points to {target}, which leads back to itself)"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"symbolic link in a loop (it points to {target}, which leads back to itself)"
        return f"broken symbolic link (its target {target} does not exist)"
    if path.is_dir():
        return "is a folder, not an image file"
    if not path.is_file():
        return "not a regular file (a pipe, socket or device)"
    return (f"unsupported file type {path.suffix or '(no extension)'!r}; "
            f"supported: {', '.join(IMAGE_EXTENSIONS)}")


def list_images(folder: str | Path) -> list[Path]:
    """The folder's image files (supported extensions, not hidden), sorted by file name."""
    return list_folder(folder)[0]


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete temporary files that an interrupted atomic write left in ``folder`` (recursively)."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.rglob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed

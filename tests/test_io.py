"""nfc_dps.io: reading/writing images of every supported kind, atomic writers, folder listing."""

from __future__ import annotations

import json
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from nfc_dps.io import (
    TEMP_SUFFIX,
    ImageReadError,
    atomic_write_bytes,
    image_opens,
    list_folder,
    list_images,
    quantize,
    read_image,
    remove_stale_temp_files,
    unusable_reason,
    write_csv,
    write_image,
    write_json,
)


def _img(h=12, w=10, c=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w) if c == 1 else (h, w, c)
    return rng.random(shape).astype(np.float32)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("ext", [".png", ".tif", ".bmp"])
@pytest.mark.parametrize("c", [1, 3])
def test_roundtrip_8bit_lossless(tmp_path, ext, c):
    x = _img(c=c)
    p = write_image(tmp_path / f"a{ext}", x)
    y, info = read_image(p)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert info.bit_depth == 8 and info.alpha is None and info.output_bit_depth == 8
    np.testing.assert_array_equal(y, quantize(x, 8) / np.float32(255))


@pytest.mark.parametrize("ext", [".png", ".tif"])
@pytest.mark.parametrize("c", [1, 3])
def test_roundtrip_16bit(tmp_path, ext, c):
    x = _img(c=c, seed=1)
    p = write_image(tmp_path / f"a{ext}", x, bit_depth=16)
    y, info = read_image(p)
    assert info.bit_depth == 16 and info.output_bit_depth == 16 and y.shape == x.shape
    assert np.abs(y - x).max() <= 0.5 / 65535 + 1e-7


@pytest.mark.parametrize("ext", [".png", ".tif"])
def test_roundtrip_16bit_rgba(tmp_path, ext):
    x, a = _img(seed=2), _img(c=1, seed=3)
    y, info = read_image(write_image(tmp_path / f"a{ext}", x, bit_depth=16, alpha=a))
    assert y.shape == x.shape and info.has_alpha and info.bit_depth == 16
    assert np.abs(info.alpha - a).max() <= 1e-4 and np.abs(y - x).max() <= 1e-4


def test_jpeg_8bit_close(tmp_path):
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    x = np.stack([xx, yy, 0.5 * np.ones_like(xx)], -1).astype(np.float32)
    y, info = read_image(write_image(tmp_path / "a.jpg", x))
    assert info.format == "JPEG" and np.abs(y - x).mean() < 0.02


def test_16bit_png_written_by_pillow_gray(tmp_path):
    q = (np.arange(20, dtype=np.uint16).reshape(4, 5) * 3000)
    Image.fromarray(q).save(tmp_path / "g.png")
    y, info = read_image(tmp_path / "g.png")
    assert info.bit_depth == 16
    np.testing.assert_allclose(y, q / 65535.0, atol=1e-7)


def _png16_filtered(q: np.ndarray, ftypes) -> bytes:
    """A 16-bit PNG whose rows use the given filter types (0-4), to exercise the decoder."""
    h, w, c = q.shape
    bpp = 2 * c
    raw = q.astype(">u2").view(np.uint8).reshape(h, w * bpp).astype(np.int64)
    out = []
    prev = np.zeros(w * bpp, np.int64)
    for y in range(h):
        line, f = raw[y], ftypes[y % len(ftypes)]
        left = np.concatenate([np.zeros(bpp, np.int64), line[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int64), prev[:-bpp]])
        if f == 0:
            pred = np.zeros_like(line)
        elif f == 1:
            pred = left
        elif f == 2:
            pred = prev
        elif f == 3:
            pred = (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = np.abs(p - left), np.abs(p - prev), np.abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        out.append(bytes([f]) + ((line - pred) & 0xFF).astype(np.uint8).tobytes())
        prev = line

    def chunk(k, b):
        return struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b) & 0xFFFFFFFF)

    ctype = {2: 4, 3: 2, 4: 6}[c]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"".join(out))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("c", [2, 3, 4])
def test_16bit_png_decoder_all_filters(tmp_path, c):
    q = np.random.default_rng(c).integers(0, 65536, (7, 6, c)).astype(np.uint16)
    (tmp_path / "f.png").write_bytes(_png16_filtered(q, [0, 1, 2, 3, 4]))
    y, info = read_image(tmp_path / "f.png")
    colour = q[..., :-1] if c in (2, 4) else q
    colour = colour[..., 0] if colour.shape[-1] == 1 else colour
    np.testing.assert_allclose(y, colour / 65535.0, atol=1e-7)
    assert info.has_alpha == (c in (2, 4))
    if info.has_alpha:
        np.testing.assert_allclose(info.alpha, q[..., -1] / 65535.0, atol=1e-7)


def test_modes_gray_alpha_palette_bilevel(tmp_path):
    rgba = (np.random.default_rng(0).random((6, 7, 4)) * 255).astype(np.uint8)
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    y, info = read_image(tmp_path / "rgba.png")
    assert y.shape == (6, 7, 3) and info.has_alpha and info.mode == "RGBA"
    np.testing.assert_allclose(info.alpha, rgba[..., 3] / 255.0, atol=1e-6)
    Image.fromarray(rgba[..., :2]).save(tmp_path / "la.png")  # gray + alpha
    y, info = read_image(tmp_path / "la.png")
    assert y.shape == (6, 7) and info.has_alpha
    np.testing.assert_allclose(y, rgba[..., 0] / 255.0, atol=1e-6)
    np.testing.assert_allclose(info.alpha, rgba[..., 1] / 255.0, atol=1e-6)
    Image.fromarray(rgba[..., :3]).convert("P").save(tmp_path / "p.png")
    y, info = read_image(tmp_path / "p.png")
    assert y.shape == (6, 7, 3) and not info.has_alpha
    with Image.open(tmp_path / "p.png") as im:  # the palette's colours, not their gray levels
        np.testing.assert_allclose(y, np.asarray(im.convert("RGB")) / 255.0, atol=1e-6)
    assert np.abs(y[..., 0] - y[..., 2]).max() > 0.1
    Image.fromarray(rgba[..., 0] > 128).save(tmp_path / "b.png")
    y, info = read_image(tmp_path / "b.png")
    assert y.shape == (6, 7) and info.bit_depth == 1
    np.testing.assert_array_equal(y, (rgba[..., 0] > 128).astype(np.float32))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_matches_pillow(tmp_path, orientation):
    from PIL import ImageOps

    a = (np.random.default_rng(0).random((4, 6, 3)) * 255).astype(np.uint8)
    im = Image.fromarray(a)
    exif = Image.Exif()
    exif[0x0112] = orientation
    im.save(tmp_path / "o.jpg", exif=exif, quality=100)
    y, info = read_image(tmp_path / "o.jpg")
    with Image.open(tmp_path / "o.jpg") as ref:
        expect = np.asarray(ImageOps.exif_transpose(ref), np.float32) / 255
    assert info.orientation == orientation
    np.testing.assert_allclose(y, expect, atol=1e-6)
    assert y.shape[:2] == ((6, 4) if orientation >= 5 else (4, 6))


def test_16bit_png_orientation_uses_same_rule(tmp_path):
    """The own decoder's orientation matches Pillow's exif_transpose on the 8-bit equivalent."""
    from PIL import ImageOps

    from nfc_dps.io.decoded import _orient

    a = (np.random.default_rng(1).random((3, 5, 3)) * 255).astype(np.uint8)
    for o in range(1, 9):
        im = Image.fromarray(a)
        im.getexif()[0x0112] = o
        ref = np.asarray(ImageOps.exif_transpose(im))
        np.testing.assert_array_equal(_orient(a, o), ref)


@pytest.mark.parametrize("orientation", [3, 6])
def test_16bit_png_and_tiff_apply_their_orientation(tmp_path, orientation):
    """A 16-bit PNG's eXIf chunk (decoded here, not by Pillow) and a 16-bit TIFF's tag 274 (read
    with tifffile) turn the pixels as for 8-bit files, and the info says which orientation."""
    import tifffile

    from nfc_dps.io.decoded import _orient

    a = np.random.default_rng(2).random((4, 6, 3))
    write_image(tmp_path / "a.png", a, bit_depth=16)
    upright = read_image(tmp_path / "a.png")[0]
    exif = Image.Exif()
    exif[0x0112] = orientation
    body = exif.tobytes()
    body = body[6:] if body.startswith(b"Exif\x00\x00") else body  # an eXIf chunk holds the TIFF header on
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    data = (tmp_path / "a.png").read_bytes()
    first_idat = data.index(b"IDAT") - 4
    (tmp_path / "o.png").write_bytes(data[:first_idat] + chunk + data[first_idat:])
    y, info = read_image(tmp_path / "o.png")
    assert info.bit_depth == 16 and info.orientation == orientation
    np.testing.assert_array_equal(y, _orient(upright, orientation))
    assert y.shape[:2] == ((6, 4) if orientation >= 5 else (4, 6))

    # TIFFs: 16-bit RGB (re-read with tifffile), 16-bit gray and 8-bit RGB (Pillow turns them as it
    # loads them: turned once, and the info still says how)
    u16, u8 = np.round(a * 65535).astype(np.uint16), np.round(a * 255).astype(np.uint8)
    for name, pixels, photometric, scale in (("rgb16", u16, "rgb", 65535.0), ("gray16", u16[..., 0], "minisblack", 65535.0),
                                             ("rgb8", u8, "rgb", 255.0)):
        tifffile.imwrite(tmp_path / f"{name}.tif", pixels, photometric=photometric,
                         extratags=[(274, "H", 1, orientation, True)])
        y, info = read_image(tmp_path / f"{name}.tif")
        assert info.orientation == orientation, name
        np.testing.assert_allclose(y, _orient(pixels / scale, orientation), atol=1e-6, err_msg=name)
    # LZW (the common TIFF compression): 8-bit files through Pillow; 16-bit gray turned ones through
    # tifffile, which needs imagecodecs for LZW: read, or a clear error saying so
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(u8).save(tmp_path / "lzw8.tif", compression="tiff_lzw", exif=exif)
    y, info = read_image(tmp_path / "lzw8.tif")
    assert info.orientation == orientation
    np.testing.assert_allclose(y, _orient(u8 / 255.0, orientation), atol=1e-6)
    Image.fromarray(u16[..., 0]).save(tmp_path / "lzw16.tif", compression="tiff_lzw", exif=exif)
    try:
        y, info = read_image(tmp_path / "lzw16.tif")
    except ImageReadError as e:
        assert "lzw16.tif" in str(e) and "pip install imagecodecs" in str(e)
    else:
        np.testing.assert_allclose(y, _orient(u16[..., 0] / 65535.0, orientation), atol=1e-6)


@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_16bit_png_writes_are_exact(tmp_path, c):
    """16-bit PNGs (gray, gray + alpha, RGB, RGBA) hold exactly quantize()'s values, in the PNG
    colour type of their channels, and read back exactly."""
    import imagecodecs

    x = _img(h=9, w=11, c=c, seed=c)
    image, alpha = (x[..., :-1], x[..., -1]) if c in (2, 4) else (x, None)
    image = image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image
    p = write_image(tmp_path / "a.png", image, bit_depth=16, alpha=alpha)
    data = p.read_bytes()
    assert data[24] == 16 and data[25] == {1: 0, 2: 4, 3: 2, 4: 6}[c]  # IHDR bit depth, colour type
    q = quantize(x, 16)
    np.testing.assert_array_equal(imagecodecs.png_decode(data), q)
    y, info = read_image(p)
    q = q if q.ndim == 3 else q[..., None]
    colour = q[..., :-1] if c in (2, 4) else q
    np.testing.assert_array_equal(y, (colour[..., 0] if colour.shape[2] == 1 else colour) / np.float32(65535))
    assert info.bit_depth == 16 and info.has_alpha == (c in (2, 4))
    if info.has_alpha:
        np.testing.assert_array_equal(info.alpha, q[..., -1] / np.float32(65535))


def test_16bit_png_exif_after_the_image_data_is_applied(tmp_path):
    """libpng may write the eXIf chunk after the image data; its orientation is applied as when
    it comes before."""
    from nfc_dps.io.decoded import _orient

    a = _img(h=4, w=6, seed=4)
    write_image(tmp_path / "a.png", a, bit_depth=16)
    upright = read_image(tmp_path / "a.png")[0]
    exif = Image.Exif()
    exif[0x0112] = 6
    body = exif.tobytes()
    body = body[6:] if body.startswith(b"Exif\x00\x00") else body
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    data = (tmp_path / "a.png").read_bytes()
    iend = data.index(b"IEND") - 4
    (tmp_path / "o.png").write_bytes(data[:iend] + chunk + data[iend:])
    y, info = read_image(tmp_path / "o.png")
    assert info.orientation == 6 and y.shape[:2] == (6, 4)
    np.testing.assert_array_equal(y, _orient(upright, 6))


def test_interlaced_16bit_png_reads(tmp_path):
    """An Adam7-interlaced 16-bit RGB PNG reads at full precision."""
    q = np.random.default_rng(5).integers(0, 65536, (13, 11, 3)).astype(np.uint16)
    rows = b""
    for y0, x0, dy, dx in ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)):
        rows += b"".join(b"\x00" + row.astype(">u2").tobytes() for row in q[y0::dy, x0::dx])

    def chunk(k, b):
        return struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b) & 0xFFFFFFFF)

    (tmp_path / "i.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 11, 13, 16, 2, 0, 0, 1))
                                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    y, info = read_image(tmp_path / "i.png")
    assert info.bit_depth == 16
    np.testing.assert_array_equal(y, q / np.float32(65535))


def test_corrupt_16bit_png_data_names_the_file(tmp_path):
    write_image(tmp_path / "a.png", _img(), bit_depth=16)
    data = bytearray((tmp_path / "a.png").read_bytes())
    data[data.index(b"IDAT") + 20] ^= 0xFF
    (tmp_path / "bad.png").write_bytes(bytes(data))
    with pytest.raises(ImageReadError, match="bad.png.*corrupt"):
        read_image(tmp_path / "bad.png")
    assert not image_opens(tmp_path / "bad.png")


@pytest.mark.parametrize("compression", ["lzw", "zlib"])
@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_compressed_16bit_tiff_reads_exactly(tmp_path, compression, c):
    """LZW- and deflate-compressed 16-bit TIFFs (tifffile decodes them with imagecodecs) read at
    full precision: gray, gray + alpha, RGB, RGBA."""
    import tifffile

    q = np.random.default_rng(c).integers(0, 65536, (7, 9, c)).astype(np.uint16)
    tifffile.imwrite(tmp_path / "a.tif", q[..., 0] if c == 1 else q, compression=compression,
                     photometric="minisblack" if c <= 2 else "rgb",
                     extrasamples=["unassalpha"] if c in (2, 4) else None)
    with tifffile.TiffFile(tmp_path / "a.tif") as tif:
        assert tif.pages[0].compression == (5 if compression == "lzw" else 8)
    y, info = read_image(tmp_path / "a.tif")
    colour = q[..., :-1] if c in (2, 4) else q
    np.testing.assert_array_equal(y, (colour[..., 0] if colour.shape[2] == 1 else colour) / np.float32(65535))
    assert info.bit_depth == 16 and info.has_alpha == (c in (2, 4))
    if info.has_alpha:
        np.testing.assert_array_equal(info.alpha, q[..., -1] / np.float32(65535))


# ---------------------------------------------------------------- errors name the file


def test_errors_name_the_file(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "junk.png").write_bytes(b"this is not an image at all")
    write_image(tmp_path / "ok.png", _img())
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "trunc.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.txt").write_text("hello")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "anim.png", format="GIF")
    cases = {"empty.png": "empty", "junk.png": "not a readable image", "trunc.png": "corrupt or truncated",
             "notes.txt": "unsupported file type", "missing.png": "no such file", "anim.png": "unsupported image format GIF"}
    for name, reason in cases.items():
        with pytest.raises(ImageReadError) as e:
            read_image(tmp_path / name)
        assert name in str(e.value) and reason in str(e.value)
        assert not image_opens(tmp_path / name)
    assert image_opens(tmp_path / "ok.png")


def test_truncated_16bit_png(tmp_path):
    write_image(tmp_path / "a.png", _img(), bit_depth=16)
    data = (tmp_path / "a.png").read_bytes()
    (tmp_path / "t.png").write_bytes(data[:-30])
    with pytest.raises(ImageReadError, match="t.png"):
        read_image(tmp_path / "t.png")


def test_write_never_rescales_and_rejects_nan(tmp_path):
    x = np.full((4, 4), 0.2, np.float32)
    x[0, 0], x[0, 1] = -3.0, 7.0
    y, _ = read_image(write_image(tmp_path / "c.png", x))
    assert y[0, 0] == 0 and y[0, 1] == 1 and abs(y[1, 1] - 51 / 255) < 1e-6  # clipped, not rescaled
    x[2, 2] = np.nan
    with pytest.raises(FloatingPointError, match="bad.png"):
        write_image(tmp_path / "bad.png", x)
    assert not (tmp_path / "bad.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]
    with pytest.raises(ValueError, match="16-bit"):
        write_image(tmp_path / "a.jpg", _img(), bit_depth=16)
    with pytest.raises(ValueError, match="cannot write"):
        write_image(tmp_path / "a.gif", _img())


# ---------------------------------------------------------------- atomic writers, listing


def test_atomic_writers(tmp_path):
    write_json(tmp_path / "a.json", {"x": float("nan"), "p": tmp_path, "v": np.float32(1.5)})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": None, "p": str(tmp_path), "v": 1.5}
    write_csv(tmp_path / "r.csv", [{"a": 1.23456, "b": None}, {"a": "x", "b": float("inf")}], ["a", "b"])
    assert (tmp_path / "r.csv").read_text() == "a,b\n1.2346,\nx,\n"
    mode = (tmp_path / "r.csv").stat().st_mode & 0o777
    assert mode & 0o644 == 0o644  # not the 0600 of a bare mkstemp file

    atomic_write_bytes(tmp_path / "b.bin", b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(tmp_path / "b.bin", 12345)  # type: ignore[arg-type]
    assert (tmp_path / "b.bin").read_bytes() == b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]
    (tmp_path / f".x.png.abc{TEMP_SUFFIX}").write_bytes(b"partial")
    assert len(remove_stale_temp_files(tmp_path)) == 1


def test_list_images_sorted(tmp_path):
    for n in ["b.png", "a.JPG", "c.tiff", ".hidden.png", "notes.txt", "z.bmp"]:
        (tmp_path / n).write_bytes(b"x")
    (tmp_path / "sub.png").mkdir()
    (tmp_path / "plain_folder").mkdir()
    (tmp_path / "gone.png").symlink_to(tmp_path / "missing.png")
    (tmp_path / "link.png").symlink_to(tmp_path / "b.png")
    assert [p.name for p in list_images(tmp_path)] == ["a.JPG", "b.png", "c.tiff", "link.png", "z.bmp"]
    others = list_folder(tmp_path)[1]
    assert [p.name for p in others] == ["gone.png", "notes.txt", "sub.png"]  # not the plain folder
    reasons = [unusable_reason(p) for p in others]
    assert "broken symbolic link" in reasons[0] and "missing.png" in reasons[0]
    assert "unsupported file type '.txt'" in reasons[1] and "is a folder" in reasons[2]
    with pytest.raises(NotADirectoryError):
        list_images(tmp_path / "b.png")


def test_tiff_layouts_pillow_does_not_read(tmp_path):
    """16-bit gray + alpha (what write_image writes), planar 16-bit RGB of width 3, "min is white"
    16-bit gray, associated alpha and float RGB: read as what they hold, or refused by name."""
    import tifffile

    x = _img(h=5, w=3, c=3, seed=4)
    a = np.linspace(0.2, 1.0, 15, dtype=np.float32).reshape(5, 3)
    g = x[..., 0]
    p = write_image(tmp_path / "la16.tif", g, bit_depth=16, alpha=a)
    y, info = read_image(p)
    assert y.shape == (5, 3) and info.has_alpha and np.abs(info.alpha - a).max() < 1e-4 and np.abs(y - g).max() < 1e-4
    q = np.rint(x * 65535).astype(np.uint16)
    tifffile.imwrite(tmp_path / "planar.tif", np.moveaxis(q, -1, 0), photometric="rgb", planarconfig="separate")
    y, info = read_image(tmp_path / "planar.tif")
    assert y.shape == (5, 3, 3) and not info.has_alpha and np.abs(y - x).max() < 1e-4
    tifffile.imwrite(tmp_path / "white.tif", q[..., 0], photometric="miniswhite")
    assert np.abs(read_image(tmp_path / "white.tif")[0] - (1 - x[..., 0])).max() < 1e-4
    premultiplied = np.concatenate([q * a[..., None], np.rint(a * 65535)[..., None]], -1).astype(np.uint16)
    tifffile.imwrite(tmp_path / "assoc.tif", premultiplied, photometric="rgb", extrasamples=["assocalpha"])
    y, info = read_image(tmp_path / "assoc.tif")
    assert np.abs(y - x).max() < 1e-3 and np.abs(info.alpha - a).max() < 1e-4
    tifffile.imwrite(tmp_path / "float.tif", x.astype(np.float32), photometric="rgb")
    assert np.abs(read_image(tmp_path / "float.tif")[0] - x).max() < 1e-6


def test_integer_arrays_are_written_as_their_range_and_bmp_refuses_alpha(tmp_path):
    u8 = np.array([[0, 5, 10, 255]], np.uint8)
    assert np.array_equal(np.rint(read_image(write_image(tmp_path / "a.png", u8))[0] * 255), u8)
    u16 = np.array([[0, 1000, 2000, 65535]], np.uint16)
    assert np.array_equal(np.rint(read_image(write_image(tmp_path / "b.png", u16, 16))[0] * 65535), u16)
    with pytest.raises(TypeError, match=r"c\.png: .*int32"):
        write_image(tmp_path / "c.png", np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="BMP cannot store an alpha channel"):
        write_image(tmp_path / "d.bmp", np.zeros((2, 2), np.float32), alpha=np.ones((2, 2), np.float32))


@pytest.mark.parametrize("damage", ["truncated", "zeroed_tags"])
@pytest.mark.parametrize("kind", ["gray8", "rgb16"])
def test_a_broken_tiff_is_our_one_error_without_third_party_output(tmp_path, capfd, caplog, damage, kind):
    """A broken TIFF printed a dozen lines of tifffile's log and libtiff's stderr before the error
    naming the file: the error now carries the first of them, and nothing else reaches the user."""
    import logging

    import tifffile

    rng = np.random.default_rng(0)
    pixels = (rng.random((32, 32)) * 255).astype(np.uint8) if kind == "gray8" else \
        (rng.random((32, 32, 3)) * 65535).astype(np.uint16)
    good = tmp_path / "good.tif"
    tifffile.imwrite(good, pixels, photometric="minisblack" if kind == "gray8" else "rgb", compression="zlib")
    data = bytearray(good.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[20:200] = bytes(180)
    bad = tmp_path / "bad.tif"
    bad.write_bytes(bytes(data))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ImageReadError, match=re.escape(str(bad))) as e:
        read_image(bad)
    assert "corrupt" in str(e.value)
    assert read_image(good)[0].shape[:2] == (32, 32)
    assert capfd.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records if r.name.startswith("tifffile")] == []

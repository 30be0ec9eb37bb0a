"""JPEG as a measurement: the operator (adjointness, its noise scale against real files), the file's
tables and integers, the projection onto the quantisation cells, the classical deblocking."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.ndimage import gaussian_filter

from nfc_dps.baselines import NotApplicable, qcs_tv
from nfc_dps.io.jpeg import quality_tables, read_jpeg, write_jpeg
from nfc_dps.operators import Denoising
from nfc_dps.operators.jpeg import JpegOperator, jpeg_measurement

LUMA, CHROMA = quality_tables(50)


def photo(h: int, w: int, seed: int = 0, channels: int = 3, texture: float = 0.04) -> np.ndarray:
    """A smooth random image with some texture, in [0.15, 0.85] (no clipping after decoding)."""
    rng = np.random.default_rng(seed)
    a = gaussian_filter(rng.standard_normal((h, w, channels)), (3, 3, 0))
    a = (a - a.min()) / (np.ptp(a) + 1e-12)
    a = 0.2 + 0.6 * a + texture * rng.standard_normal(a.shape)
    a = np.clip(a, 0.15, 0.85)
    return a[..., 0] if channels == 1 else a


def tensor(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(a, dtype=np.float64))
    return t[None, None] if t.ndim == 2 else t.permute(2, 0, 1)[None]


def worst_outside(op: JpegOperator, x: torch.Tensor, k: list[torch.Tensor]) -> float:
    """The largest distance of a coefficient of x outside its cell, in steps."""
    worst = 0.0
    for i, (c, (lo, hi)) in enumerate(zip(op.coefficients(x), op.cells(k, x))):
        step = op.planes[i].step.to(x)
        worst = max(worst, float(((c - hi).clamp_min(0) + (lo - c).clamp_min(0)).div(step).max()))
    return worst


CASES = [(3, "4:2:0", (37, 29)), (3, "4:2:0", (32, 48)), (3, "4:2:2", (24, 40)), (3, "4:2:2", (19, 35)),
         (3, "4:4:4", (17, 9)), (1, "4:4:4", (13, 21)), (1, "4:4:4", (16, 24))]


@pytest.mark.parametrize("channels,subsampling,size", CASES)
def test_adjoint_and_generalised_inverse(channels, subsampling, size):
    op = JpegOperator([LUMA, CHROMA], size, subsampling, channels)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, channels, *size, generator=g, dtype=torch.float64)
    y = torch.randn(op.measurement_shape(x.shape), generator=g, dtype=torch.float64)
    lhs, rhs = float((op.A(x) * y).sum()), float((x * op.A_adjoint(y)).sum())
    assert abs(lhs - rhs) <= 1e-10 * abs(lhs)
    ax = op.A(x)
    assert torch.allclose(op.A(op.A_pinv(ax)), ax, atol=1e-10)
    # the bound DPS-like steps read holds (power iterations from a random start)
    v = torch.randn_like(x)
    for _ in range(50):
        v = op.A_adjoint(op.A(v))
        v = v / v.norm()
    assert float(op.A(v).square().sum()) <= op.norm_bound() * (1 + 1e-9)
    assert op.image_shape(y.shape) == tuple(x.shape)
    json.dumps(op.describe())


def test_gray_operator_acts_on_each_channel_alike():
    op = JpegOperator(LUMA, (13, 21), channels=1)
    x = torch.rand(1, 3, 13, 21, dtype=torch.float64)
    ax = op.A(x)
    for c in range(3):
        assert torch.allclose(ax[:, c:c + 1], op.A(x[:, c:c + 1]))
    assert op.image_channels is None and JpegOperator([LUMA, CHROMA], (8, 8)).image_channels == 3
    with pytest.raises(ValueError, match="RGB"):
        JpegOperator([LUMA, CHROMA], (13, 21)).A(x[:, :1])


def test_tables_read_back_in_natural_order(tmp_path):
    """Tables written in natural (row-major) order read back equal, and the decoded image's DCT
    divided by them lies on integers, which it does not under the transposed tables."""
    luma = 8 + 2 * np.arange(64).reshape(8, 8)  # every step differs from its transpose's
    chroma = 10 + np.arange(64).reshape(8, 8)
    path = tmp_path / "t.jpg"
    buf = Image.fromarray(np.uint8(np.round(photo(48, 64) * 255)))
    buf.save(path, format="JPEG", qtables=[luma.ravel().tolist(), chroma.ravel().tolist()], subsampling=0)
    jf = read_jpeg(path)
    assert np.array_equal(jf.tables[0], luma) and np.array_equal(jf.tables[1], chroma)
    assert np.array_equal(jf.tables[2], chroma) and jf.subsampling == "4:4:4"

    def off_integer(tables) -> float:
        jf.tables = tables
        m = jpeg_measurement(jf)
        steps = m.operator.steps(m.operator.coefficients(m.decoded.double()))[0]
        nonzero = steps.round() != 0
        return float((steps - steps.round()).abs()[nonzero].mean())

    assert off_integer((luma, chroma, chroma)) < 0.05
    assert off_integer((luma.T.copy(), chroma.T.copy(), chroma.T.copy())) > 0.15


@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2", "4:4:4"])
def test_written_file_reads_back(tmp_path, subsampling):
    write_jpeg(tmp_path / "a.jpg", photo(24, 40), 30, subsampling)
    jf = read_jpeg(tmp_path / "a.jpg")
    luma, chroma = quality_tables(30)
    assert jf.subsampling == subsampling and not jf.progressive
    assert np.array_equal(jf.tables[0], luma) and np.array_equal(jf.tables[1], chroma)
    assert jf.pixels.shape == (24, 40, 3) and jpeg_measurement(jf).operator.subsampling == subsampling


@pytest.mark.parametrize("size,subsampling", [((40, 56), "4:2:0"), ((33, 47), "4:2:0"), ((33, 47), "4:4:4")])
def test_stored_integers_recovered_from_the_decoded_file(tmp_path, size, subsampling):
    """The integers read from the decoded pixels are those the encoder's model gives the original (up to
    the encoder's integer arithmetic; in the last block row and column the decoder drops the pixels
    past the image, which some blocks' integers depend on), and the decoded image lies (nearly) in
    their cells."""
    image = photo(*size, seed=3)
    write_jpeg(tmp_path / "a.jpg", image, 30, subsampling)
    m = jpeg_measurement(tmp_path / "a.jpg")
    op = m.operator
    model = op.quantise(tensor(image))
    for k, k_model in zip(m.integers, model):
        assert k.shape == k_model.shape
        same = (k == k_model).double()
        assert float(same[..., :-8, :-8].mean()) > 0.99 and float(same.mean()) > 0.97
    decoded = m.decoded.double()  # its chroma upsampled by the decoder, which its averages do not undo
    for c, (lo, hi) in zip(op.coefficients(decoded), op.cells(m.integers, decoded)):
        assert float(((c >= lo - 1e-9) & (c <= hi + 1e-9)).double().mean()) > 0.99
    projected = op.project(m.decoded.double(), model)
    assert float((projected - m.decoded.double()).square().mean().sqrt()) < 1.5 / 255


@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2"])
def test_measurement_noise_is_q_min_over_sqrt12(tmp_path, subsampling):
    """y - A(original) of a real JPEG: per stored coefficient that is not zeroed, std q_min / sqrt(12)
    in every plane (subsampled chroma too)."""
    image = photo(96, 96, seed=5, texture=0.12)
    write_jpeg(tmp_path / "a.jpg", image, 50, subsampling)
    m = jpeg_measurement(tmp_path / "a.jpg")
    op = m.operator
    residual = m.y.double() - op.A(tensor(image))
    for plane, part, k in zip(op.planes, op._unstack(residual), m.integers):
        coef = op._dct2(plane.downsample(part)) / op.sigma_y
        nonzero = k != 0
        assert int(nonzero.sum()) > 150
        assert 0.9 < float(coef[nonzero].std()) < 1.2
    assert m.sigma_y == pytest.approx(float(min(LUMA.min(), CHROMA.min())) / 255 / math.sqrt(12))


@pytest.mark.parametrize("size,subsampling", [((32, 48), "4:2:0"), ((37, 29), "4:2:0"), ((19, 35), "4:2:2"),
                                              ((17, 9), "4:4:4")])
def test_projection_is_the_nearest_point_of_the_cells(size, subsampling):
    op = JpegOperator(quality_tables(20), size, subsampling)
    truth = tensor(photo(*size, seed=2))
    k = op.quantise(truth)
    x = truth + 0.05 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = op.project(x, k)
    assert worst_outside(op, p, k) < 1e-5
    assert torch.allclose(op.project(p, k), p, atol=1e-5)
    assert torch.allclose(op.project(x, op.measurement(k)), p)  # the cells of the measurement's integers

    def distance(z: torch.Tensor) -> float:  # the metric: the stored planes' coefficients
        return sum(float((a - b).square().sum()) for a, b in zip(op.coefficients(z), op.coefficients(x)))

    for other in (truth, 0.5 * (truth + p)):  # points of the (convex) set
        assert worst_outside(op, other, k) < 1e-5
        assert distance(p) <= distance(other) + 1e-9
    assert distance(p) < distance(truth)


def test_measurement_of_the_integers_is_the_operator_plus_rounding():
    op = JpegOperator(quality_tables(40), (32, 48), "4:2:0")
    x = tensor(photo(32, 48, seed=4))
    k = op.quantise(x)
    y = op.measurement(k)
    assert all(torch.equal(a, b) for a, b in zip(op.stored_integers(y), k))
    # the rounding error is at most half a step per coefficient: |T(y - A x)| <= q_min / 2
    for plane, part in zip(op.planes, op._unstack(y - op.A(x))):
        assert float(op._dct2(plane.downsample(part)).abs().max()) <= op.q_min / 2 + 1e-12


def test_mid_gray_is_stored_as_zeros(tmp_path):
    """JPEG level-shifts luma by 128: a flat mid-gray image stores zeros in every plane."""
    write_jpeg(tmp_path / "g.jpg", np.full((16, 24, 3), 128, np.uint8), 50)
    m = jpeg_measurement(tmp_path / "g.jpg")
    assert all(int(k.abs().max()) == 0 for k in m.integers)
    assert torch.allclose(m.operator.A_pinv(m.y.double()), torch.full((1, 3, 16, 24), 128 / 255, dtype=torch.float64))


def test_progressive_jpeg_reads_as_the_baseline_one(tmp_path):
    image = photo(40, 56, seed=6)
    write_jpeg(tmp_path / "b.jpg", image, 25)
    write_jpeg(tmp_path / "p.jpg", image, 25, progressive=True)
    base, prog = jpeg_measurement(tmp_path / "b.jpg"), jpeg_measurement(tmp_path / "p.jpg")
    assert prog.file.progressive and not base.file.progressive
    assert all(np.array_equal(a, b) for a, b in zip(prog.file.tables, base.file.tables))
    assert all(torch.equal(a, b) for a, b in zip(prog.integers, base.integers))


def test_gray_jpeg(tmp_path):
    image = photo(24, 30, channels=1)
    write_jpeg(tmp_path / "g.jpg", image, 30)
    m = jpeg_measurement(tmp_path / "g.jpg")
    assert m.operator.channels == 1 and m.y.shape == (1, 1, 24, 32) and m.decoded.shape == (1, 1, 24, 30)
    assert float((m.operator.quantise(tensor(image))[0] == m.integers[0]).double().mean()) > 0.99


def test_files_that_are_not_ycbcr_jpegs_are_refused_by_name(tmp_path):
    png = tmp_path / "photo.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png)
    with pytest.raises(ValueError, match=r"photo\.png.*PNG file, not a JPEG"):
        read_jpeg(png)
    cmyk = tmp_path / "print.jpg"
    Image.new("CMYK", (16, 16), (0, 50, 100, 0)).save(cmyk, format="JPEG")
    with pytest.raises(ValueError, match=r"print\.jpg.*CMYK"):
        read_jpeg(cmyk)
    with pytest.raises(ValueError, match=r"missing\.jpg.*no such file"):
        read_jpeg(tmp_path / "missing.jpg")
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"broken\.jpg.*not a readable image"):
        jpeg_measurement(tmp_path / "broken.jpg")


def test_operator_refuses_bad_arguments():
    with pytest.raises(ValueError, match="subsampling"):
        JpegOperator([LUMA, CHROMA], (16, 16), "4:1:1")
    with pytest.raises(ValueError, match="steps > 0"):
        JpegOperator([LUMA * 0, CHROMA], (16, 16))
    with pytest.raises(ValueError, match="chroma table"):
        JpegOperator(LUMA, (16, 16))
    with pytest.raises(ValueError, match="quality"):
        write_jpeg("x.jpg", photo(8, 8), 0)


def test_qcs_tv_deblocks_a_smooth_image(tmp_path):
    image = photo(48, 48, seed=7, texture=0.0)
    write_jpeg(tmp_path / "a.jpg", image, 10)
    m = jpeg_measurement(tmp_path / "a.jpg")
    truth = tensor(image).float()
    x = qcs_tv(m.operator, m.y)
    assert x.shape == truth.shape and worst_outside(m.operator, x.double(), m.integers) < 1e-3

    def err(z: torch.Tensor) -> float:
        return float((z - truth).square().mean())

    assert err(x) < 0.9 * err(m.decoded)
    with pytest.raises(NotApplicable, match="JPEG operator"):
        qcs_tv(Denoising(), truth, 0.01)

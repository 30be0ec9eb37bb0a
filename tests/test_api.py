"""restore()'s input contract: dtypes and ranges, argument checks, the samples array, chunked chains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_samplers import ShrinkPrior

import nfc_dps
from nfc_dps.operators import BlurOperator, Denoising, gaussian_kernel
from nfc_dps.samplers import get_config

CFG = dict(num_levels=3, ode_steps=1)


def run(y, op=None, **kw):
    kw = {"prior": ShrinkPrior(), "config": get_config("nfc", "fast", **CFG), "sigma_y": 0.02,
          "progress": False, **kw}
    return nfc_dps.restore(y, Denoising() if op is None else op, **kw)


def image(h=16, w=16) -> np.ndarray:
    """A (h, w, 3) float32 image in [0, 1] whose 8-bit rounding is exact."""
    g = np.random.default_rng(0)
    return (g.integers(0, 256, (h, w, 3)) / 255.0).astype(np.float32)


class Float32Prior(ShrinkPrior):
    """Refuses other dtypes, as a network with float32 weights does."""

    def denoise(self, x, sigma):
        if x.dtype != torch.float32:
            raise RuntimeError(f"expected scalar type Float but found {x.dtype}")
        return super().denoise(x, sigma)


# ---------------------------------------------------------------- dtypes and ranges


def test_uint8_and_uint16_are_scaled_to_unit_range():
    x = image()
    ref = run(x).image
    u8 = np.rint(x * 255).astype(np.uint8)
    np.testing.assert_array_equal(run(u8).image, ref)
    np.testing.assert_array_equal(run(torch.from_numpy(u8).permute(2, 0, 1)).image.permute(1, 2, 0).numpy(), ref)
    u16 = (u8.astype(np.uint16) * 257)  # 257 * v / 65535 == v / 255
    np.testing.assert_allclose(run(u16).image, ref, atol=1e-6)
    assert run(u8).image.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, bool])
def test_other_integer_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="uint8"):
        run(np.ones((8, 8, 3), dtype))
    with pytest.raises(TypeError, match="uint8"):
        run(torch.ones(1, 3, 8, 8, dtype=torch.int32))


def test_float_values_far_outside_unit_range_are_refused():
    x = image()
    with pytest.raises(ValueError, match=r"lie in \[0, 255\]"):
        run(x * 255)
    with pytest.raises(ValueError, match=r"lie in \[-1, 1\]"):
        run(torch.from_numpy(x * 2 - 1).permute(2, 0, 1))
    # a noisy measurement exceeds [0, 1] by a few sigma_y: accepted
    noisy = x + 0.1 * np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    assert noisy.min() < -0.2 and noisy.max() > 1.2
    assert np.isfinite(run(noisy, sigma_y=0.1).image).all()
    with pytest.raises(ValueError, match="sigma_y=0.02"):
        run(noisy, sigma_y=0.02)


def test_float64_tensor_runs_in_float32():
    y = torch.from_numpy(image()).permute(2, 0, 1)[None]
    ref = run(y, prior=Float32Prior()).image
    out = run(y.double(), prior=Float32Prior()).image
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    assert run(image().astype(np.float64), prior=Float32Prior()).image.dtype == np.float32


# ---------------------------------------------------------------- arguments


def test_numpy_integer_seeds():
    x = image()
    ref = run(x, seed=3).image
    np.testing.assert_array_equal(run(x, seed=np.int64(3)).image, ref)
    np.testing.assert_array_equal(run(x, seed=np.array([3])).image, ref)
    with pytest.raises(TypeError, match="seed"):
        run(x, seed=3.5)
    with pytest.raises(TypeError, match="seed"):
        run(x, seed="3")
    with pytest.raises(ValueError, match="seed"):
        run(x, seed=-1)


@pytest.mark.parametrize("sigma", [float("inf"), float("nan"), -0.1, 1.5])
def test_sigma_y_must_lie_in_unit_pixel_range(sigma):
    with pytest.raises(ValueError, match=r"sigma_y must be in \[0, 1\]"):
        run(image(), sigma_y=sigma)


def test_sigma_y_in_0_255_units_is_named():
    with pytest.raises(ValueError, match="12.75.*divide by 255"):
        run(image(), sigma_y=12.75)


def test_operator_none_is_a_type_error():
    with pytest.raises(TypeError, match="operator"):
        nfc_dps.restore(image(), None, prior=ShrinkPrior(), progress=False)


def test_samples_are_one_array_with_k_first():
    out = run(image(), num_samples=3)
    assert isinstance(out.samples, np.ndarray) and out.samples.shape == (3, 16, 16, 3)
    np.testing.assert_allclose(out.image, np.clip(out.samples.mean(0), 0, 1), atol=1e-6)
    gray = run(image()[..., 0], num_samples=2)
    assert gray.samples.shape == (2, 16, 16)
    t = run(torch.rand(2, 3, 8, 8), num_samples=3)
    assert isinstance(t.samples, torch.Tensor) and t.samples.shape == (3, 2, 3, 8, 8)
    assert run(torch.rand(3, 8, 8), num_samples=2).samples.shape == (2, 3, 8, 8)


# ---------------------------------------------------------------- chunked chains


def test_max_batch_chunks_give_identical_results():
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    y = op.measure(torch.rand(2, 3, 16, 16), 0.02, [torch.Generator().manual_seed(i) for i in range(2)])
    full = run(y, op, seed=[4, 9], num_samples=3)
    seen = []
    for chunk in (1, 4, 6, 100):
        part = run(y, op, seed=[4, 9], num_samples=3, max_batch=chunk, callback=seen.append)
        assert torch.equal(part.image, full.image) and torch.equal(part.samples, full.samples), chunk
        assert torch.equal(part.std, full.std) and part.nfe == full.nfe
    spans = sorted({s["chains"] for s in seen})
    assert (0, 1) in spans and (4, 6) in spans and (0, 6) in spans
    with pytest.raises(ValueError, match="max_batch"):
        run(y, op, max_batch=0)


def test_gray_measurement_with_an_rgb_prior_counts_its_noise_once():
    """A gray y with a 3-channel prior is restored as three copies, each with noise std
    sigma_y * sqrt(3) (the copies share one noise draw, so their mean keeps the exact
    likelihood), and averaged back."""
    gray = image()[..., 0]
    out = run(gray, sigma_y=0.02, config=get_config("nfc", "deterministic", num_levels=3)).image
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    ref = run(rgb, sigma_y=0.02 * np.sqrt(3), config=get_config("nfc", "deterministic", num_levels=3)).image
    np.testing.assert_allclose(out, ref.mean(-1), atol=1e-6)
    assert out.shape == gray.shape
    not_scaled = run(rgb, sigma_y=0.02, config=get_config("nfc", "deterministic", num_levels=3)).image
    assert np.abs(out - not_scaled.mean(-1)).max() > 1e-3


def test_ddrm_on_a_padded_canvas_says_why_it_does_not_apply():
    """An image size the prior cannot take is restored on a padded canvas; DDRM's error then says
    so (not just the name of an operator class the user never built)."""

    class Multiple8(ShrinkPrior):
        size_multiple = 8

    y = torch.rand(1, 3, 12, 12)
    with pytest.raises(ValueError, match="padded canvas.*multiple"):
        nfc_dps.restore(y, Denoising(), prior=Multiple8(), method="ddrm", sigma_y=0.02, progress=False)
    assert nfc_dps.restore(y[..., :8, :8], Denoising(), prior=Multiple8(), method="ddrm", sigma_y=0.02,
                           progress=False).image.shape == (1, 3, 8, 8)


def test_big_endian_numpy_input_gives_the_native_result():
    """A big-endian array (numpy's view of a big-endian 16-bit TIFF, FITS data) restores as its
    native-order twin does; torch.from_numpy refused it."""
    native = (image() * 65535).astype(np.uint16)
    want = run(native).image
    got = run(native.astype(">u2")).image
    assert np.array_equal(got, want)
    assert np.array_equal(run(native.astype(np.float32).astype(">f4") / 65535).image, run(native.astype(np.float32) / 65535).image)


def test_the_embedded_default_is_only_the_shipped_weights(monkeypatch, tmp_path):
    from nfc_dps.priors.default import ENV_VAR, prior_identity

    assert prior_identity(None)["embedded_default"] and prior_identity("")["embedded_default"]
    monkeypatch.setenv(ENV_VAR, str(tmp_path))  # another folder named by the variable: not the shipped prior
    assert not prior_identity(None)["embedded_default"]

"""Classical baselines: Wiener (exact in the noiseless invertible case), TV, bicubic, biharmonic,
and clear errors where a baseline does not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nfc_dps import baselines as B
from nfc_dps.operators import BlurOperator, Denoising, Inpainting, SuperResolution, box_mask, gaussian_kernel

torch.set_num_threads(1)


def smooth_image(size: int = 32, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """A [0, 1] test image with edges and texture (a few blurred rectangles plus low-pass noise)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((1, channels, size, size), 0.4, dtype=torch.float64)
    for _ in range(5):
        t, l = torch.randint(0, size - 8, (2,), generator=g).tolist()
        x[..., t:t + 8 + t % 5, l:l + 6 + l % 7] = torch.rand(channels, 1, 1, generator=g, dtype=torch.float64)
    noise = torch.randn(1, channels, size, size, generator=g, dtype=torch.float64)
    x = x + 0.05 * BlurOperator(gaussian_kernel(7, 1.5), "circular").A(noise)
    return x.clamp(0.05, 0.95)


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).square().mean())


def test_wiener_is_exact_for_noiseless_invertible_circulant_blur():
    x = smooth_image()
    k = torch.tensor([[0.0, 0.1, 0.0], [0.1, 0.6, 0.1], [0.0, 0.1, 0.0]])
    op = BlurOperator(k, "circular")  # H = 0.6 + 0.2 cos + 0.2 cos >= 0.2: no zeros
    assert float(op.transfer_function(32, 32, dtype=torch.float64).abs().min()) > 0.19
    y = op.A(x)
    xr = B.wiener(op, y, 0.0)
    assert float((xr - x).abs().max()) < 1e-9
    # restore_classical clips to [0, 1] (x is inside) and keeps the exactness
    assert float((B.restore_classical("wiener", op, y, 0.0) - x).abs().max()) < 1e-9


def test_wiener_denoising_noiseless_is_identity_and_noisy_improves():
    x = smooth_image()
    op = Denoising()
    assert float((B.wiener(op, x, 0.0) - x).abs().max()) < 1e-9
    y = op.measure(x, 0.05, torch.Generator().manual_seed(1))
    assert mse(B.restore_classical("wiener", op, y, 0.05), x) < 0.7 * mse(y, x)


@pytest.mark.parametrize("boundary", ["circular", "reflect", "valid"])
@pytest.mark.parametrize("kind", ["gaussian", "motion"])
def test_wiener_deblur_noisy_beats_measurement(boundary, kind):
    from nfc_dps.operators import motion_kernel

    x = smooth_image(48)
    kernel = gaussian_kernel(9, 1.5) if kind == "gaussian" else motion_kernel(9, 0.5, 3)  # motion: asymmetric
    op = BlurOperator(kernel, boundary)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(2))
    xr = B.restore_classical("wiener", op, y, 0.01)
    assert xr.shape == x.shape and float(xr.min()) >= 0 and float(xr.max()) <= 1
    t, left, h, w = op.measured_frame(x.shape) or (0, 0, *x.shape[-2:])  # valid: the frame y lies over
    frame = x[..., t:t + h, left:left + w]
    assert mse(xr[..., t:t + h, left:left + w], frame) < (1.0 if boundary == "valid" else 0.8) * mse(y, frame)


def test_fit_measurement_spectrum_recovers_power_law_slope():
    from nfc_dps.priors import GaussianSpectralPrior

    prior = GaussianSpectralPrior((64, 64), alpha=2.5, channels=1, pixel_std=0.3)
    x = prior.sample(4, torch.Generator().manual_seed(0), dtype=torch.float64)
    _, alpha = B.fit_measurement_spectrum(x, None, 0.0, r_min=0.05)
    assert torch.allclose(alpha, torch.full_like(alpha, 2.5), atol=0.3)


def test_tv_reduces_error_on_blurred_noisy_image():
    x = smooth_image(32)
    op = BlurOperator(gaussian_kernel(7, 1.2), "circular")
    y = op.measure(x, 0.03, torch.Generator().manual_seed(3))
    xr = B.restore_classical("tv", op, y, 0.03)
    assert xr.shape == x.shape
    assert mse(xr, x) < 0.7 * mse(y, x)


def test_tv_lambda_rule_is_proportional_to_sigma_with_a_floor():
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    assert B.tv_lambda(op, 0.05) == pytest.approx(2 * B.tv_lambda(op, 0.025))
    assert B.tv_lambda(op, 0.0) == B.TV_LAMBDA_FLOOR
    assert B.tv_lambda(Denoising(), 0.1) == pytest.approx(B.TV_LAMBDA_PER_SIGMA["denoise"] * 0.1)


def test_calibration_refuses_held_out_images():
    with pytest.raises(ValueError, match="held out"):
        B.calibrate_tv(image_names=("astronaut",))


def test_bicubic_shape_and_constant_image():
    op = SuperResolution(4)
    y = torch.full((2, 3, 8, 6), 0.3)
    xr = B.restore_classical("bicubic", op, y, 0.01)
    assert xr.shape == (2, 3, 32, 24)
    assert torch.allclose(xr, torch.full_like(xr, 0.3), atol=1e-6)


def test_sr_wiener_and_tv_shapes_and_improve_on_nearest():
    x = smooth_image(32)
    op = SuperResolution(4)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(4))
    nearest = y.repeat_interleave(4, -2).repeat_interleave(4, -1)
    for name in ("wiener", "tv"):
        xr = B.restore_classical(name, op, y, 0.01)
        assert xr.shape == x.shape and torch.isfinite(xr).all()
        assert mse(xr, x) < mse(nearest, x)


def test_biharmonic_fills_a_box():
    x = smooth_image(32)
    op = Inpainting(box_mask(32, 32, 8, 4, generator=0))
    y = op.measure(x, 0.0)
    xr = B.restore_classical("biharmonic", op, y, 0.0)
    missing = op.mask.expand_as(x) == 0
    assert torch.allclose(xr[~missing], x[~missing].to(xr.dtype), atol=1e-6)  # observed pixels kept
    assert mse(xr[missing], x[missing]) < 0.5 * mse(y[missing], x[missing])  # far better than zeros


@pytest.mark.parametrize("name, op, fragment", [
    ("wiener", Inpainting(box_mask(16, 16, 4, 2, generator=0)), "inpainting"),
    ("bicubic", BlurOperator(gaussian_kernel(3, 1.0)), "super-resolution only"),
    ("biharmonic", SuperResolution(2), "inpainting only"),
])
def test_inapplicable_combinations_raise_clear_errors(name, op, fragment):
    assert B.applicable(name, op) is not None
    y = torch.zeros(1, 3, 8, 8) if isinstance(op, SuperResolution) else torch.zeros(1, 3, 16, 16)
    with pytest.raises(B.NotApplicable, match=fragment):
        B.restore_classical(name, op, y, 0.01)
    assert issubclass(B.NotApplicable, ValueError)


def test_unknown_baseline_and_bad_sigma():
    op = Denoising()
    with pytest.raises(ValueError, match="unknown classical baseline"):
        B.restore_classical("bm3d", op, torch.zeros(1, 1, 8, 8), 0.1)
    with pytest.raises(ValueError, match="sigma_y"):
        B.restore_classical("tv", op, torch.zeros(1, 1, 8, 8), -1.0)


def test_tv_applies_to_every_operator_family():
    for op in (Denoising(), SuperResolution(2), Inpainting(np.ones((8, 8))), BlurOperator(gaussian_kernel(3, 1.0))):
        assert B.applicable("tv", op) is None


def _float32_circular_blur(kernel: torch.Tensor, channels: int = 3):
    """A circular blur as a user writes it: ``F.conv2d`` with a float32 kernel (float32 input only)."""
    import torch.nn.functional as F

    kh, kw = kernel.shape
    weight = kernel.float().expand(channels, 1, kh, kw).contiguous()
    return lambda x: F.conv2d(F.pad(x, (kw // 2, kw // 2, kh // 2, kh // 2), mode="circular"), weight, groups=channels)


def test_tv_calls_a_float32_function_operator_and_physics_in_float32():
    """A FunctionOperator with float32 constants and a deepinv-style physics with a float32 filter
    (which fail on float64 input): TV calls them in their own dtype and gives the built-in
    operator's restoration."""
    from torch import nn

    from nfc_dps.interop import from_deepinv_physics
    from nfc_dps.operators import FunctionOperator

    k = gaussian_kernel(5, 1.0)
    conv = _float32_circular_blur(k)

    class Blur(nn.Module):  # deepinv's Blur shape: a float32 filter buffer
        def __init__(self):
            super().__init__()
            self.register_buffer("filter", k.float()[None, None])

        def A(self, x):
            return conv(x)

        def A_adjoint(self, y):
            return conv(y)  # a symmetric kernel

    x = smooth_image(32).float()
    builtin = BlurOperator(k, "circular")
    y = builtin.measure(x, 0.02, torch.Generator().manual_seed(0))
    ref = B.restore_classical("tv", builtin, y, 0.02)
    function_op = FunctionOperator(conv, (3, 32, 32), (3, 32, 32))
    physics_op = from_deepinv_physics(Blur())
    for op in (function_op, physics_op):
        out = B.restore_classical("tv", op, y, 0.02)
        assert out.dtype == y.dtype
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)  # the float64 iterates keep the numerics
        assert mse(out, x) < 0.5 * mse(y, x)
    assert B.operator_dtype(function_op) == B.operator_dtype(physics_op) == torch.float32
    assert B.operator_dtype(builtin) == torch.float64

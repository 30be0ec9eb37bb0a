"""Bring your own prior or operator: DenoiserPrior, FunctionOperator, the sigma_max refusal, the
deepinv bridges (duck-typed fakes shaped like deepinv's physics and denoisers) and --prior
module:function. Tiny images (12-24 px), a hand-written smoothing denoiser."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nfc_dps import restore
from nfc_dps.interop import DeepinvSolver, from_deepinv_denoiser, from_deepinv_physics
from nfc_dps.operators import FunctionOperator, LinearOperator, build_operator
from nfc_dps.priors import DenoiserPrior, Prior
from nfc_dps.samplers import get_config
from nfc_dps.samplers.common import schedule_top

SIGMA_MAX = 50 / 255  # DRUNet's range, [0, 1] units


def smoothing_denoiser(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """A Gaussian denoiser in deepinv's convention: x in [0, 1] (plus noise), sigma (B,) in [0, 1]
    units -> a blend of x and its 3 x 3 mean, more of the mean at larger sigma."""
    w = (sigma**2 / (sigma**2 + 0.003)).view(-1, 1, 1, 1)
    return (1 - w) * x + w * F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)


class HandWrittenPrior(Prior):
    """The same function as a Prior subclass written by hand: units converted in place."""

    channels, sigma_min, sigma_max, denoiser_only = 3, 0.0, 2 * SIGMA_MAX, True

    def denoise(self, x, sigma):
        return 2 * smoothing_denoiser((x + 1) / 2, sigma / 2) - 1


class Counting:
    def __init__(self, fn):
        self.fn, self.calls, self.sigmas = fn, 0, []

    def __call__(self, x, sigma):
        self.calls += 1
        self.sigmas.append(sigma.clone())
        return self.fn(x, sigma)


def image(h: int = 16, w: int = 16, c: int = 3, phase: float = 0.0) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    x = torch.stack([xx, yy, 0.5 + 0.3 * torch.sin(6 * xx + phase)])[:c]
    return x[None].float()


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b) ** 2).mean())


def blur_problem(size: int = 16, sigma_y: float = 0.02):
    x = image(size, size)
    op = build_operator("deblur_gaussian", image_size=(size, size), kernel_size=5, kernel_std=1.0, boundary="circular")
    return x, op, op.measure(x, sigma_y, torch.Generator().manual_seed(1)), sigma_y


def random_matrix_operator(shape=(3, 12, 12), seed: int = 0, adjoint: bool = False) -> tuple[FunctionOperator, torch.Tensor]:
    """A compressed-sensing-like map: a Gaussian matrix to 300 values seen as (1, 300, 1)."""
    n = shape[0] * shape[1] * shape[2]
    matrix = torch.randn((300, n), generator=torch.Generator().manual_seed(seed)) / n**0.5
    fn = lambda x: (x.flatten(1) @ matrix.T).view(-1, 1, 300, 1)  # noqa: E731
    back = (lambda y: (y.flatten(1) @ matrix).view(-1, *shape)) if adjoint else None  # noqa: E731
    return FunctionOperator(fn, shape, (1, 300, 1), back), matrix


# ---------------------------------------------------------------- DenoiserPrior


def test_denoiser_prior_converts_units_once():
    fn = Counting(smoothing_denoiser)
    prior = DenoiserPrior(fn, SIGMA_MAX)
    assert prior.sigma_max == pytest.approx(2 * SIGMA_MAX) and prior.sigma_min == 0.0 and prior.denoiser_only
    x_m = torch.rand(2, 3, 8, 8) * 2 - 1
    s_m = torch.tensor([0.1, 0.3])
    out = prior(x_m, s_m)
    torch.testing.assert_close(fn.sigmas[0], s_m / 2)  # fn sees [0, 1]-unit sigma, (B,)
    torch.testing.assert_close(out, 2 * smoothing_denoiser((x_m + 1) / 2, s_m / 2) - 1)
    floored = Counting(smoothing_denoiser)
    DenoiserPrior(floored, SIGMA_MAX, sigma_min=0.1)(x_m, s_m)
    torch.testing.assert_close(floored.sigmas[0], torch.tensor([0.1, 0.15]))  # never called below sigma_min


@pytest.mark.parametrize("bad", [dict(sigma_max=0.0), dict(sigma_max=float("nan")), dict(sigma_max=0.1, sigma_min=0.2),
                                 dict(sigma_max=0.1, channels=0), dict(sigma_max=0.1, size_multiple=2.5)])
def test_denoiser_prior_refuses_bad_settings(bad):
    with pytest.raises(ValueError, match=next(iter(k for k in bad if k != "sigma_max"), "sigma_max")):
        DenoiserPrior(smoothing_denoiser, **bad)


@pytest.mark.parametrize("method", ["nfc", "dpir"])
def test_denoiser_prior_restores_with_nfc_default_and_dpir(method):
    x, op, y, sigma_y = blur_problem()
    out = restore(y, op, DenoiserPrior(smoothing_denoiser, SIGMA_MAX), method=method, sigma_y=sigma_y, progress=False)
    assert out.image.shape == x.shape
    assert mse(out.image, x) < 0.5 * mse(y, x)  # the blurred, noisy measurement is twice as far


@pytest.mark.parametrize("method", ["nfc", "dpir"])
def test_denoiser_prior_gives_the_numbers_of_a_hand_written_prior(method):
    x, op, y, sigma_y = blur_problem()
    fn = Counting(smoothing_denoiser)
    wrapped = restore(y, op, DenoiserPrior(fn, SIGMA_MAX), method=method, sigma_y=sigma_y, progress=False)
    by_hand = restore(y, op, HandWrittenPrior(), method=method, sigma_y=sigma_y, progress=False)
    torch.testing.assert_close(wrapped.image, by_hand.image, rtol=0, atol=1e-6)
    assert wrapped.nfe == by_hand.nfe == fn.calls  # one call of fn per network evaluation


@pytest.mark.parametrize("method,preset", [("daps", None), ("dps", None), ("nfc", "fast"), ("nfc", "paper"),
                                           ("nfc", "fast_psnr"), ("diffpir", None), ("ddnm", None), ("ddrm", None)])
def test_diffusion_methods_refuse_a_denoiser_only_prior_before_starting(method, preset):
    x, op, y, sigma_y = blur_problem()
    fn = Counting(smoothing_denoiser)
    with pytest.raises(ValueError, match="denoiser only") as info:
        restore(y, op, DenoiserPrior(fn, SIGMA_MAX), method=method, preset=preset, sigma_y=sigma_y, progress=False)
    message = str(info.value)
    assert "0.1961] in [0, 1] units" in message  # the prior's range
    assert "'nfc' with its default preset 'deterministic'" in message and "'dpir'" in message
    assert fn.calls == 0


def test_a_denoiser_below_dpirs_first_level_is_told_the_sigma_max_to_pass():
    x, op, y, sigma_y = blur_problem()
    prior = DenoiserPrior(smoothing_denoiser, 25 / 255)
    with pytest.raises(ValueError, match=r"pass sigma_max=0\.1961"):
        restore(y, op, prior, method="dpir", sigma_y=sigma_y, progress=False)
    out = restore(y, op, prior, method="dpir", sigma_y=sigma_y, progress=False, sigma_max=2 * 25 / 255)
    assert mse(out.image, x) < mse(y, x)


def test_diffusion_priors_keep_the_capped_schedule():
    """A diffusion prior (denoiser_only False) caps a higher schedule at its sigma_max, as before."""
    diffusion = DenoiserPrior(smoothing_denoiser, 40.0, denoiser_only=False)
    assert schedule_top(diffusion, 157.0) == 80.0 and schedule_top(diffusion, 1.0) == 1.0
    denoiser = DenoiserPrior(smoothing_denoiser, SIGMA_MAX)
    assert schedule_top(denoiser, 0.3) == 0.3
    with pytest.raises(ValueError, match="denoiser only"):
        schedule_top(denoiser, 0.4)


def test_a_denoiser_whose_range_covers_the_schedule_runs_any_method():
    """The refusal is about the range, not the type: a denoiser-only prior up to sigma 1 ([0, 1]
    units, 2 in model units) runs DAPS started at that level."""
    x, op, y, sigma_y = blur_problem()
    wide = DenoiserPrior(smoothing_denoiser, 1.0)
    out = restore(y, op, wide, method="daps", sigma_y=sigma_y, progress=False, num_levels=2, ode_steps=1,
                  langevin_steps=2, sigma_max=2.0)
    assert torch.isfinite(out.image).all()


# ---------------------------------------------------------------- FunctionOperator


def test_function_operator_autograd_adjoint_is_the_transpose():
    op, matrix = random_matrix_operator()
    y = torch.randn(2, 1, 300, 1)
    torch.testing.assert_close(op.A_adjoint(y), (y.flatten(1) @ matrix).view(2, 3, 12, 12), rtol=1e-5, atol=1e-5)
    assert op.image_shape((2, 1, 300, 1)) == (2, 3, 12, 12) and op.measurement_shape((5, 3, 12, 12)) == (5, 1, 300, 1)
    assert op.describe()["adjoint"] == "autograd"


def test_function_operator_refuses_bad_input():
    op, matrix = random_matrix_operator()
    with pytest.raises(ValueError, match=r"shape \(B, 3, 12, 12\), got \(1, 3, 12, 11\)"):
        op.A(torch.zeros(1, 3, 12, 11))
    with pytest.raises(ValueError, match="not the adjoint"):
        FunctionOperator(lambda x: (x.flatten(1) @ matrix.T).view(-1, 1, 300, 1), (3, 12, 12), (1, 300, 1),
                         lambda y: 2 * (y.flatten(1) @ matrix).view(-1, 3, 12, 12))
    with pytest.raises(ValueError, match=r"A's output .* must have shape \(B, 1, 299, 1\)"):
        FunctionOperator(lambda x: (x.flatten(1) @ matrix.T).view(-1, 1, 300, 1), (3, 12, 12), (1, 299, 1))
    with pytest.raises(ValueError, match="family"):
        FunctionOperator(lambda x: x, (3, 4, 4), (3, 4, 4), family="blurry")


@pytest.mark.parametrize("method", ["nfc", "dpir"])
@pytest.mark.parametrize("adjoint", [False, True])
def test_function_operator_restores_with_nfc_default_and_dpir(method, adjoint):
    op, _ = random_matrix_operator(adjoint=adjoint)
    x = image(12, 12)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(2))
    out = restore(y, op, DenoiserPrior(smoothing_denoiser, SIGMA_MAX), method=method, sigma_y=0.01, progress=False)
    assert out.image.shape == x.shape
    # 300 values of 432 unknowns: the least-squares fit leaves the null space at 0; the prior fills it
    assert mse(out.image, x) < 0.25 * mse(op.A_pinv(y), x)


def test_a_function_operator_may_measure_fewer_channels_than_the_prior_models():
    """A mosaic to one channel of an RGB image: no gray replication, the image keeps 3 channels."""
    pattern = torch.zeros(3, 16, 16)
    pattern[0, 0::2, 0::2] = pattern[2, 1::2, 1::2] = 1
    pattern[1, 0::2, 1::2] = pattern[1, 1::2, 0::2] = 1
    op = FunctionOperator(lambda x: (x * pattern).sum(1, keepdim=True), (3, 16, 16), (1, 16, 16))
    x = image()
    y = op.measure(x, 0.01, torch.Generator().manual_seed(3))
    out = restore(y, op, DenoiserPrior(smoothing_denoiser, SIGMA_MAX), sigma_y=0.01, progress=False)
    assert out.image.shape == (1, 3, 16, 16)
    assert mse(out.image, x) < 0.5 * mse(op.A_adjoint(y), x)


# ---------------------------------------------------------------- deepinv-shaped fakes


class GaussianNoise(nn.Module):
    def __init__(self, sigma):
        super().__init__()
        self.sigma = sigma

    def forward(self, y):
        return y + self.sigma * torch.randn_like(y)


class FakeBlurPhysics(nn.Module):
    """deepinv's LinearPhysics shape: A, A_adjoint, noise_model; a circular 3 x 3 box blur."""

    def __init__(self, sigma=0.02):
        super().__init__()
        self.noise_model = GaussianNoise(sigma)

    def A(self, x):
        return sum(torch.roll(x, (i, j), (-2, -1)) for i in (-1, 0, 1) for j in (-1, 0, 1)) / 9

    def A_adjoint(self, y):
        return self.A(y)  # a symmetric kernel

    def forward(self, x):
        return self.noise_model(self.A(x))


class FakeCompressedSensing(nn.Module):
    """(B, m) measurements, as deepinv's CompressedSensing; no noise model."""

    def __init__(self, shape=(3, 12, 12), m=300):
        super().__init__()
        n = shape[0] * shape[1] * shape[2]
        self.shape = shape
        self.register_buffer("matrix", torch.randn((m, n), generator=torch.Generator().manual_seed(4)) / n**0.5)

    def A(self, x):
        return x.flatten(1) @ self.matrix.T

    def A_adjoint(self, y):
        return (y @ self.matrix).view(-1, *self.shape)


class FakeDecomposable(nn.Module):
    """deepinv's DecomposablePhysics shape: A = U diag(mask) V^T with U = I, V a random orthogonal
    matrix on the flattened image, singular values in [0, 1] with a quarter of them zero."""

    def __init__(self, shape=(3, 8, 8), sigma=0.01):
        super().__init__()
        n = shape[0] * shape[1] * shape[2]
        gen = torch.Generator().manual_seed(5)
        q, _ = torch.linalg.qr(torch.randn((n, n), generator=gen, dtype=torch.float64))
        self.register_buffer("q", q)
        mask = torch.rand(shape, generator=gen, dtype=torch.float64)
        mask[torch.rand(shape, generator=gen) < 0.25] = 0
        self.register_buffer("mask", mask[None])
        self.noise_model = GaussianNoise(torch.tensor([sigma]))

    def V_adjoint(self, x):
        return (x.flatten(1) @ self.q.to(x.dtype).T).view(x.shape)

    def V(self, c):
        return (c.flatten(1) @ self.q.to(c.dtype)).view(c.shape)

    def U(self, c):
        return c

    def U_adjoint(self, y):
        return y

    def A(self, x):
        return self.U(self.mask.to(x.dtype) * self.V_adjoint(x))

    def A_adjoint(self, y):
        return self.V(self.mask.to(y.dtype) * self.U_adjoint(y))


class FakeDenoiser(nn.Module):
    """deepinv's Denoiser shape: forward(x, sigma) in [0, 1] units, ``in_channels``."""

    in_channels = 3

    def __init__(self):
        super().__init__()
        self.sigmas = []

    def forward(self, x, sigma):
        self.sigmas.append(sigma)
        return smoothing_denoiser(x, sigma)


def test_from_deepinv_physics_reads_the_noise_and_the_shapes():
    op = from_deepinv_physics(FakeBlurPhysics(sigma=0.03))
    assert isinstance(op, LinearOperator) and op.sigma_y == 0.03 and not op.decomposable
    assert op.image_shape((2, 3, 16, 16)) == (2, 3, 16, 16)
    cs = from_deepinv_physics(FakeCompressedSensing())
    assert cs.sigma_y is None
    y = cs.as_measurement(cs.physics.A(image(12, 12)))
    assert y.shape == (1, 1, 300, 1) and cs.image_shape(y.shape) == (1, 3, 12, 12)
    x = torch.randn(2, 3, 12, 12)
    yy = torch.randn(2, 1, 300, 1)
    assert float((cs.A(x) * yy).sum()) == pytest.approx(float((x * cs.A_adjoint(yy)).sum()), rel=1e-4)
    assert from_deepinv_physics(FakeDecomposable(sigma=0.01)).sigma_y == pytest.approx(0.01)
    class NonLinear(nn.Module):  # deepinv's Physics without A_adjoint
        def A(self, x):
            return x**2

    with pytest.raises(TypeError, match="callable A_adjoint"):
        from_deepinv_physics(NonLinear())


def test_a_decomposable_physics_keeps_its_svd():
    physics = FakeDecomposable()
    op = from_deepinv_physics(physics)
    assert op.decomposable
    gen = torch.Generator().manual_seed(6)
    x = torch.randn((2, 3, 8, 8), generator=gen, dtype=torch.float64)
    ax = op.A(x)
    torch.testing.assert_close(op.A(op.A_pinv(ax)), ax)  # A A+ A = A, in closed form
    z = torch.randn_like(x)
    y = torch.randn_like(ax)
    for sigma_y, r in ((0.05, 0.3), (0.5, 2.0)):
        p = op.prox(y, z, sigma_y, r)
        grad = op.A_adjoint(op.A(p) - y) / sigma_y**2 + (p - z) / r**2
        assert float(grad.norm()) <= 1e-9 * float((op.A_adjoint(y) / sigma_y**2 + z / r**2).norm())
        torch.testing.assert_close(p, LinearOperator.prox(op, y, z, sigma_y, r, max_iter=500, tol=1e-12))
    torch.testing.assert_close(op.normal(x), op.A_adjoint(op.A(x)))


def test_from_deepinv_denoiser_is_a_denoiser_prior():
    model = FakeDenoiser()
    prior = from_deepinv_denoiser(model, SIGMA_MAX)
    assert isinstance(prior, DenoiserPrior) and prior.channels == 3 and prior.denoiser_only
    assert any(m is model for m in prior.modules())  # moves with .to(device)
    x_m, s_m = torch.rand(2, 3, 8, 8) * 2 - 1, torch.tensor([0.2, 0.3])
    torch.testing.assert_close(prior(x_m, s_m), 2 * smoothing_denoiser((x_m + 1) / 2, s_m / 2) - 1)
    torch.testing.assert_close(model.sigmas[-1], s_m / 2)


@pytest.mark.parametrize("make_physics,shape", [(FakeBlurPhysics, (3, 16, 16)), (FakeDecomposable, (3, 8, 8))])
def test_deepinv_solver_restores_from_physics(make_physics, shape):
    physics = make_physics()
    x = image(*shape[1:]).expand(2, -1, -1, -1).contiguous()
    torch.manual_seed(7)
    y = physics(x) if isinstance(physics, FakeBlurPhysics) else physics.A(x) + 0.01 * torch.randn_like(physics.A(x))
    solver = DeepinvSolver(from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX))
    assert isinstance(solver, nn.Module)
    out = solver(y, physics)
    assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 1
    assert mse(out, x) < 0.5 * mse(from_deepinv_physics(physics).A_pinv(y).clamp(0, 1), x)


def test_deepinv_solver_on_vector_measurements_with_a_given_sigma():
    physics = FakeCompressedSensing()
    x = image(12, 12)
    y = physics.A(x) + 0.01 * torch.randn(1, 300, generator=torch.Generator().manual_seed(8))
    solver = DeepinvSolver(from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX), method="dpir")
    with pytest.raises(ValueError, match="sigma_y"):
        solver(y, physics)
    out = DeepinvSolver(from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX), method="dpir", sigma_y=0.01)(y, physics)
    assert out.shape == (1, 3, 12, 12)
    assert mse(out, x) < 0.25 * mse(from_deepinv_physics(physics).A_adjoint(y), x)


def test_deepinv_solver_checks_its_settings_up_front():
    prior = from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX)
    with pytest.raises(ValueError, match="unknown method"):
        DeepinvSolver(prior, method="nope")
    with pytest.raises(ValueError, match="unknown nfc config keys"):
        DeepinvSolver(prior, num_levles=3)
    assert DeepinvSolver(prior, num_levels=3).config == get_config("nfc", num_levels=3)
    with pytest.raises(TypeError, match="Prior"):
        DeepinvSolver(FakeDenoiser())
    with pytest.raises(ValueError, match="denoiser only"):
        DeepinvSolver(prior, method="daps")(torch.rand(1, 3, 16, 16), FakeBlurPhysics())


class Inpainting(nn.Module):
    """deepinv's Inpainting shape (the class name matters): a 0/1 ``mask`` parameter (1, C, H, W),
    the same for every channel unless ``per_channel``; A = mask * x, decomposable with U = V = I."""

    def __init__(self, shape=(3, 16, 16), sigma=0.01, per_channel=False):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        mask = (torch.rand(shape if per_channel else shape[1:], generator=gen) > 0.6).float().expand(shape)
        self.mask = nn.Parameter(mask.clone()[None], requires_grad=False)
        self.noise_model = GaussianNoise(sigma)

    def A(self, x):
        return self.mask * x

    def A_adjoint(self, y):
        return self.mask * y

    def U(self, c):
        return c

    def U_adjoint(self, c):
        return c

    def V(self, c):
        return c

    def V_adjoint(self, c):
        return c


def test_a_deepinv_inpainting_physics_is_inpainting():
    """Its family and pixel mask are the built-in operator's: DPIR through DeepinvSolver starts
    from the interpolation of the observed pixels and gives the built-in's restoration."""
    from nfc_dps.operators import Inpainting as BuiltinInpainting

    physics = Inpainting()
    op = from_deepinv_physics(physics)
    assert op.family == "inpaint"
    torch.testing.assert_close(op.pixel_mask(), physics.mask[0, 0])
    x = image(16, 16)
    y = physics.A(x) + 0.01 * physics.mask * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    out = DeepinvSolver(from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX), method="dpir")(y, physics)
    builtin = restore(y, BuiltinInpainting(physics.mask[0, 0]), DenoiserPrior(smoothing_denoiser, SIGMA_MAX),
                      method="dpir", sigma_y=0.01, progress=False)
    torch.testing.assert_close(out, builtin.image, rtol=0, atol=1e-5)
    # a mask that differs between channels is no pixel mask; another class name is no inpainting
    assert from_deepinv_physics(Inpainting(per_channel=True)).family == "other"
    assert from_deepinv_physics(FakeBlurPhysics()).family == "other"
    assert from_deepinv_physics(FakeBlurPhysics()).pixel_mask() is None


class TVDenoiser(nn.Module):
    """deepinv's TVDenoiser shape: ``forward(y, ths)``, a regularisation weight."""

    def forward(self, y, ths):
        return smoothing_denoiser(y, ths)


class WaveletDenoiser(TVDenoiser):
    """deepinv's WaveletDenoiser shape: ``forward(x, ths)``, a wavelet threshold."""


class MyTV(TVDenoiser):
    """A user's subclass of it."""


@pytest.mark.parametrize("model", [TVDenoiser(), WaveletDenoiser(), MyTV()])
def test_from_deepinv_denoiser_refuses_threshold_denoisers(model):
    with pytest.raises(ValueError, match=r"(TVDenoiser|WaveletDenoiser) .*threshold, not the noise std"):
        from_deepinv_denoiser(model, SIGMA_MAX)
    # the refusal's own way out: a function from the std to the threshold
    prior = DenoiserPrior(lambda x, sigma: model(x, 0.5 * sigma), SIGMA_MAX)
    assert prior(torch.zeros(1, 3, 8, 8), torch.tensor([0.2])).shape == (1, 3, 8, 8)


@pytest.mark.parametrize("sigma_max", [75, 50.0, torch.tensor(75.0)])
def test_a_denoisers_sigma_max_in_0_255_units_is_refused(sigma_max):
    with pytest.raises(ValueError, match=r"sigma_max must be in \(0, 1\].*got 75|sigma_max must be in \(0, 1\].*got 50"):
        DenoiserPrior(smoothing_denoiser, sigma_max)
    with pytest.raises(ValueError, match="divide by 255"):
        from_deepinv_denoiser(FakeDenoiser(), sigma_max)
    assert DenoiserPrior(smoothing_denoiser, sigma_max, denoiser_only=False).sigma_max == 2 * float(sigma_max)


def test_a_0d_tensor_sigma_max_is_a_number():
    prior = DenoiserPrior(smoothing_denoiser, torch.tensor(SIGMA_MAX), sigma_min=torch.tensor(0.01))
    assert type(prior.sigma_max) is float and prior.sigma_max == pytest.approx(2 * SIGMA_MAX)
    assert type(prior.sigma_min) is float and prior.sigma_min == pytest.approx(0.02)
    assert "0.196" in repr(prior)
    x, op, y, sigma_y = blur_problem()
    out = restore(y, op, prior, method="dpir", sigma_y=sigma_y, progress=False)
    assert mse(out.image, x) < mse(y, x)


# ---------------------------------------------------------------- --prior module:function


FACTORY = '''
import torch.nn.functional as F
from nfc_dps.priors import DenoiserPrior


def smooth(x, sigma):
    w = (sigma**2 / (sigma**2 + 0.003)).view(-1, 1, 1, 1)
    return (1 - w) * x + w * F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)


def make_prior():
    return DenoiserPrior(smooth, 50 / 255)


def not_a_prior():
    return smooth
'''


def test_cli_prior_factory(tmp_path, monkeypatch, capsys):
    from nfc_dps.cli import main
    from nfc_dps.cli.common import UsageError, open_prior, prior_key
    from nfc_dps.io import read_image, write_image

    (tmp_path / "my_priors_for_test.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_priors_for_test", raising=False)
    prior = open_prior("my_priors_for_test:make_prior", torch.device("cpu"))
    assert isinstance(prior, DenoiserPrior)
    key = prior_key("my_priors_for_test:make_prior")
    assert key["path"] == "my_priors_for_test:make_prior" and list(key["files"]) == [
        str((tmp_path / "my_priors_for_test.py").resolve())]
    with pytest.raises(UsageError, match="not a nfc_dps Prior"):
        open_prior("my_priors_for_test:not_a_prior", torch.device("cpu"))
    with pytest.raises(UsageError, match="cannot load the prior factory"):
        open_prior("my_priors_for_test:missing", torch.device("cpu"))

    (tmp_path / "in").mkdir()
    write_image(tmp_path / "in" / "a.png", image().squeeze(0).permute(1, 2, 0).numpy())
    argv = ["restore", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--task", "denoise",
            "--prior", "my_priors_for_test:make_prior", "--quiet"]
    assert main(argv) == 0
    assert read_image(tmp_path / "out" / "a.png")[0].shape == (16, 16, 3)
    assert main(argv) == 0  # resume: the same factory, nothing to redo
    assert "skipped" in (tmp_path / "out" / "results.csv").read_text()
    capsys.readouterr()
    assert main(argv + ["--method", "daps", "-o", str(tmp_path / "out2")]) == 2  # refused once, before any output
    err = capsys.readouterr().err
    assert "--method daps with this prior" in err and "denoiser only" in err and "FAILED" not in err
    assert not (tmp_path / "out2" / "a.png").exists()


def test_the_runnable_examples_of_the_docs_page_run():
    """docs/bring_your_own.md: the examples that start with ``import torch`` (the others need
    deepinv or are signatures), in order, in one namespace."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "bring_your_own.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("import torch")]
    assert len(blocks) == 2 and all("deepinv" not in b for b in blocks)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block.replace("sigma_y=0.02)", "sigma_y=0.02, progress=False)")
                     .replace("sigma_y=0.01)", "sigma_y=0.01, progress=False)"), "bring_your_own.md", "exec"), namespace)
        assert torch.isfinite(namespace["out"].image).all()
    assert namespace["out"].image.shape == (1, 3, 12, 12)


class PoissonNoise(nn.Module):
    """deepinv's PoissonNoise shape: y = gain * Poisson(x / gain)."""

    def __init__(self, gain):
        super().__init__()
        self.gain = gain

    def forward(self, x):
        return self.gain * torch.poisson(x.clamp_min(0) / self.gain, generator=torch.Generator().manual_seed(0))


def test_deepinv_solver_takes_a_poisson_physics_and_nfc_dps_operators():
    """A physics with deepinv's PoissonNoise is restored under nfc_dps's PoissonNoise(1 / gain); an
    nfc_dps operator (a nonlinear one too) is taken as it is, with the solver's noise."""
    from nfc_dps import build_operator
    from nfc_dps.interop import physics_noise
    from nfc_dps.noise import PoissonNoise as NfcPoisson

    physics = FakeBlurPhysics()
    physics.noise_model = PoissonNoise(0.05)
    assert physics_noise(physics) == NfcPoisson(20.0)
    x = image(16, 16).expand(2, -1, -1, -1).contiguous()
    y = physics(x)
    prior = from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX)
    out = DeepinvSolver(prior)(y, physics)
    assert out.shape == x.shape and mse(out, x) < mse(y.clamp(0, 1), x)
    hdr = build_operator("hdr", 16)
    y = hdr.measure(x, 0.02, torch.Generator().manual_seed(0))
    out = DeepinvSolver(prior, noise=0.02)(y, hdr)
    assert out.shape == x.shape
    with pytest.raises(ValueError, match="carries no noise model"):
        DeepinvSolver(prior)(y, hdr)

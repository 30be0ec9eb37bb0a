"""Peer samplers (DPS, DiffPIR, DDNM+, DDRM) on tiny images with an exact Gaussian prior.

The prior is white Gaussian, x0 ~ N(0, s^2 I) in model units, whose MMSE denoiser is exact:
D(x, sigma) = x s^2 / (s^2 + sigma^2). For the denoising operator the posterior is closed form:
mean = y_m s^2 / (s^2 + sigma_m^2), variance v = s^2 sigma_m^2 / (s^2 + sigma_m^2), so a posterior
sample has per-pixel squared error 2 v.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nfc_dps.operators import BlurOperator, Denoising, Inpainting, SuperResolution, gaussian_kernel, random_mask
from nfc_dps.priors.base import Prior
from nfc_dps.samplers import Measurement
from nfc_dps.samplers import ddnm as ddnm_mod
from nfc_dps.samplers import ddrm as ddrm_mod
from nfc_dps.samplers import diffpir as diffpir_mod
from nfc_dps.samplers import dps as dps_mod
from nfc_dps.samplers.common import CountingPrior, to_image_units
from nfc_dps.samplers.ddnm import DDNMConfig, sample_ddnm
from nfc_dps.samplers.ddrm import DDRMConfig, sample_ddrm
from nfc_dps.samplers.diffpir import DiffPIRConfig, sample_diffpir
from nfc_dps.samplers.dps import DPSConfig, dps_guidance, sample_dps
from nfc_dps.schedules import sigma_grid, vp_sigma

PRIOR_STD = 0.5  # model units


class WhiteGaussianPrior(Prior):
    """Exact MMSE denoiser of N(0, std^2 I) (model units)."""

    def __init__(self, std: float = PRIOR_STD, channels: int = 3, sigma_max: float = 80.0) -> None:
        super().__init__()
        self.std, self.channels, self.sigma_max, self.sigma_min = std, channels, sigma_max, 0.002

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        v = self.std**2
        return x * (v / (v + sigma.view(-1, 1, 1, 1) ** 2))


def make_operator(name: str, h: int, w: int):
    if name == "blur_circular":
        return BlurOperator(gaussian_kernel(5, 1.0), boundary="circular")
    if name == "blur_reflect":
        return BlurOperator(gaussian_kernel(5, 1.0), boundary="reflect")
    if name == "sr_bicubic":
        return SuperResolution(2, method="bicubic")
    if name == "sr_average":
        return SuperResolution(2, method="average")
    if name == "inpainting":
        return Inpainting(random_mask(h, w, 0.5, generator=3))
    if name == "denoising":
        return Denoising()
    raise KeyError(name)


OPERATORS = ["blur_circular", "blur_reflect", "sr_bicubic", "sr_average", "inpainting", "denoising"]
DDRM_OPERATORS = {"blur_circular", "inpainting", "denoising"}

SAMPLERS = {
    "dps": (sample_dps, DPSConfig(num_steps=8)),
    "dps_fgps": (sample_dps, DPSConfig(num_steps=8, band="exponential")),
    "diffpir": (sample_diffpir, DiffPIRConfig(num_steps=8)),
    "ddnm_prox": (sample_ddnm, DDNMConfig(num_steps=8)),
    "ddnm_scaled": (sample_ddnm, DDNMConfig(num_steps=8, correction="scaled")),
    "ddrm": (sample_ddrm, DDRMConfig(num_steps=8)),
}


def gens(seeds):
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def problem(op_name: str, shape=(3, 3, 16, 16), sigma_y: float = 0.05, seed: int = 0):
    b, c, h, w = shape
    op = make_operator(op_name, h, w)
    g = torch.Generator().manual_seed(seed)
    x = ((PRIOR_STD * torch.randn(shape, generator=g)) + 1) / 2
    x[0] = x[0] * 3 - 1  # very different residual scales across the batch (per-image normalisation)
    y = op.measure(x, sigma_y, gens(range(100, 100 + b)))
    return op, x, y


# ------------------------------------------------------------------------------- all peers run


@pytest.mark.parametrize("op_name", OPERATORS)
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_runs_deterministic_batch_invariant(sampler, op_name):
    fn, cfg = SAMPLERS[sampler]
    shape = (3, 3, 16, 16)
    op, _, y = problem(op_name, shape)
    if sampler == "ddrm" and op_name not in DDRM_OPERATORS:
        with pytest.raises(ValueError, match="diagonalisable"):
            fn(WhiteGaussianPrior(), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([1, 2, 3]))
        return
    prior = CountingPrior(WhiteGaussianPrior())
    calls = []
    out = fn(prior, Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([1, 2, 3]), callback=calls.append)
    assert out.shape == shape and torch.isfinite(out).all()
    assert prior.nfe == cfg.nfe == cfg.num_steps
    assert [c["i"] for c in calls] == list(range(cfg.num_steps))
    assert set(calls[0]) >= {"i", "sigma", "x", "denoised"}
    again = fn(WhiteGaussianPrior(), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([1, 2, 3]))
    assert torch.equal(out, again)
    alone = fn(WhiteGaussianPrior(), Measurement(op, y[1:2], 0.05, (1, *shape[1:])).in_model_units(), cfg, gens([2]))
    torch.testing.assert_close(alone[0], out[1], atol=2e-5, rtol=1e-5)  # model units
    other_seed = fn(WhiteGaussianPrior(), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([7, 8, 9]))
    assert not torch.allclose(other_seed, out)


@pytest.mark.parametrize("sampler", ["dps", "diffpir", "ddnm_prox", "ddrm"])
def test_gray_non_square(sampler):
    fn, cfg = SAMPLERS[sampler]
    shape = (2, 1, 24, 32)
    op, _, y = problem("blur_circular" if sampler == "ddrm" else "sr_bicubic", shape)
    out = fn(WhiteGaussianPrior(channels=1), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([0, 1]))
    assert out.shape == shape and torch.isfinite(out).all()


# ------------------------------------------------------------------------------- exact-prior sanity


def denoising_problem(sigma_y: float, shape=(4, 1, 32, 32)):
    g = torch.Generator().manual_seed(0)
    x0 = PRIOR_STD * torch.randn(shape, generator=g)
    y = Denoising().measure((x0 + 1) / 2, sigma_y, g)
    sm = 2 * sigma_y
    post_var = PRIOR_STD**2 * sm**2 / (PRIOR_STD**2 + sm**2)
    gain = PRIOR_STD**2 / (PRIOR_STD**2 + sm**2)
    return x0, y, post_var, gain


def fit(out, y):
    """(x in model units, regression gain of x on y_m, variance of the residual x - gain y_m)."""
    om, ym = 2 * out - 1, 2 * y - 1
    gain = float((om * ym).sum() / (ym * ym).sum())
    return om, gain, float((om - gain * ym).var())


@pytest.mark.parametrize(
    "fn,cfg,err_max,gain_tol",
    [
        (sample_diffpir, DiffPIRConfig(num_steps=50), 1.3, 0.05),
        (sample_ddnm, DDNMConfig(num_steps=50), 1.3, 0.05),
        (sample_ddnm, DDNMConfig(num_steps=50, correction="scaled"), 1.3, 0.05),
        (sample_ddrm, DDRMConfig(num_steps=50), 1.3, 0.05),
        (sample_dps, DPSConfig(num_steps=1000, step_size=1.0), 2.5, 0.05),
    ],
    ids=["diffpir", "ddnm_prox", "ddnm_scaled", "ddrm", "dps"],
)
def test_gaussian_denoising_is_sane(fn, cfg, err_max, gain_tol):
    """Posterior-sample error is 2v and the output's gain on y is s^2/(s^2+sigma^2); each peer
    must land near it (within err_max x 2v, gain within gain_tol + its bias toward y). At this low
    noise the posterior is close to y (gain 0.96) and y itself passes: this bounds the error only;
    the next test checks that the peers denoise."""
    x0, y, v, gain = denoising_problem(0.05)
    out = to_image_units(fn(WhiteGaussianPrior(channels=1), Measurement(Denoising(), y, 0.05, x0.shape).in_model_units(),
                            cfg, gens(range(4))))
    om, g, _ = fit(out, y)
    err = float(((om - x0) ** 2).mean())
    assert err < err_max * 2 * v
    assert gain - gain_tol < g < 1.0 + gain_tol  # between the posterior mean's gain and y itself


@pytest.mark.parametrize(
    "fn,cfg",
    [
        (sample_diffpir, DiffPIRConfig(num_steps=50)),
        (sample_ddnm, DDNMConfig(num_steps=50)),
        (sample_ddnm, DDNMConfig(num_steps=50, correction="scaled")),
        (sample_ddrm, DDRMConfig(num_steps=50)),
    ],
    ids=["diffpir", "ddnm_prox", "ddnm_scaled", "ddrm"],
)
def test_gaussian_denoising_at_high_noise_moves_away_from_y(fn, cfg):
    """sigma_y = 0.5 in [0, 1] units (1 in model units, twice the prior's std): the posterior's
    gain on y is 0.2 and an exact posterior sample's error 2v = 0.4, while y itself has gain 1 and
    error 1.0. Measured gains 0.23-0.54 and errors 0.69-0.94 x 2v. (DPS at step size 1 follows the
    measurement here, gain 1.00: its step is tuned for low noise, so it is not in this test.)"""
    x0, y, v, gain = denoising_problem(0.5)
    out = to_image_units(fn(WhiteGaussianPrior(channels=1), Measurement(Denoising(), y, 0.5, x0.shape).in_model_units(),
                            cfg, gens(range(4))))
    om, g, _ = fit(out, y)
    err = float(((om - x0) ** 2).mean())
    assert err < 1.1 * 2 * v, err / (2 * v)
    assert gain - 0.05 < g < 0.6, g


def test_diffpir_matches_posterior_spread():
    """At sigma_y = 0.5 ([0, 1] units) the posterior is far from y (gain 0.2 against y's 1): DiffPIR's
    samples have its gain (measured 0.23) and its spread (residual variance 0.86 v)."""
    x0, y, v, gain = denoising_problem(0.5)
    out = to_image_units(sample_diffpir(WhiteGaussianPrior(channels=1), Measurement(Denoising(), y, 0.5, x0.shape).in_model_units(),
                         DiffPIRConfig(num_steps=50), gens(range(4))))
    om, g, resid = fit(out, y)
    assert abs(g - gain) < 0.05, g
    assert 0.6 * v < resid < 1.5 * v, resid / v  # the posterior spread, not a point estimate


def test_dps_unconditional_is_the_prior():
    """step_size = 0: DPS is DDPM ancestral sampling; with the exact denoiser and 1000 steps the
    samples have the prior's variance, and the measurement is ignored."""
    shape = (2, 1, 32, 32)
    op, _, y = problem("denoising", shape)
    cfg = DPSConfig(num_steps=1000, step_size=0.0)
    out = to_image_units(sample_dps(WhiteGaussianPrior(channels=1), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([0, 1])))
    assert abs(float((2 * out - 1).var()) / PRIOR_STD**2 - 1) < 0.05
    out2 = to_image_units(sample_dps(WhiteGaussianPrior(channels=1), Measurement(op, 1 - y, 0.05, shape).in_model_units(),
                                     cfg, gens([0, 1])))
    assert torch.equal(out, out2)


def test_dps_gradient_is_normalised_per_image():
    """For the Gaussian prior, D = c x, so grad_x ||y - A D(x)|| = -c A^T r / ||r|| per image."""
    prior = WhiteGaussianPrior(channels=1)
    op = SuperResolution(2, "average")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1, 8, 8, generator=g) * 2
    y = torch.randn(3, 1, 4, 4, generator=g) * torch.tensor([1.0, 10.0, 100.0]).view(-1, 1, 1, 1)
    sigma = 1.3
    with torch.no_grad():  # the guidance turns autograd on itself
        x0, grad = dps_guidance(prior, op, y, x, sigma)
    c = PRIOR_STD**2 / (PRIOR_STD**2 + sigma**2)
    r = y - op.A(c * x)
    expected = -c * op.A_adjoint(r) / r.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    torch.testing.assert_close(x0, c * x)
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)


def test_dps_step_is_applied_in_vp_units():
    """One step from sigma_0 to 0: x = x0_hat - zeta * g / (sqrt(abar_0) sqrt(abar_-1)), and
    sqrt(abar) = 1 / sqrt(1 + sigma^2), i.e. the VE gradient scaled by sqrt(1 + sigma_0^2)."""
    from nfc_dps.operators import randn_per_image

    shape = (2, 1, 8, 8)
    op, _, y = problem("sr_average", shape)
    prior = WhiteGaussianPrior(channels=1, sigma_max=3.0)
    base = to_image_units(sample_dps(prior, Measurement(op, y, 0.05, shape).in_model_units(),
                                     DPSConfig(num_steps=1, step_size=0.0), gens([4, 5])))
    out = to_image_units(sample_dps(prior, Measurement(op, y, 0.05, shape).in_model_units(),
                                    DPSConfig(num_steps=1, step_size=0.7), gens([4, 5])))
    sigma0 = 3.0
    x_init = (1 + sigma0**2) ** 0.5 * randn_per_image(shape, gens([4, 5]))
    _, g = dps_guidance(prior, op, 2 * y - 1, x_init, sigma0)
    torch.testing.assert_close(2 * (out - base), -0.7 * (1 + sigma0**2) ** 0.5 * g, atol=1e-5, rtol=1e-4)


def test_diffpir_one_step_is_the_prox():
    """num_steps = 1 with the final data step: x = prox(y, D(x_0, sigma_0), sigma_y, sigma_0 / sqrt(lam))."""
    from nfc_dps.operators import randn_per_image

    shape = (2, 3, 16, 16)
    op, _, y = problem("blur_circular", shape)
    prior = WhiteGaussianPrior(sigma_max=2.0)
    cfg = DiffPIRConfig(num_steps=1, lam=3.0, final_data_step=True)
    out = to_image_units(sample_diffpir(prior, Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([4, 5])))
    x_init = 2.0 * randn_per_image(shape, gens([4, 5]))
    expected = op.prox(2 * y - 1, prior(x_init, 2.0), 0.1, 2.0 / 3.0**0.5)
    torch.testing.assert_close(2 * out - 1, expected, atol=1e-5, rtol=1e-5)


def test_dps_fgps_band_schedule():
    cfg = DPSConfig(band="exponential")
    cuts = [cfg.band_cutoff(t) for t in (999, 800, 500, 0)]
    assert cuts[0] == pytest.approx(10 / 181) and cuts == sorted(cuts)
    assert cuts[-1] == pytest.approx(75 / 181, rel=0.01) and cuts[1] * 181 == pytest.approx(51.5, abs=1.0)
    lin = DPSConfig(band="linear")
    assert lin.band_cutoff(999) == pytest.approx(10 / 181) and lin.band_cutoff(0) == pytest.approx(75 / 181)


@pytest.mark.parametrize("op_name", ["inpainting", "sr_average", "sr_bicubic", "blur_circular", "denoising"])
@pytest.mark.parametrize("correction", ["prox", "scaled"])
def test_ddnm_is_consistent_without_noise(op_name, correction):
    shape = (2, 3, 16, 16)
    op, _, y = problem(op_name, shape, sigma_y=0.0)
    out = to_image_units(sample_ddnm(WhiteGaussianPrior(), Measurement(op, y, 0.0, shape).in_model_units(),
                                     DDNMConfig(num_steps=10, correction=correction), gens([0, 1])))
    rel = (op.A(out) - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1)
    assert float(rel.max()) < 1e-3


@pytest.mark.parametrize("op_name", ["inpainting", "denoising"])
def test_ddrm_is_consistent_without_noise(op_name):
    shape = (2, 3, 16, 16)
    op, _, y = problem(op_name, shape, sigma_y=0.0)
    out = to_image_units(sample_ddrm(WhiteGaussianPrior(), Measurement(op, y, 0.0, shape).in_model_units(),
                                     DDRMConfig(num_steps=10), gens([0, 1])))
    rel = (op.A(out) - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1)
    assert float(rel.max()) < 1e-4


def test_ddrm_blur_keeps_observed_frequencies():
    """Circulant blur, no noise: frequencies with |H| above the cutoff come from y exactly."""
    shape = (1, 1, 16, 16)
    op, _, y = problem("blur_circular", shape, sigma_y=0.0)
    cfg = DDRMConfig(num_steps=10)
    out = to_image_units(sample_ddrm(WhiteGaussianPrior(channels=1), Measurement(op, y, 0.0, shape).in_model_units(), cfg, gens([0])))
    H = op.transfer_function(16, 16)
    keep = H.abs() > cfg.singular_cutoff
    Fy, FAx = torch.fft.fft2(2 * y - 1), torch.fft.fft2(op.A(2 * out - 1))
    torch.testing.assert_close(FAx[..., keep], Fy[..., keep], atol=1e-3, rtol=1e-3)


# ------------------------------------------------------------------------------- grids and configs


def test_sigma_grid():
    sig, ts = sigma_grid(1000, 1e9, "uniform")
    assert len(sig) == 1001 and sig[-1] == 0 and ts[0] == 999 and ts[-1] == 0
    assert sig[0] == pytest.approx(157.4, abs=0.5) and sig[-2] == pytest.approx(0.01, rel=1e-3)
    assert all(a > b for a, b in zip(sig[:-1], sig[1:]))
    for schedule in ("uniform", "quad", "karras"):
        sig, _ = sigma_grid(7, 80.0, schedule)
        assert len(sig) == 8 and sig[0] == pytest.approx(80.0, rel=1e-6) and sig[-1] == 0
        assert all(a > b for a, b in zip(sig[:-1], sig[1:]))
    assert float(vp_sigma(0.5)) == pytest.approx((float(vp_sigma(0)) * float(vp_sigma(1))) ** 0.5)


def test_prior_sigma_max_is_respected():
    calls = []
    shape = (1, 3, 16, 16)
    op, _, y = problem("denoising", shape)
    for fn, cfg in [(sample_dps, DPSConfig(num_steps=4)), (sample_diffpir, DiffPIRConfig(num_steps=4)),
                    (sample_ddnm, DDNMConfig(num_steps=4)), (sample_ddrm, DDRMConfig(num_steps=4))]:
        calls.clear()
        fn(WhiteGaussianPrior(sigma_max=20.0), Measurement(op, y, 0.05, shape).in_model_units(), cfg, gens([0]), callback=calls.append)
        assert calls[0]["sigma"] == pytest.approx(20.0, rel=1e-6)


def test_presets_and_nfe():
    assert dps_mod.PRESETS["paper"].nfe == 1000 and dps_mod.PRESETS["fast"].nfe == 100
    assert diffpir_mod.PRESETS["paper"].nfe == 100 and diffpir_mod.PRESETS["fast"].nfe == 100
    assert ddnm_mod.PRESETS["paper"].nfe == 100 and ddnm_mod.PRESETS["fast"].nfe == 100
    assert ddrm_mod.PRESETS["paper"].nfe == 20 and ddrm_mod.PRESETS["fast"].nfe == 100
    for mod in (dps_mod, diffpir_mod, ddnm_mod, ddrm_mod):
        assert set(mod.PRESETS) == {"paper", "fast"}
        for cfg in mod.PRESETS.values():
            with pytest.raises(dataclasses.FrozenInstanceError):
                cfg.num_steps = 3


@pytest.mark.parametrize(
    "cls,kwargs,field",
    [
        (DPSConfig, {"num_steps": 0}, "num_steps"),
        (DPSConfig, {"num_steps": 2.5}, "num_steps"),
        (DPSConfig, {"step_size": -1.0}, "step_size"),
        (DPSConfig, {"sigma_max": 0.0}, "sigma_max"),
        (DPSConfig, {"schedule": "cosine"}, "schedule"),
        (DPSConfig, {"variance": "learned"}, "variance"),
        (DPSConfig, {"band": "gaussian"}, "band"),
        (DPSConfig, {"band_start": 0.5, "band_end": 0.2}, "band_start"),
        (DiffPIRConfig, {"num_steps": -3}, "num_steps"),
        (DiffPIRConfig, {"lam": 0.0}, "lam"),
        (DiffPIRConfig, {"zeta": 1.5}, "zeta"),
        (DiffPIRConfig, {"schedule": "linear"}, "schedule"),
        (DDNMConfig, {"eta": -0.1}, "eta"),
        (DDNMConfig, {"correction": "none"}, "correction"),
        (DDRMConfig, {"eta_b": 2.0}, "eta_b"),
        (DDRMConfig, {"singular_cutoff": -1.0}, "singular_cutoff"),
    ],
)
def test_config_validation(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_ddnm_scaled_rule_on_blur_is_per_frequency():
    """DDNM+'s rule in its SVD form: one lambda per frequency, so the small |H| of a strong blur
    never amplify the noise; with H = 1 it is the scalar rule; on a mask's decomposition the
    unobserved pixels are dropped (no correction, the full noise level)."""
    from nfc_dps.operators import BlurOperator, Denoising, gaussian_kernel
    from nfc_dps.priors.gaussian import GaussianSpectralPrior
    from nfc_dps.samplers.ddnm import DDNMConfig, sample_ddnm, scaled_rule

    r = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    identity = Denoising().decomposition()
    corr, gamma = scaled_rule(identity, r, 0.03, 0.05, 3e-2)
    assert torch.allclose(corr, 0.6 * r) and torch.allclose(gamma, torch.zeros_like(gamma))  # lam = 0.03/0.05
    corr, gamma = scaled_rule(identity, r, 0.4, 0.05, 3e-2)
    assert torch.allclose(corr, r) and torch.allclose(gamma, torch.full_like(gamma, (0.4**2 - 0.05**2) ** 0.5))
    mask = random_mask(8, 8, 0.5, 1).double()
    corr, gamma = scaled_rule(Inpainting(mask).decomposition(), r, 0.03, 0.05, 3e-2)
    assert torch.allclose(corr, 0.6 * mask * r) and torch.allclose(gamma, 0.03 * (1 - mask))

    prior = GaussianSpectralPrior((32, 32), alpha=2.0, pixel_std=0.5, channels=1)
    x = prior.sample(2, torch.Generator().manual_seed(0), dtype=torch.float64)
    op = BlurOperator(gaussian_kernel(13, 2.5), "circular")
    assert float(op.transfer_function(32, 32, dtype=torch.float64).abs().min()) < 1e-3
    y = (op.A(x) + 1) / 2 + 0.025 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    truth = (x + 1) / 2
    H = op.transfer_function(32, 32, dtype=torch.float64)
    mmse = float((prior.posterior_mean(2 * y - 1, H, 0.05) - x).square().mean()) / 4  # [0, 1] units
    for cutoff in (3e-2, 0.0):
        cfg = DDNMConfig(num_steps=30, correction="scaled", singular_cutoff=cutoff)
        out = to_image_units(sample_ddnm(prior, Measurement(op, y, 0.025, tuple(x.shape)).in_model_units(),
                                         cfg, [torch.Generator().manual_seed(2 + i) for i in range(2)]))
        assert float((out - truth).square().mean()) < 2.5 * mmse  # near an exact posterior sample's 2 x MMSE
    with pytest.raises(ValueError, match="singular_cutoff"):
        DDNMConfig(singular_cutoff=-1.0)


class _TruthPrior(Prior):
    """A denoiser that always answers the true image: what is left in x is the samplers' noise."""

    def __init__(self, truth: torch.Tensor) -> None:
        super().__init__()
        self.truth, self.channels, self.sigma_max, self.sigma_min = truth, truth.shape[1], 80.0, 0.002

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return self.truth.expand_as(x).to(x.dtype)


def test_ddnm_scaled_rule_counts_the_row_space_noise_of_average_sr() -> None:
    """A^+ n of 4x block averaging is nearest upsampling: std 4 sigma_y on each orthonormal
    direction of the row space. The scalar rule must count that, so that x at the next level holds
    noise of std sigma_next there (it held up to 3-4x that when the rule counted sigma_y)."""
    import torch.nn.functional as F

    from nfc_dps.samplers import image_generators

    op, f = SuperResolution(4, "average"), 4
    assert ddnm_mod.row_space_noise(op, 16, 16, 0.1) == pytest.approx(0.4)
    assert ddnm_mod.row_space_noise(Inpainting(random_mask(16, 16, 0.5, 0)), 16, 16, 0.1) == pytest.approx(0.1)
    assert ddnm_mod.row_space_noise(SuperResolution(4, "bicubic"), 16, 16, 0.1) == 0.1  # uneven: the approximation
    truth = torch.rand(1, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    b = 32
    y = op.measure(truth.expand(b, -1, -1, -1), 0.05, image_generators(range(b), 1))
    seen = []
    cfg = DDNMConfig(num_steps=50, eta=1.0, correction="scaled")
    sample_ddnm(_TruthPrior(2 * truth - 1), Measurement(op, y, 0.05, (b, 1, 16, 16)).in_model_units(),
                cfg, image_generators(range(100, 100 + b), 1),
                callback=lambda d: seen.append((d["i"], d["x"] - (2 * truth - 1))))
    sigmas, _ = sigma_grid(50, cfg.sigma_max, cfg.schedule)
    checked = 0
    for i, err in seen:
        if 0.05 < float(sigmas[i + 1]) < 0.5:  # below the measurement noise (0.1 in model units) x 4
            row = f * F.avg_pool2d(err, f)  # coordinates on the orthonormal row-space basis
            assert float(row.std()) == pytest.approx(float(sigmas[i + 1]), rel=0.15)
            checked += 1
    assert checked >= 3

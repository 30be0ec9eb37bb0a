"""NFC / DAPS samplers and the restore() API, checked against the exact Gaussian oracle."""

import math

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps.frequency import radial_frequency
from nfc_dps.operators import BlurOperator, Denoising, Inpainting, SuperResolution, box_mask, gaussian_kernel
from nfc_dps.priors.base import Prior
from nfc_dps.priors.gaussian import GaussianSpectralPrior
from nfc_dps.samplers import METHODS, Measurement, get_config
from nfc_dps.samplers.nfc import NFCConfig, sample_daps, sample_nfc
from nfc_dps.schedules import BandSchedule, DetailSchedule

SIZE = 32
SIGMA_Y = 0.05  # model units ([-1, 1]); 0.025 in [0, 1] units


def oracle_problem(n_images: int, seed: int = 0):
    prior = GaussianSpectralPrior((SIZE, SIZE), alpha=2.0, pixel_std=0.5, channels=1)
    g = torch.Generator().manual_seed(seed)
    x = prior.sample(n_images, g, dtype=torch.float64)
    op = BlurOperator(gaussian_kernel(9, 1.5), "circular")
    H = op.transfer_function(SIZE, SIZE, dtype=torch.float64)
    y_m = op.A(x) + SIGMA_Y * torch.randn(x.shape, generator=g, dtype=torch.float64)
    return prior, op, H, x, y_m


def to01(y_m):  # blur has DC gain 1: y = (y_m + 1) / 2, sigma halves
    return (y_m + 1) / 2


EXACT = dict(num_levels=40, ode_steps=1, ode_sigma_min=1e-5, inner="exact", prior_covariance="spectral", spectrum="prior",
             final_step="sample")


def gens(n, offset=0):
    return [torch.Generator().manual_seed(1000 + offset + i) for i in range(n)]


def test_exact_sampler_matches_posterior_mean_and_band_variance():
    prior, op, H, x, y_m = oracle_problem(1)
    k = 512
    y = to01(y_m).expand(k, -1, -1, -1)
    out = sample_nfc(prior, Measurement(op, y, SIGMA_Y / 2, (k, 1, SIZE, SIZE)).in_model_units(), NFCConfig(**EXACT).as_daps(), gens(k))
    post_mean = prior.posterior_mean(y_m, H, SIGMA_Y)
    post_var = prior.posterior_variance(H, SIGMA_Y)
    rel = ((out.mean(0, keepdim=True) - post_mean).norm() / post_mean.norm()).item()
    mc_expected = math.sqrt(post_var.sum() / k) / post_mean.norm().item()
    assert rel <= 0.05, (rel, mc_expected)
    emp = (torch.fft.fft2(out - out.mean(0, keepdim=True), norm="ortho").abs() ** 2).mean(0)[0] * k / (k - 1)
    r = radial_frequency(SIZE, SIZE, dtype=torch.float64)
    for lo, hi in [(0.0, 0.15), (0.15, 0.3), (0.3, 0.5), (0.5, 1.01)]:
        sel = (r >= lo) & (r < hi)
        ratio = (emp[sel].mean() / post_var[sel].mean()).item()
        assert abs(ratio - 1) <= 0.15, (lo, hi, ratio)


def _psnr_model(a, b):
    return (10 * torch.log10(4.0 / ((a - b) ** 2).mean(dim=(1, 2, 3)))).mean().item()


def test_nfc_within_bound_of_exact_posterior_sampler():
    prior, op, H, x, y_m = oracle_problem(30, seed=1)
    bound = 10 * math.log10(4.0 / (2 * prior.mmse(H, SIGMA_Y)))  # expected PSNR of an exact posterior sample
    cfg = NFCConfig(**EXACT, band=BandSchedule(cutoff="spectral", cutoff_start=0.1), detail=DetailSchedule(levels=1))
    out = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(), cfg, gens(30))
    got = _psnr_model(out, x)
    # within 0.3 dB of an exact posterior sample, on either side: the posterior mean would score
    # 3 dB above it (the MMSE bound) and the measurement itself 1.6 dB above
    assert abs(got - bound) <= 0.3, (got, bound)
    # and it is a sample: two independent chains differ by 2x the posterior variance per pixel
    # (measured 0.98x it; a mean or the identity has no spread)
    other = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(), cfg, gens(30, offset=100))
    spread = ((out - other) ** 2).mean().item() / 2
    assert 0.85 <= spread / prior.mmse(H, SIGMA_Y) <= 1.15, spread / prior.mmse(H, SIGMA_Y)


def test_daps_parity_modules_off_and_all_pass():
    prior, op, H, x, y_m = oracle_problem(2)
    base = dict(num_levels=6, ode_steps=2, inner="exact")
    # DAPS is NFC with the band's blend at 0 and no Haar levels (sample_daps runs exactly that)
    daps = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(),
                      NFCConfig(**base, band=BandSchedule(blend_start=0.0), detail=DetailSchedule(levels=0)), gens(2))
    assert torch.equal(daps, sample_daps(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(),
                                         NFCConfig(**base), gens(2)))
    # modules on, but the band all-pass (cutoff 1) and every Haar weight 1: the same numbers
    all_pass = NFCConfig(**base, band=BandSchedule(cutoff_start=1.0, blend_start=0.35),
                         detail=DetailSchedule(levels=2, detail_weight=1.0))
    same = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(), all_pass, gens(2))
    assert torch.allclose(daps, same, atol=1e-9)
    # and the modules do change the result when they are on
    nfc = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(), NFCConfig(**base), gens(2))
    assert not torch.allclose(daps, nfc, atol=1e-4)


def test_langevin_inner_step_samples_the_conditional():
    """DAPS's inner loop at temperature 1 draws from the exact inner step's Gaussian: its mean and,
    per frequency band, the variance 1 / (|H|^2 / sigma_y^2 + 1 / v) (unadjusted Langevin's step
    bias is a few % at step_fraction 0.1; measured ratios 1.00-1.03). A sampler of the mean alone,
    or noise of the wrong scale, fails."""
    from nfc_dps.samplers.gaussian_step import gaussian_conditional
    from nfc_dps.samplers.nfc import langevin_refine

    prior, op, H, x, y_m = oracle_problem(1)
    k, v = 64, 0.04
    y, center = y_m.expand(k, -1, -1, -1), (x + 0.2).expand(k, -1, -1, -1)
    draws = langevin_refine(op, y, center, SIGMA_Y, v, None, 1500, 0.1, gens(k))
    mean = gaussian_conditional(op, y_m, x + 0.2, SIGMA_Y, v, None, sample=False)
    spread = (draws - mean).norm() / k**0.5
    assert (draws.mean(0, keepdim=True) - mean).norm() < 2 * spread / k**0.5  # measured 0.96 x spread / sqrt(k)
    want = 1 / (H.abs() ** 2 / SIGMA_Y**2 + 1 / v)
    got = (torch.fft.fft2(draws - mean, norm="ortho").abs() ** 2).mean(0)[0]
    r = radial_frequency(SIZE, SIZE, dtype=torch.float64)
    for lo, hi in [(0.0, 0.15), (0.15, 0.3), (0.3, 0.5), (0.5, 1.01)]:
        sel = (r >= lo) & (r < hi)
        ratio = (got[sel].mean() / want.expand_as(got)[sel].mean()).item()
        assert abs(ratio - 1) <= 0.1, (lo, hi, ratio)


def test_nfc_with_the_langevin_inner_step_runs():
    prior, op, H, x, y_m = oracle_problem(2)
    cfg = NFCConfig(num_levels=4, ode_steps=1, inner="langevin", langevin_steps=5)
    out = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, x.shape).in_model_units(), cfg, gens(2))
    assert out.shape == x.shape and torch.isfinite(out).all()


class ShrinkPrior(Prior):
    """Exact MMSE denoiser of N(0, s^2 I) in model units: any size, any channel count."""

    def __init__(self, channels=3, s=0.5):
        super().__init__()
        self.channels, self.s = channels, s
        self.sigma_min, self.sigma_max = 1e-3, 100.0

    def denoise(self, x, sigma):
        s2 = self.s**2
        return x * s2 / (s2 + sigma.view(-1, 1, 1, 1) ** 2)


def operators(h, w):
    return {
        "blur_circular": BlurOperator(gaussian_kernel(5, 1.0), "circular"),
        "blur_reflect": BlurOperator(gaussian_kernel(5, 1.0), "reflect"),
        "sr_bicubic": SuperResolution(2, "bicubic"),
        "sr_average": SuperResolution(2, "average"),
        "inpaint": Inpainting(box_mask(h, w, box_size=6, margin=2, generator=0)),
        "denoise": Denoising(),
    }


def small_config(method):
    m = METHODS[method]
    fields = m.config_class.__dataclass_fields__
    if "num_levels" in fields:
        return get_config(method, "fast", num_levels=3, ode_steps=1, langevin_steps=3)
    return get_config(method, "fast", num_steps=4)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("op_name", list(operators(16, 16)))
def test_every_method_runs_on_every_operator(method, op_name):
    h, w = 16, 16
    op = operators(h, w)[op_name]
    x = torch.rand(2, 3, h, w)
    y = op.measure(x, 0.02, [torch.Generator().manual_seed(i) for i in range(2)])
    cfg = small_config(method)
    if method == "ddrm" and op_name in ("blur_reflect", "sr_bicubic", "sr_average"):
        # DDRM supports only operators with a known diagonal form, and says what to use instead
        with pytest.raises(ValueError, match="DDRM needs a diagonalisable operator.*use method 'ddnm'"):
            nfc_dps.restore(y, op, prior=ShrinkPrior(), method=method, config=cfg, sigma_y=0.02, progress=False)
        return
    out = nfc_dps.restore(y, op, prior=ShrinkPrior(), method=method, config=cfg, sigma_y=0.02, progress=False)
    assert out.image.shape == x.shape
    assert torch.isfinite(out.image).all() and out.image.min() >= 0 and out.image.max() <= 1
    assert out.nfe == cfg.nfe


def test_restore_batch_invariance_and_determinism():
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = torch.rand(3, 3, 16, 16)
    y = op.measure(x, 0.02, [torch.Generator().manual_seed(i) for i in range(3)])
    cfg = get_config("nfc", "fast", num_levels=4, ode_steps=1)
    kw = dict(prior=ShrinkPrior(), method="nfc", config=cfg, sigma_y=0.02, progress=False)
    full = nfc_dps.restore(y, op, seed=[10, 11, 12], **kw).image
    again = nfc_dps.restore(y, op, seed=[10, 11, 12], **kw).image
    alone = nfc_dps.restore(y[1:2], op, seed=[11], **kw).image
    assert torch.equal(full, again)
    assert torch.allclose(full[1:2], alone, atol=1e-6)
    other = nfc_dps.restore(y, op, seed=[20, 21, 22], **kw).image
    assert not torch.allclose(full, other)


def test_restore_numpy_gray_samples_and_uncertainty():
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = torch.rand(1, 1, 16, 12)
    y = op.measure(x, 0.02, torch.Generator().manual_seed(0))[0, 0].numpy()
    cfg = get_config("nfc", "fast", num_levels=3, ode_steps=1)
    out = nfc_dps.restore(y, op, prior=ShrinkPrior(channels=3), config=cfg, sigma_y=0.02, num_samples=3, progress=False)
    assert isinstance(out.image, np.ndarray) and out.image.shape == (16, 12)
    assert out.std.shape == (16, 12) and (out.std >= 0).all() and out.std.max() > 0
    assert len(out.samples) == 3
    assert np.allclose(out.image, np.clip(np.mean(out.samples, 0), 0, 1), atol=0.05)


def test_restore_errors_are_clear():
    op = Denoising()
    y = torch.rand(1, 3, 8, 8)
    with pytest.raises(ValueError, match="unknown method"):
        nfc_dps.restore(y, op, prior=ShrinkPrior(), method="magic", progress=False)
    with pytest.raises(ValueError, match="unknown preset"):
        nfc_dps.restore(y, op, prior=ShrinkPrior(), preset="slowest", progress=False)
    with pytest.raises(ValueError, match="num_levelz"):
        nfc_dps.restore(y, op, prior=ShrinkPrior(), num_levelz=3, progress=False)
    bad = y.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        nfc_dps.restore(bad, op, prior=ShrinkPrior(), progress=False)
    with pytest.raises(ValueError, match="channels"):
        nfc_dps.restore(torch.rand(1, 2, 8, 8), op, prior=ShrinkPrior(), progress=False)
    with pytest.raises(ValueError, match="inner"):
        NFCConfig(inner="gibbs")


def test_callback_sees_every_level_and_nfe():
    op = Denoising()
    y = torch.rand(1, 3, 8, 8)
    seen = []
    cfg = get_config("nfc", "fast", num_levels=5, ode_steps=2)
    out = nfc_dps.restore(y, op, prior=ShrinkPrior(), config=cfg, callback=seen.append, progress=False)
    assert [s["i"] for s in seen] == list(range(5))
    assert seen[-1]["nfe"] == 10 == out.nfe == cfg.nfe


class Multiple8Prior(ShrinkPrior):
    size_multiple = 8


def test_restore_pads_to_the_prior_multiple_and_crops_back():
    op = BlurOperator(gaussian_kernel(3, 1.0), "circular")
    x = torch.rand(1, 3, 12, 20)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(0))
    cfg = get_config("nfc", "fast", num_levels=3, ode_steps=1)
    out = nfc_dps.restore(y, op, prior=Multiple8Prior(), config=cfg, sigma_y=0.01, progress=False)
    assert out.image.shape == (1, 3, 12, 20)
    # without padding the prior's own size check refuses the image
    with pytest.raises(ValueError, match="multiple of 8"):
        Multiple8Prior()(torch.zeros(1, 3, 12, 20), 1.0)


def test_cropped_operator_is_adjoint():
    from nfc_dps.operators import CroppedOperator, SuperResolution

    op = CroppedOperator(SuperResolution(2, "bicubic"), (12, 20), (16, 24))
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    y = torch.randn(2, 3, 6, 10, dtype=torch.float64)
    assert op.image_shape(y.shape) == (2, 3, 16, 24)
    lhs, rhs = (op.A(x) * y).sum(), (x * op.A_adjoint(y)).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-10)


def test_prior_declared_power_law_feeds_the_spectral_covariance():
    from nfc_dps.samplers.common import counting

    prior = ShrinkPrior()
    with pytest.raises(NotImplementedError, match="power_law"):
        prior.spectrum(8, 8)
    prior.power_law = (1e-3, 2.0)
    spec = counting(prior).spectrum(8, 8)  # wrappers delegate to the prior they wrap
    assert spec.shape == (8, 8) and torch.isinf(spec[0, 0]) and (spec[1:, 1:] > 0).all()
    op = BlurOperator(gaussian_kernel(3, 1.0), "circular")
    y = op.measure(torch.rand(1, 3, 8, 8), 0.01, torch.Generator().manual_seed(0))
    cfg = get_config("nfc", "fast", num_levels=3, ode_steps=1, spectrum="prior")
    out = nfc_dps.restore(y, op, prior=prior, config=cfg, sigma_y=0.01, progress=False)
    assert torch.isfinite(out.image).all()
    with pytest.raises(ValueError, match="declares"):
        nfc_dps.restore(y, op, prior=ShrinkPrior(), config=cfg, sigma_y=0.01, progress=False)


def test_final_mean_step_is_the_conditional_mean_of_the_last_level():
    """final_step "mean": the same trajectory as "sample" up to the last level's prediction, then
    the exact conditional mean E[x0 | x0_hat, y] of the last level, to round-off."""
    from nfc_dps.samplers.gaussian_step import gaussian_conditional, spectral_prior_variance

    prior, op, H, x, y_m = oracle_problem(1)
    k = 4
    y_m = y_m.expand(k, -1, -1, -1)
    runs = {}
    for final in ("sample", "mean"):
        levels = []
        cfg = NFCConfig(**{**EXACT, "final_step": final}).as_daps()
        out = sample_nfc(prior, Measurement(op, to01(y_m), SIGMA_Y / 2, (k, 1, SIZE, SIZE)).in_model_units(),
                         cfg, gens(k), callback=levels.append)
        runs[final] = (out, levels[-1])
    (samples, last_s), (means, last) = runs["sample"], runs["mean"]
    assert torch.equal(last_s["denoised"], last["denoised"])
    var = spectral_prior_variance(prior.spectrum(SIZE, SIZE).view(1, 1, SIZE, SIZE), last["sigma"])
    want = gaussian_conditional(op, y_m, last["denoised"], SIGMA_Y, var, None, sample=False)
    torch.testing.assert_close(means, want, atol=1e-10, rtol=0)
    assert (samples - want).abs().amax().item() > 0.05  # while "sample" draws around it


@pytest.mark.parametrize("op", [BlurOperator(gaussian_kernel(9, 1.5), "circular"), Inpainting(box_mask(SIZE, SIZE, 12, 4))])
def test_inner_temperature_scales_the_draw_around_the_conditional_mean(op):
    """Exact inner step: draw(t) = mean + t (draw(1) - mean) for the same noise, any operator."""
    from nfc_dps.samplers.gaussian_step import gaussian_conditional, spectral_prior_variance

    prior, _, _, x, _ = oracle_problem(2)
    y = op.A(x) + SIGMA_Y * torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    var = spectral_prior_variance(prior.spectrum(SIZE, SIZE).view(1, 1, SIZE, SIZE), 0.7)
    centre = x + 0.3
    mean = gaussian_conditional(op, y, centre, SIGMA_Y, var, None, sample=False, cg_iters=200)
    one = gaussian_conditional(op, y, centre, SIGMA_Y, var, gens(2), cg_iters=200)
    half = gaussian_conditional(op, y, centre, SIGMA_Y, var, gens(2), cg_iters=200, temperature=0.5)
    zero = gaussian_conditional(op, y, centre, SIGMA_Y, var, gens(2), cg_iters=200, temperature=0.0)
    assert (one - mean).norm() > 0.1 * mean.norm()
    # exact up to the solver's tolerance (closed form for the blur, CG for the mask)
    assert ((half - mean) - 0.5 * (one - mean)).norm() < 1e-3 * (one - mean).norm()
    assert torch.equal(zero, mean)


def test_langevin_at_temperature_zero_descends_to_the_conditional_mean():
    from nfc_dps.samplers.gaussian_step import gaussian_conditional
    from nfc_dps.samplers.nfc import langevin_refine

    prior, op, _, x, y_m = oracle_problem(1)
    mean = gaussian_conditional(op, y_m, x + 0.2, SIGMA_Y, 0.04, None, sample=False)
    got = langevin_refine(op, y_m, x + 0.2, SIGMA_Y, 0.04, None, 3000, 0.9, gens(1), temperature=0.0)
    assert (got - mean).norm() < 1e-3 * mean.norm()
    with pytest.raises(ValueError, match="inner_temperature"):
        NFCConfig(inner_temperature=1.5)


def test_dilate_is_a_square_max_filter():
    from nfc_dps.samplers.gaussian_step import _dilate

    m = torch.rand(2, 3, 23, 17, generator=torch.Generator().manual_seed(0)).round()
    ref = torch.nn.functional.max_pool2d(m, 9, stride=1, padding=4)
    assert torch.equal(_dilate(m, 9), ref)


def _inpainting_normal_problem(mask, sigma: float = 8.0):
    """(normal operator, rhs, C, operator) of the exact inner step for inpainting, float64."""
    from nfc_dps.frequency import fourier_filter
    from nfc_dps.samplers.gaussian_step import spectral_prior_variance

    h, w = mask.shape[-2:]
    prior = GaussianSpectralPrior((h, w), alpha=2.0, pixel_std=0.5, channels=1)
    var = spectral_prior_variance(prior.spectrum(h, w).view(1, 1, h, w), sigma)
    op = Inpainting(mask)
    g = torch.Generator().manual_seed(1)
    b = torch.randn(1, 1, h, w, generator=g, dtype=torch.float64)

    def normal(v):
        return op.A_adjoint(op.A(v)) / SIGMA_Y**2 + fourier_filter(v, 1 / var)

    return normal, b, var, op


@pytest.mark.parametrize("hole", ["box", "random"])
def test_normal_preconditioner_is_spd_and_finds_wide_holes(hole):
    from nfc_dps.operators import random_mask
    from nfc_dps.samplers.gaussian_step import normal_preconditioner, pixel_coverage

    mask = box_mask(48, 40, 20, 6) if hole == "box" else random_mask(48, 40, 0.7, 0)
    normal, b, var, op = _inpainting_normal_problem(mask)
    centre = torch.zeros_like(b)
    M = normal_preconditioner(pixel_coverage(op, centre), var, SIGMA_Y)
    g = torch.Generator().manual_seed(2)
    u, v = (torch.randn(b.shape, generator=g, dtype=torch.float64) for _ in range(2))
    assert abs(float((u * M(v)).sum() - (M(u) * v).sum())) < 1e-9 * float(u.norm() * M(v).norm())
    assert float((v * M(v)).sum()) > 0
    # inside the box's hole M is the prior covariance C (nothing there pins the image);
    # a random mask has no hole wide enough, so M is the Fourier-diagonal form everywhere
    from nfc_dps.frequency import fourier_filter
    inside = torch.zeros_like(b)
    inside[..., 20:30, 16:24] = torch.randn(1, 1, 10, 8, generator=g, dtype=torch.float64)
    rho = float(mask.mean())
    diagonal = fourier_filter(inside, 1 / (1 / var + rho / SIGMA_Y**2))
    expected = fourier_filter(inside, var) * (1 - mask) if hole == "box" else diagonal
    assert torch.allclose(M(inside), expected, atol=1e-10)


def test_wide_hole_preconditioner_converges_faster_on_box_inpainting():
    """The reason for the hole split: on a 24-px hole at sigma 8, 15 iterations with it beat 15
    with the Fourier-diagonal form by a wide margin, and both reach the dense solution."""
    from nfc_dps.frequency import fourier_filter
    from nfc_dps.operators.base import conjugate_gradient
    from nfc_dps.samplers.gaussian_step import normal_preconditioner, pixel_coverage

    normal, b, var, op = _inpainting_normal_problem(box_mask(48, 48, 24, 8))
    n = b.numel()
    dense = torch.stack([normal(e.view(1, 1, 48, 48)).flatten() for e in torch.eye(n, dtype=torch.float64)], 1)
    exact = torch.linalg.solve(dense, b.flatten()).view_as(b)
    split = normal_preconditioner(pixel_coverage(op, torch.zeros_like(b)), var, SIGMA_Y)
    rho = float(op.mask.mean())
    diagonal = lambda v: fourier_filter(v, 1 / (1 / var + rho / SIGMA_Y**2))  # noqa: E731

    def error(precondition, iters):
        x = conjugate_gradient(normal, b, torch.zeros_like(b), max_iter=iters, tol=0.0, precondition=precondition)
        return float((x - exact).norm() / exact.norm())

    assert error(split, 15) < 0.2 * error(diagonal, 15)
    assert error(split, 300) < 1e-6 and error(diagonal, 300) < 1e-4


def test_auto_spectrum_rule():
    """'auto': the measurement's fit for conditional-mean steps on operators that observe every
    pixel; the prior's declared law for draws and for inpainting; an exact spectrum always wins."""
    from nfc_dps.samplers.common import counting, spectrum_for
    from nfc_dps.samplers.gaussian_step import fit_spectrum_from_measurement

    declared = ShrinkPrior(channels=1)
    declared.power_law = (1e-3, 2.0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 1, SIZE, SIZE, generator=g, dtype=torch.float64) * 2 - 1
    blur, mask = BlurOperator(gaussian_kernel(9, 1.5), "circular"), Inpainting(box_mask(SIZE, SIZE, 12, 4))
    shape = (1, 1, SIZE, SIZE)
    for op in (blur, mask):
        y = op.A(x)
        fitted = fit_spectrum_from_measurement(op, y, shape)
        from_prior = declared.spectrum(SIZE, SIZE).to(y).view(1, 1, SIZE, SIZE)
        assert not torch.allclose(fitted, from_prior)
        got_mean = spectrum_for("auto", counting(declared), op, y, shape, mean_steps=True)
        got_draw = spectrum_for("auto", counting(declared), op, y, shape, mean_steps=False)
        assert torch.equal(got_mean, fitted if op is blur else from_prior)
        assert torch.equal(got_draw, from_prior)
        exact = GaussianSpectralPrior((SIZE, SIZE), alpha=2.0, pixel_std=0.5, channels=1)
        got_exact = spectrum_for("auto", counting(exact), op, y, shape, mean_steps=True)
        assert torch.equal(got_exact, exact.spectrum(SIZE, SIZE).to(y).view(1, 1, SIZE, SIZE))


@pytest.mark.parametrize("missing", [0.9, 0.95])
def test_dense_random_masks_have_no_wide_hole(missing):
    """Scattered holes keep the Fourier-diagonal form (the better one there), even when dense."""
    from nfc_dps.frequency import fourier_filter
    from nfc_dps.operators import random_mask
    from nfc_dps.samplers.gaussian_step import normal_preconditioner, pixel_coverage

    mask = random_mask(256, 256, missing, 0)
    normal, b, var, op = _inpainting_normal_problem(mask)
    M = normal_preconditioner(pixel_coverage(op, torch.zeros_like(b)), var, SIGMA_Y)
    diagonal = fourier_filter(b, 1 / (1 / var + float(mask.mean()) / SIGMA_Y**2))
    assert torch.allclose(M(b), diagonal, atol=1e-12)


def test_exact_spectrum_flag_follows_wrappers_and_auto_ignores_padding():
    from nfc_dps.operators.padding import CroppedOperator
    from nfc_dps.priors.base import TiledPrior
    from nfc_dps.samplers.common import counting, spectrum_for
    from nfc_dps.samplers.gaussian_step import fit_spectrum_from_measurement

    exact = GaussianSpectralPrior((SIZE, SIZE), alpha=2.0, pixel_std=0.5, channels=1)
    assert counting(exact).spectrum_is_exact and counting(TiledPrior(exact, SIZE)).spectrum_is_exact
    declared = ShrinkPrior(channels=1)
    declared.power_law = (1e-3, 2.0)
    assert not counting(TiledPrior(declared, 16)).spectrum_is_exact
    # a blur on an image padded to the prior's size multiple still observes every *image* pixel
    op = CroppedOperator(BlurOperator(gaussian_kernel(9, 1.5), "circular"), (SIZE - 4, SIZE - 4), (SIZE, SIZE))
    y = op.A(torch.rand(1, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    got = spectrum_for("auto", counting(declared), op, y, (1, 1, SIZE, SIZE), mean_steps=True)
    assert torch.equal(got, fit_spectrum_from_measurement(op, y, (1, 1, SIZE, SIZE)))

"""DPIR (plug-and-play HQS) and NFC's deterministic continuation, on the exact Gaussian oracle."""

import dataclasses
import math

import pytest
import torch
from test_samplers import SIGMA_Y, SIZE, oracle_problem
from test_samplers import _psnr_model as psnr_model

import nfc_dps
from nfc_dps.operators import BlurOperator, Inpainting, SuperResolution, box_mask, gaussian_kernel
from nfc_dps.samplers import METHODS, Measurement, get_config
from nfc_dps.samplers.common import counting, initial_estimate
from nfc_dps.samplers.dpir import DPIR_SIGMA_MAX, DPIRConfig, dpir_sigmas, sample_dpir
from nfc_dps.samplers.nfc import NFCConfig, sample_nfc
from nfc_dps.samplers.nfc_continuation import ContinuationConfig, sample_nfc_continuation


def test_dpir_schedule_is_dpirs():
    """Geometric from 49/255 ([0, 1] units) to max(sigma_y, 0.01), in model units (x 2)."""
    s = dpir_sigmas(DPIRConfig(), sigma_y_model=0.05)
    assert len(s) == 8 and s[0] == pytest.approx(2 * 49 / 255) and s[-1] == pytest.approx(0.05)
    ratios = [b / a for a, b in zip(s[:-1], s[1:])]
    assert max(ratios) - min(ratios) < 1e-12
    assert dpir_sigmas(DPIRConfig(), sigma_y_model=0.001)[-1] == pytest.approx(0.02)  # the 0.01 floor
    assert DPIR_SIGMA_MAX == pytest.approx(0.3843, abs=1e-4)


def test_dpir_fixed_point_is_the_closed_form_and_near_the_mmse():
    """With a constant level s, HQS converges to z* = S h* y / ((S + s^2)|h|^2 + sigma_y^2 s^2 / r^2)
    per frequency (r^2 = s^2 / lam), the Gaussian prior's D being S / (S + s^2). This is the MMSE
    S h* y / (S |h|^2 + sigma_y^2) only as s -> 0 with lam = 1; at DPIR's last level (s = sigma_y,
    lam = 0.23) it under-regularises where |h| is small: measured 0.29 dB below the MMSE bound at 8
    iterations, tolerance 0.5 dB."""
    prior, op, H, x, y_m = oracle_problem(30, seed=1)
    y = (y_m + 1) / 2
    s, lam = 0.08, 0.23
    cfg = DPIRConfig(num_steps=150, sigma_max=s, sigma_min=s, noise_floor=0.0, lam=lam)
    got = sample_dpir(prior, Measurement(op, y, SIGMA_Y / 2, x.shape).in_model_units(), cfg)
    S = prior.spectrum(SIZE, SIZE).to(torch.float64)
    fy = torch.fft.fft2(y_m, norm="ortho")
    want = torch.fft.ifft2(S * H.conj() * fy / ((S + s**2) * H.abs() ** 2 + SIGMA_Y**2 * lam), norm="ortho").real
    assert (got - want).norm() <= 1e-3 * want.norm()  # float32 network path: measured 1.7e-4
    lam_one = torch.fft.ifft2(S * H.conj() * fy / ((S + s**2) * H.abs() ** 2 + SIGMA_Y**2), norm="ortho").real
    assert (got - lam_one).norm() > 1e-2 * want.norm()  # the test tells lam = 0.23 from lam = 1

    mmse_bound = 10 * math.log10(4.0 / prior.mmse(H, SIGMA_Y))
    out = sample_dpir(prior, Measurement(op, y, SIGMA_Y / 2, x.shape).in_model_units(), DPIRConfig())
    assert psnr_model(out, x) >= mmse_bound - 0.5
    assert psnr_model(out, x) <= mmse_bound + 0.1  # nothing beats the posterior mean on average


def test_dpir_counts_one_nfe_per_iteration_and_ignores_generators():
    prior, op, H, x, y_m = oracle_problem(2, seed=1)
    y = (y_m + 1) / 2
    for preset, n in (("fast", 8), ("paper", 24)):
        res = nfc_dps.restore(y.float(), op, prior=prior, method="dpir", preset=preset, sigma_y=0.025, seed=0,
                              progress=False)
        assert res.nfe == n
    a = nfc_dps.restore(y.float(), op, prior=prior, method="dpir", sigma_y=0.025, seed=0, progress=False).image
    b = nfc_dps.restore(y.float(), op, prior=prior, method="dpir", sigma_y=0.025, seed=7, progress=False).image
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [dict(num_steps=0), dict(lam=0.0), dict(sigma_min=1.0), dict(start="noise"),
                                 dict(noise_floor=-1.0)])
def test_dpir_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        DPIRConfig(**bad)


@pytest.mark.parametrize("kind", ["pinv", "adjoint", "tikhonov", "wiener"])
def test_initial_estimates_fit_the_measurement(kind):
    """Every start estimate is image-shaped and reproduces a noiseless measurement where it is
    exact (pinv: A x = y; adjoint on inpainting: the observed pixels; tikhonov, wiener: close)."""
    from nfc_dps.frequency import power_law_spectrum

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
    spectrum = power_law_spectrum(torch.tensor([0.01]), torch.tensor([2.0]), (32, 32))
    for op in (Inpainting(box_mask(32, 32, 12, 2)), SuperResolution(4), BlurOperator(gaussian_kernel(9, 1.5))):
        y = op.A(x)
        est = initial_estimate(op, y, 0.01, x.shape, kind, spectrum)
        assert est.shape == x.shape
        rel = ((op.A(est) - y).norm() / y.norm()).item()
        if kind == "pinv" or (kind == "adjoint" and isinstance(op, Inpainting)):
            assert rel < 2e-3, (kind, type(op).__name__, rel)  # blur: measured 4e-4 (float32 FFTs)
        elif kind != "adjoint":  # a blurred or box-upsampled image does not refit y
            assert rel < 0.05, (kind, type(op).__name__, rel)
    with pytest.raises(ValueError, match="initial estimate"):
        initial_estimate(op, y, 0.01, x.shape, "noise")
    with pytest.raises(ValueError, match="power spectrum"):
        initial_estimate(op, y, 0.01, x.shape, "wiener")


def test_dpir_starts_inpainting_from_an_interpolation_and_the_rest_from_the_adjoint():
    """"auto": the Wiener interpolation where pixels are unobserved, else A^T y / g; on the Gaussian
    oracle with a box hole, DPIR from the interpolation ends nearer the truth than from the flat fill."""
    from nfc_dps.samplers.common import spectrum_for
    from nfc_dps.samplers.dpir import dpir_start

    prior, _, _, x, _ = oracle_problem(2, seed=3)
    g = torch.Generator().manual_seed(0)
    hole = Inpainting(box_mask(SIZE, SIZE, SIZE // 2))
    for op, want in ((hole, "wiener"), (SuperResolution(2), "adjoint"), (BlurOperator(gaussian_kernel(9, 1.5)), "adjoint")):
        y_m = op.A(x) + SIGMA_Y * torch.randn(op.A(x).shape, generator=g, dtype=x.dtype)
        spectrum = spectrum_for("auto", prior, op, y_m, x.shape, mean_steps=True) if want == "wiener" else None
        assert torch.equal(dpir_start(prior, op, y_m, SIGMA_Y, x.shape),
                           initial_estimate(op, y_m, SIGMA_Y, x.shape, want, spectrum)), type(op).__name__
    y = ((hole.A(x) + SIGMA_Y * torch.randn(x.shape, generator=g, dtype=x.dtype) + 1) / 2).float()
    runs = {start: sample_dpir(prior, Measurement(hole, y, SIGMA_Y / 2, x.shape).in_model_units(), DPIRConfig(start=start))
            for start in ("auto", "adjoint")}
    assert psnr_model(runs["auto"].double(), x) > psnr_model(runs["adjoint"].double(), x) + 0.5


def test_dpir_start_is_chosen_per_image_and_on_the_image_not_its_padding():
    """A padded canvas (CroppedOperator) is not a hole: a blur there starts from the adjoint; in a
    batch of an image with holes and one without, each gets the start it gets alone."""
    from nfc_dps.operators import FunctionOperator
    from nfc_dps.operators.padding import CroppedOperator
    from nfc_dps.samplers.dpir import dpir_start

    prior, _, _, x, _ = oracle_problem(2, seed=4)
    x = x.float()
    padded = CroppedOperator(BlurOperator(gaussian_kernel(9, 1.5)), (SIZE - 4, SIZE - 4), (SIZE, SIZE))
    y_pad = padded.A(x)
    assert torch.equal(dpir_start(prior, padded, y_pad, SIGMA_Y, x.shape),
                       initial_estimate(padded, y_pad, SIGMA_Y, x.shape, "adjoint"))
    masks = torch.ones(2, 1, SIZE, SIZE)
    masks[1, :, 8:20, 8:20] = 0

    def masked(m):
        return FunctionOperator(lambda v: v * m[: v.shape[0]], (1, SIZE, SIZE), (1, SIZE, SIZE),
                                lambda v: v * m[: v.shape[0]], family="inpaint")

    y = masks * x
    both = dpir_start(prior, masked(masks), y, SIGMA_Y, x.shape)
    for i in range(2):
        alone = dpir_start(prior, masked(masks[i:i + 1]), y[i:i + 1], SIGMA_Y, (1, *x.shape[1:]))
        torch.testing.assert_close(both[i:i + 1], alone, atol=1e-5, rtol=0)
    assert not torch.allclose(both[1:], initial_estimate(masked(masks[1:]), y[1:], SIGMA_Y, (1, *x.shape[1:]), "adjoint"))


def test_the_adjoint_start_of_a_large_sr_factor_is_the_upsampled_measurement_not_its_mean():
    """SR x8 has pixel gain 1/64: every pixel still counts as observed (the threshold is relative)."""
    x = torch.rand(1, 1, 40, 40, generator=torch.Generator().manual_seed(0)) * 2 - 1
    op = SuperResolution(8)
    y = op.A(x)
    est = initial_estimate(op, y, 0.01, x.shape, "adjoint")
    gain = op.A_adjoint(op.A(torch.ones_like(x)))
    torch.testing.assert_close(est, op.A_adjoint(y) / gain)


def test_deterministic_nfc_is_deterministic_and_batch_invariant():
    prior, op, H, x, y_m = oracle_problem(3, seed=1)
    y = ((y_m + 1) / 2).float()
    cfg = get_config("nfc")  # the default preset
    assert cfg == get_config("nfc", "deterministic") == ContinuationConfig() and cfg.is_deterministic and cfg.nfe == 16
    run = sample_nfc_continuation
    measurement = Measurement(op, y, 0.025, y.shape).in_model_units()
    full = run(prior, measurement, cfg, [torch.Generator().manual_seed(i) for i in range(3)])
    other_seeds = run(prior, measurement, cfg, [torch.Generator().manual_seed(99 + i) for i in range(3)])
    assert torch.equal(full, other_seeds)
    alone = torch.cat([run(prior, Measurement(op, y[i:i + 1], 0.025, (1, *y.shape[1:])).in_model_units(), cfg, None)
                       for i in range(3)])
    assert torch.allclose(full, alone, atol=2e-6, rtol=0)  # model units


def test_the_continuation_feeds_the_data_step_to_the_next_level():
    """No re-noising: the next level denoises the data step's output itself, which is the prox of
    y around x0_hat with r_k^2 = sigma_k^2 / lam."""
    prior, op, H, x, y_m = oracle_problem(1, seed=1)
    y = ((y_m + 1) / 2).float()
    cfg = get_config("nfc", "deterministic", num_levels=5)
    seen = []
    out = sample_nfc_continuation(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), cfg, None, callback=seen.append)
    assert torch.allclose(out, seen[-1]["x"])
    y_model = 2 * y - 1
    for info in seen:
        want = op.prox(y_model, info["denoised"], 0.05, info["sigma"] / cfg.prior_weight**0.5)
        torch.testing.assert_close(info["x"], want, rtol=1e-5, atol=1e-6)
    sigmas = [info["sigma"] for info in seen]
    assert sigmas[0] == pytest.approx(2 * 49 / 255) and sigmas[-1] == pytest.approx(0.025)  # noise floor: sigma_y / 2


def test_a_denoising_measurement_is_the_denoiser_at_its_noise_level():
    """y = x + sigma_y n is the image at noise sigma_y: the continuation's estimate is the posterior
    mean there, D(y, sigma_y) (on the Gaussian oracle, exactly), not data steps that put the
    noise back; the self-ensemble averages the eight symmetries of the square (8 calls)."""
    prior, _, _, x, _ = oracle_problem(2, seed=3)
    op = nfc_dps.build_operator("denoise", SIZE)
    g = torch.Generator().manual_seed(0)
    y_m = x + 0.2 * torch.randn(x.shape, generator=g, dtype=torch.float64)  # sigma_y 0.1 in [0, 1] units
    seen = []
    counted = counting(prior)
    out = sample_nfc_continuation(counted, Measurement(op, ((y_m + 1) / 2).float(), 0.1, x.shape).in_model_units(),
                                  get_config("nfc"), None, callback=seen.append)
    torch.testing.assert_close(out.double(), prior.posterior_mean(y_m, None, 0.2), rtol=0, atol=2e-5)
    assert len(seen) == 1 and counted.nfe == 8 and seen[0]["sigma"] == pytest.approx(0.2)
    alone = sample_nfc_continuation(prior, Measurement(op, ((y_m + 1) / 2).float(), 0.1, x.shape).in_model_units(),
                                    get_config("nfc", "deterministic", self_ensemble=False), None)
    torch.testing.assert_close(alone, out, rtol=0, atol=1e-5)  # the oracle is symmetric: one call suffices


def test_denoising_averages_the_symmetries_and_stays_in_a_denoisers_range():
    """An orientation-dependent error (a ramp along the width) cancels over the symmetries of the
    square; one call keeps it. Noise above a denoiser-only prior's range is denoised at its top
    (as DPIR does), not refused; Poisson-whitened noise at the image's own level."""
    from nfc_dps.noise import PoissonNoise
    from nfc_dps.priors.denoiser import DenoiserPrior

    ramp = torch.linspace(-0.01, 0.01, 8).view(1, 1, 1, 8)
    levels = []

    def fn(x, sigma):
        levels.append(sigma.clone())
        return x + ramp.to(x.dtype)

    prior = DenoiserPrior(fn, sigma_max=50 / 255)
    op = nfc_dps.build_operator("denoise", 8)
    y = torch.full((1, 3, 8, 8), 0.5)
    out = nfc_dps.restore(y, op, prior=prior, sigma_y=0.25, progress=False)  # above 50/255
    torch.testing.assert_close(out.image, y, rtol=0, atol=1e-6)
    assert out.nfe == 8 and all(float(s.max()) == pytest.approx(50 / 255) for s in levels)
    one = nfc_dps.restore(y, op, prior=prior, sigma_y=0.02, progress=False, self_ensemble=False)
    torch.testing.assert_close(one.image, y + ramp, rtol=0, atol=1e-6)
    levels.clear()
    counts = torch.full((1, 3, 8, 8), 0.5)
    counts[..., :4] = 0.1  # dim pixels: fewer photons, relatively noisier
    nfc_dps.restore(counts, op, prior=prior, noise=PoissonNoise(50), progress=False)
    raw_std = (counts.clamp_min(1 / 50) / 50).sqrt()  # per-pixel Poisson std at the box-smoothed counts, about
    assert float(levels[0][0]) == pytest.approx(float(raw_std.square().mean().sqrt()), rel=0.15)


def test_matched_renoise_adds_only_the_noise_the_data_step_lacks():
    """renoise "matched": at the first level x - x0 is the fresh draw scaled by
    sqrt(max(s_1^2 - e^2, 0)) / s_1, e^2 = mean over frequencies of 1 / (|H|^2 / sigma_y^2 + 1 / s_0^2)
    (the conditional mean's error under the isotropic prior sigma_0^2), computed here from H."""
    prior, op, H, x, y_m = oracle_problem(1, seed=1)
    y = ((y_m + 1) / 2).float()
    cfg = NFCConfig(num_levels=50, ode_steps=1, sigma_max=1.0, sigma_min=0.025, inner="exact", inner_temperature=0.0)
    runs = {}
    for mode in ("fresh", "matched"):
        seen = []
        sample_nfc(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), dataclasses.replace(cfg, renoise=mode).as_daps(),
                   [torch.Generator().manual_seed(0)], callback=seen.append)
        runs[mode] = seen
    s0, s1 = runs["fresh"][0]["sigma"], runs["fresh"][1]["sigma"]
    e2 = float((1 / (H.abs() ** 2 / SIGMA_Y**2 + 1 / s0**2)).mean())
    assert 0 < e2 < s1**2  # this level adds some noise, less than fresh
    fresh, matched = (runs[m][0]["x"] - runs[m][0]["x0"] for m in ("fresh", "matched"))
    assert torch.equal(runs["fresh"][0]["x0"], runs["matched"][0]["x0"])
    torch.testing.assert_close(matched, fresh * math.sqrt(s1**2 - e2) / s1, rtol=1e-4, atol=1e-6)
    assert not get_config("nfc", "fast", renoise="matched").is_deterministic


def test_matched_renoise_on_operators_that_declare_no_eigenvalues():
    """A reflect-boundary blur declares none: its approximation, the circular blur's with its
    kernel, stands in (the fast_psnr preset runs on it); an operator with no structure at all is a
    clear error."""
    from nfc_dps.operators import LinearOperator
    from nfc_dps.samplers.gaussian_step import normal_eigenvalues

    kernel = gaussian_kernel(9, 1.5)
    reflect = BlurOperator(kernel, "reflect")
    assert reflect.gram_eigenvalues(SIZE, SIZE) is None
    gram = normal_eigenvalues(reflect, (SIZE, SIZE), torch.float64)
    assert gram.decomposition is None  # in no particular order: a spectral prior counts by its mean
    assert torch.equal(gram.values, BlurOperator(kernel, "circular").gram_eigenvalues(SIZE, SIZE))
    # on a padded canvas (restore() pads to the prior's size multiple) the padding is unobserved
    from nfc_dps.operators import CroppedOperator

    cropped = CroppedOperator(reflect, (SIZE - 3, SIZE - 2), (SIZE, SIZE))
    gram_c = normal_eigenvalues(cropped, (SIZE, SIZE), torch.float64)
    inner = BlurOperator(kernel, "circular").gram_eigenvalues(SIZE - 3, SIZE - 2)
    assert gram_c.decomposition is None
    assert torch.equal(gram_c.values, torch.cat([inner, inner.new_zeros(SIZE * SIZE - inner.numel())]))
    prior, _, _, x, _ = oracle_problem(1, seed=1)
    y = reflect.measure(((x + 1) / 2).float(), 0.025, torch.Generator().manual_seed(0))
    cfg = get_config("nfc", "fast_psnr", num_levels=4)
    out = sample_nfc(prior, Measurement(reflect, y, 0.025, y.shape).in_model_units(), cfg, [torch.Generator().manual_seed(0)])
    assert torch.isfinite(out).all()

    class Halving(LinearOperator):
        def A(self, v):
            return v / 2

        def A_adjoint(self, v):
            return v / 2

    with pytest.raises(ValueError, match="renoise='matched' needs the eigenvalues of A\\^T A, which Halving"):
        sample_nfc(prior, Measurement(Halving(), y, 0.025, y.shape).in_model_units(), cfg, [torch.Generator().manual_seed(0)])


def test_conditional_error_variance_with_a_spectral_prior_on_a_circulant_operator():
    """Per-frequency C (two images, two spectra) on a circulant blur: the trace of
    (A^T A / sigma_y^2 + C^-1)^-1 per pixel, from dense matrices in the pixel basis."""
    from nfc_dps.samplers.gaussian_step import conditional_error_variance, normal_eigenvalues

    h = w = 6
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    f = torch.fft.fftfreq(h, dtype=torch.float64)
    radius2 = f[:, None] ** 2 + f[None, :] ** 2
    spectra = torch.stack([0.5 / (1 + 40 * radius2), 0.2 / (1 + 10 * radius2)])[:, None]  # (2, 1, h, w)
    eye = torch.eye(h * w, dtype=torch.float64).reshape(h * w, 1, h, w)
    a = op.A(eye).reshape(h * w, -1)
    got = conditional_error_variance(normal_eigenvalues(op, (h, w), torch.float64), 0.1, spectra, 0.5)
    for b in range(2):
        c = torch.fft.ifft2(torch.fft.fft2(eye) * spectra[b]).real.reshape(h * w, -1)  # C in the pixel basis
        cov = torch.linalg.inv(a @ a.T / 0.1**2 + torch.linalg.inv(c))
        assert float(got[b]) == pytest.approx(1.25 * float(cov.trace()) / (h * w), rel=1e-9)
    with pytest.raises(ValueError, match="eigenvalues for a prior variance"):
        conditional_error_variance(normal_eigenvalues(op, (h, w + 2), torch.float64), 0.1, spectra, 0.0)


def test_matched_renoise_would_add_nothing_to_the_deterministic_preset_on_the_protocol_tasks():
    """With the preset's lam the model error e_k^2 exceeds sigma_{k+1}^2 at every level of the five local
    tasks (the docs' reason for keeping renoise "none" there); denoising is the exception."""
    from nfc_dps.bench.spec import DEFAULT_TASKS, task_specs
    from nfc_dps.operators import build_operator
    from nfc_dps.samplers.gaussian_step import conditional_error_variance, normal_eigenvalues
    from nfc_dps.samplers.nfc_continuation import continuation_sigmas, top_sigma

    cfg, size, sigma_y = get_config("nfc"), 64, 0.05  # sigma_y in model units (0.025 in [0, 1])
    specs = task_specs("local", size, "circular")
    for name in (*DEFAULT_TASKS, "denoise"):
        op = build_operator(name, size, 0, **specs[name].params)
        sigmas = continuation_sigmas(cfg, top_sigma(cfg.sigma_max, op, sigma_y), sigma_y)
        gram = normal_eigenvalues(op, (size, size), torch.float64)
        ratio = min(float(conditional_error_variance(gram, sigma_y, sigmas[k] ** 2 / cfg.prior_weight, 0.0))
                    / sigmas[k + 1] ** 2 for k in range(cfg.num_levels - 1))
        assert (ratio > 1) == (name in DEFAULT_TASKS), (name, ratio)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_conditional_error_variance_is_the_trace_of_the_conditional_covariance(temperature):
    """(1 + t^2) tr((A^T A / sigma_y^2 + I / r^2)^-1) / n against dense matrices (inpainting, SR)."""
    from nfc_dps.operators import random_mask
    from nfc_dps.samplers.gaussian_step import conditional_error_variance, normal_eigenvalues

    h = w = 8
    for op in (Inpainting(random_mask(h, w, 0.6, 3)), SuperResolution(2)):
        a = op.A(torch.eye(h * w, dtype=torch.float64).reshape(h * w, 1, h, w)).reshape(h * w, -1)
        for sigma_y, r2 in ((0.05, 0.1), (0.2, 0.01)):
            cov = torch.linalg.inv(a @ a.T / sigma_y**2 + torch.eye(h * w, dtype=torch.float64) / r2)
            got = conditional_error_variance(normal_eigenvalues(op, (h, w), torch.float64), sigma_y, r2, temperature)
            assert float(got) == pytest.approx((1 + temperature**2) * float(cov.trace()) / (h * w), rel=1e-9)


def test_auto_range_starts_inpainting_lower():
    """sigma_max "auto": DPIR's 49/255 ([0, 1] units) for blur and SR, 0.2 (model units) for
    inpainting; a number is used as it is."""
    from nfc_dps.samplers.nfc_continuation import AUTO_SIGMA_MAX, AUTO_SIGMA_MAX_INPAINT, top_sigma

    assert AUTO_SIGMA_MAX == pytest.approx(2 * 49 / 255) and AUTO_SIGMA_MAX_INPAINT == pytest.approx(0.2)
    box, blur = Inpainting(box_mask(SIZE, SIZE, SIZE // 2, 2)), BlurOperator(gaussian_kernel(9, 1.5))
    assert top_sigma("auto", box, 0.05) == AUTO_SIGMA_MAX_INPAINT
    assert top_sigma("auto", box, 0.3) == 0.3  # never below the measurement noise
    assert top_sigma("auto", blur, 0.05) == top_sigma("auto", SuperResolution(4), 0.05) == AUTO_SIGMA_MAX
    assert top_sigma(0.3, box, 0.05) == 0.3
    cfg = get_config("nfc", num_levels=4)
    assert cfg.sigma_max == "auto"
    for op, first in ((box, AUTO_SIGMA_MAX_INPAINT), (blur, AUTO_SIGMA_MAX)):
        seen = []
        y = op.measure(torch.rand(1, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(0)), 0.025,
                       generator=torch.Generator().manual_seed(1))
        nfc_dps.restore(y, op, prior=oracle_problem(1, seed=1)[0], sigma_y=0.025, num_levels=4, progress=False,
                        callback=seen.append)
        assert seen[0]["sigma"] == pytest.approx(first) and seen[-1]["sigma"] == pytest.approx(0.025)


def test_deterministic_nfc_near_the_oracle_mmse():
    """On the Gaussian oracle the deterministic preset lands within 1 dB of the MMSE bound (below it:
    its steps are isotropic where the exact covariance is spectral)."""
    prior, op, H, x, y_m = oracle_problem(30, seed=1)
    out = sample_nfc_continuation(prior, Measurement(op, (y_m + 1) / 2, 0.025, x.shape).in_model_units(), get_config("nfc"))
    assert psnr_model(out, x) >= 10 * math.log10(4.0 / prior.mmse(H, SIGMA_Y)) - 1.0


@pytest.mark.parametrize("bad", [dict(prior_weight=0.0), dict(noise_floor=float("nan")), dict(sigma_max="high"),
                                 dict(sigma_max=0.0), dict(sigma_max=float("inf")), dict(sigma_max=True),
                                 dict(sigma_min=-1.0), dict(num_levels=0), dict(self_ensemble=1)])
def test_the_continuation_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ContinuationConfig(**bad)


@pytest.mark.parametrize("bad", [dict(renoise="none"), dict(sigma_max="auto"), dict(sigma_max=0.0),
                                 dict(sigma_max=float("inf")), dict(ode_sigma_min=-1.0), dict(spectrum="y")])
def test_the_posterior_sampler_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        NFCConfig(**bad)


def test_nfc_presets_of_either_regime_take_their_own_fields():
    """``nfc``'s deterministic preset is the continuation's config, the others the posterior
    sampler's; an override that is not a field of the preset's config is an error, and the method
    runs either."""
    assert isinstance(get_config("nfc", "deterministic", prior_weight=0.3), ContinuationConfig)
    assert get_config("nfc", "fast", inner_temperature=0.5).inner_temperature == 0.5
    with pytest.raises(ValueError, match="unknown nfc config keys \\['band.blend_start'\\]"):
        get_config("nfc", "deterministic", band={"blend_start": 0.2})
    with pytest.raises(ValueError, match="unknown nfc config keys \\['prior_weight'\\]"):
        get_config("nfc", "fast", prior_weight=0.3)
    prior, op, H, x, y_m = oracle_problem(1, seed=1)
    y = ((y_m + 1) / 2).float()
    det = METHODS["nfc"].sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), get_config("nfc", num_levels=3))
    assert torch.equal(det, sample_nfc_continuation(prior, Measurement(op, y, 0.025, y.shape).in_model_units(),
                                                    get_config("nfc", num_levels=3)))
    fast = get_config("nfc", "fast", num_levels=3, ode_steps=1)
    post = METHODS["nfc"].sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), fast, [torch.Generator().manual_seed(0)])
    assert torch.equal(post, sample_nfc(prior, Measurement(op, y, 0.025, y.shape).in_model_units(),
                                        fast, [torch.Generator().manual_seed(0)]))
    with pytest.raises(TypeError, match="sample_nfc_continuation"):
        sample_nfc(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), get_config("nfc"))
    with pytest.raises(TypeError, match="sample_nfc_continuation takes a ContinuationConfig"):
        sample_nfc_continuation(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), fast)
    with pytest.raises(TypeError, match="sample_daps takes an NFCConfig"):
        METHODS["daps"].sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), get_config("nfc"))
    with pytest.raises(ValueError, match="'renoise' is a field of preset .*preset: fast"):
        get_config("nfc", None, renoise="fresh")


def test_default_presets():
    """restore() without a preset: NFC's deterministic continuation, the others' "fast"."""
    assert METHODS["nfc"].default_preset == "deterministic"
    assert all(m.default_preset == "fast" for name, m in METHODS.items() if name != "nfc")
    assert not get_config("nfc", "fast").is_deterministic
    assert get_config("dpir").is_deterministic

"""Noise models (nfc_dps.noise): moments and seeded draws, likelihood gradients, specs, the
whitened Gaussian form, and restore() with a noise model."""

from __future__ import annotations

import pytest
import torch

import nfc_dps
from nfc_dps.metrics import psnr
from nfc_dps.noise import GaussianNoise, PoissonGaussianNoise, PoissonNoise, as_noise, noise_from_record, parse_noise
from nfc_dps.operators import BlurOperator, Inpainting, gaussian_kernel, random_mask
from nfc_dps.priors.gaussian import GaussianSpectralPrior

MODELS = [GaussianNoise(0.05), PoissonNoise(20), PoissonGaussianNoise(20, 0.03)]


def _gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("noise", MODELS, ids=str)
def test_moments_match_the_models_variance(noise):
    clean = torch.linspace(0.05, 0.95, 64).repeat(400, 1).view(400, 1, 8, 8)
    y = noise.sample(clean, torch.Generator().manual_seed(0)).double()
    mean, var = y.mean(0), y.var(0)
    want = noise.variance(clean[:1]).double()[0]
    torch.testing.assert_close(mean, clean[0].double(), atol=4 * float(want.max().sqrt()) / 20, rtol=0)
    assert float((var / want - 1).abs().max()) < 0.3  # 400 draws: the variance within about 4 standard errors


@pytest.mark.parametrize("noise", MODELS, ids=str)
def test_draws_are_seeded_per_image(noise):
    clean = torch.full((3, 1, 8, 8), 0.4)
    a = noise.sample(clean, _gens([1, 2, 3]))
    assert torch.equal(a, noise.sample(clean, _gens([1, 2, 3])))
    assert torch.equal(a[1:2], noise.sample(clean[1:2], _gens([2])))  # image 1 alone draws the same
    assert not torch.equal(a[0], a[1])


@pytest.mark.parametrize("noise", MODELS, ids=str)
def test_the_nll_gradient_is_the_nlls(noise):
    clean = torch.rand(2, 1, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.8 + 0.1
    y = noise.sample(clean, torch.Generator().manual_seed(1)).clamp_min(0)
    c = clean.clone().requires_grad_(True)
    noise.nll(y, c).sum().backward()
    torch.testing.assert_close(noise.nll_grad(y, clean), c.grad)


def test_specs_records_and_bad_values():
    assert parse_noise("gaussian:0.025") == GaussianNoise(0.025) == as_noise(0.025)
    assert parse_noise("poisson:30") == PoissonNoise(30)
    assert parse_noise(" poisson-gaussian:30, 0.01") == PoissonGaussianNoise(30, 0.01)
    for model in MODELS:
        assert noise_from_record(model.record()) == model and parse_noise(str(model)) == model
    with pytest.raises(ValueError, match=r"'poisson:0'.*peak must be > 0"):
        parse_noise("poisson:0")
    with pytest.raises(ValueError, match="takes 2 value"):
        parse_noise("poisson-gaussian:30")
    with pytest.raises(ValueError, match="unknown kind 'laplace'"):
        parse_noise("laplace:1")
    with pytest.raises(TypeError, match="peak must be a number"):
        PoissonNoise("many")


def test_whitening_gives_one_noise_std_everywhere():
    """w * y has (close to) the reference std wherever the clean measurement lies."""
    noise = PoissonNoise(50)
    clean = torch.linspace(0.05, 1.0, 32).view(1, 1, 1, 32).expand(2000, 1, 32, 32).contiguous()
    y = noise.sample(clean, torch.Generator().manual_seed(0))
    w = noise.weights(y)
    ratio = (w * (y - clean)).std(0)[0].mean(0) / noise.reference_std()  # per column (clean value)
    bright = clean[0, 0, 0] >= 0.2  # 10 photons and more: the quadratic approximation holds
    assert float((ratio[bright] - 1).abs().max()) < 0.1
    assert float((ratio - 1).abs().max()) < 0.3  # a few photons: the weights are bounded, not exact


def test_measure_draws_the_model_and_masks_inpainting():
    x = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    blur = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    y = blur.measure(x, noise="poisson:10", generator=_gens([0, 1]))
    assert torch.equal(y, PoissonNoise(10).sample(blur.A(x), _gens([0, 1])))
    assert torch.equal(y * 10, (y * 10).round())  # counts
    hole = Inpainting(random_mask(16, 16, 0.5, generator=0))
    yh = hole.measure(x, noise=PoissonNoise(10), generator=_gens([0, 1]))
    assert bool((yh[..., hole.pixel_mask() == 0] == 0).all())
    with pytest.raises(TypeError, match="one of sigma_y"):
        blur.measure(x, 0.1, noise="poisson:10")


def test_restore_takes_a_noise_model_and_checks_its_measurement():
    prior = GaussianSpectralPrior((16, 16), channels=1)
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = ((prior.sample(2, torch.Generator().manual_seed(0)) + 1) / 2).clamp(0, 1).float()
    y = op.measure(x, noise=PoissonNoise(20), generator=_gens([0, 1]))
    out = nfc_dps.restore(y, op, prior=prior, noise="poisson:20", progress=False)
    assert out.image.shape == x.shape and torch.isfinite(out.image).all()
    assert psnr(out.image, x).mean() > psnr(y.clamp(0, 1), x).mean()
    with pytest.raises(ValueError, match="cannot be negative"):
        nfc_dps.restore(y - 0.5, op, prior=prior, noise=PoissonNoise(20), progress=False)
    with pytest.raises(ValueError, match="peak must be > 0"):
        nfc_dps.restore(y, op, prior=prior, noise="poisson:-3", progress=False)
    with pytest.raises(TypeError, match="pass one of sigma_y and noise"):
        nfc_dps.restore(y, op, prior=prior, sigma_y=0.1, noise="poisson:20", progress=False)
    with pytest.raises(ValueError, match="ddrm takes gaussian noise"):
        nfc_dps.restore(y, op, prior=prior, method="ddrm", noise="poisson:20", progress=False)
    with pytest.raises(ValueError, match="0-255 units"):
        nfc_dps.restore(y, op, prior=prior, noise=GaussianNoise(25), progress=False)


@pytest.mark.parametrize("spec, says", [
    ("poisson:auto", "poisson's peak is read from each measurement by restore only (nfc-dps restore --noise "
                     "poisson:auto, nfc_dps.restore(y, op, noise='poisson:auto')); here give it, e.g. poisson:30"),
    ("poisson-gaussian:auto", "here give them, e.g. poisson-gaussian:30,0.01"),
    ("poisson-gaussian:30,auto", "auto stands for all of poisson-gaussian's peak,sigma: spell it poisson-gaussian:auto"),
    ("gaussian:AUTO", "spelled --noise-sigma auto"),
])
def test_auto_in_a_noise_spec_is_refused_saying_what_reads_a_level(spec, says):
    """Outside restore's path (simulate, calibrate, the benchmark's --noise, op.measure) an estimated
    noise is refused, saying where it is read and how to state it instead."""
    from nfc_dps.noise import NoiseSpecError, parse_noise

    with pytest.raises(NoiseSpecError) as e:
        parse_noise(spec)
    assert says in str(e.value) and "must be numbers" not in str(e.value)
    with pytest.raises(ValueError, match="auto"):
        as_noise(spec)


def test_auto_spellings_are_estimated_noises_only_where_restore_resolves_them():
    from nfc_dps.noise import EstimatedNoise, NoiseSpecError, parse_noise

    assert parse_noise("poisson-gaussian:AUTO", estimated=True) == EstimatedNoise("poisson-gaussian")
    assert as_noise(" poisson:auto", estimated=True) == EstimatedNoise("poisson") and str(EstimatedNoise("poisson")) == "poisson:auto"
    assert as_noise(EstimatedNoise("poisson"), estimated=True) == EstimatedNoise("poisson")
    assert parse_noise("poisson:30", estimated=True) == PoissonNoise(30)  # stated specs as always
    with pytest.raises(NoiseSpecError, match="restore only"):
        as_noise(EstimatedNoise("poisson-gaussian"))  # the object too, outside restore's path
    for spec in ("gaussian:auto", "poisson-gaussian:auto,0.01"):  # never an estimated noise
        with pytest.raises(NoiseSpecError):
            parse_noise(spec, estimated=True)
    with pytest.raises(ValueError, match="unknown kind"):
        EstimatedNoise("laplace")
    op = nfc_dps.build_operator("denoise", 8)
    with pytest.raises(ValueError, match="restore only"):  # a measurement is not drawn from an estimate
        op.measure(torch.rand(1, 3, 8, 8), noise="poisson:auto")


def test_same_as_compares_law_and_parameters():
    """A noise model recognises itself (a Gaussian up to float rounding) and no other law or level."""
    assert GaussianNoise(0.01).same_as(GaussianNoise(0.01 * (1 + 1e-9)))
    assert not GaussianNoise(0.01).same_as(GaussianNoise(0.02))
    assert not GaussianNoise(0.01).same_as(PoissonGaussianNoise(30, 0.01))
    assert PoissonNoise(30).same_as(PoissonNoise(30)) and not PoissonNoise(30).same_as(PoissonNoise(31))
    assert not PoissonNoise(30).same_as(GaussianNoise(0.01))

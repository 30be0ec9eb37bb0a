"""The chain driver (nfc_dps.samplers.chains): one callback shape for every method, chunking that
does not change a chain's draw, the NaN check, the noise check, and results without a graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nfc_dps.noise import GaussianNoise, PoissonNoise
from nfc_dps.operators import BlurOperator, gaussian_kernel
from nfc_dps.priors.base import Prior
from nfc_dps.samplers import METHODS, Measurement, get_config, iter_chains, sample_chains

FEW_STEPS = {"num_levels": 3, "num_steps": 3}


class ShrinkPrior(Prior):
    """The exact MMSE denoiser of N(0, 0.25 I) in model units, through a parameter that requires
    grad (as a user's network does)."""

    def __init__(self) -> None:
        super().__init__()
        self.channels, self.sigma_max, self.sigma_min = 1, 80.0, 0.002
        self.v = nn.Parameter(torch.tensor(0.25))

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return x * (self.v / (self.v + sigma.view(-1, 1, 1, 1) ** 2))


def _measurement(b: int = 2) -> Measurement:
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = torch.rand(b, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    return Measurement(op, op.measure(x, 0.02, torch.Generator().manual_seed(1)), 0.02)


def _config(method: str):
    cfg = get_config(method, "fast" if method != "nfc" else None)
    return get_config(method, "fast" if method != "nfc" else None,
                      **{k: v for k, v in FEW_STEPS.items() if hasattr(cfg, k)})


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_calls_back_in_one_shape_and_returns_no_graph(method):
    seen = []
    x, nfe = sample_chains(method, ShrinkPrior(), _measurement(), _config(method), seeds=[4, 5], num_samples=2,
                           callback=seen.append)
    assert x.shape == (4, 1, 16, 16) and not x.requires_grad and x.grad_fn is None
    assert seen and all({"i", "sigma", "x", "denoised", "nfe", "chains"} <= set(info) for info in seen)
    assert [info["i"] for info in seen] == list(range(len(seen)))
    assert seen[-1]["chains"] == (0, 4) and seen[-1]["nfe"] == nfe >= 1


@pytest.mark.parametrize("method", ["nfc", "dps", "ddnm"])
def test_a_chains_draw_does_not_depend_on_the_chunking(method):
    cfg = get_config(method, "fast", **{k: v for k, v in FEW_STEPS.items() if hasattr(get_config(method, "fast"), k)})
    whole, _ = sample_chains(method, ShrinkPrior(), _measurement(), cfg, seeds=[4, 5], num_samples=3)
    chunks = list(iter_chains(method, ShrinkPrior(), _measurement(), cfg, seeds=[4, 5], num_samples=3, max_batch=4))
    assert [(c.start, c.stop) for c in chunks] == [(0, 4), (4, 6)]
    torch.testing.assert_close(torch.cat([c.x for c in chunks]), whole, atol=1e-5, rtol=0)
    # chain 3 is image 1's sample 0: alone, from image 1's seed, it draws the same
    alone, _ = sample_chains(method, ShrinkPrior(), Measurement(_measurement().operator, _measurement().y[1:], 0.02),
                             cfg, seeds=[5], num_samples=1)
    torch.testing.assert_close(alone[0], whole[3], atol=1e-5, rtol=0)


def test_nan_is_an_error_naming_the_method(monkeypatch):
    def nan_sampler(prior, measurement, config, generators=None, callback=None):
        return torch.full(measurement.image_shape, float("nan"))

    monkeypatch.setitem(METHODS, "ddnm", dataclasses.replace(METHODS["ddnm"], sample=nan_sampler))
    with pytest.raises(FloatingPointError, match="ddnm produced NaN/Inf"):
        sample_chains("ddnm", ShrinkPrior(), _measurement(), _config("ddnm"), seeds=[0, 1])


def test_a_noise_the_method_does_not_take_is_refused_up_front():
    m = Measurement(_measurement().operator, _measurement().y.clamp_min(0), PoissonNoise(20))
    with pytest.raises(ValueError, match="ddrm takes gaussian noise, not poisson:20"):
        sample_chains("ddrm", ShrinkPrior(), m, _config("ddrm"), seeds=[0, 1])


def test_a_poisson_measurement_is_restored_through_its_whitened_gaussian_form():
    """The whitened measurement: weights from a smoothed y, w * y of w * A, one std everywhere; a
    chain restores it like any Gaussian one, and its draw does not depend on the chunking."""
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    noise = PoissonNoise(10)
    y = op.measure(x, noise=noise, generator=[torch.Generator().manual_seed(i) for i in range(2)])
    m = Measurement(op, y, noise)
    g = m.gaussian()
    assert isinstance(g.noise, GaussianNoise) and g.noise.sigma == pytest.approx(0.05**0.5)
    w = g.operator.weights
    torch.testing.assert_close(g.y, w * y)
    torch.testing.assert_close(g.operator.A(x), w * op.A(x))
    assert float(w.std()) > 0.05  # bright pixels weigh less than dark ones
    cfg = _config("nfc")
    whole, _ = sample_chains("nfc", ShrinkPrior(), m, cfg, seeds=[4, 5])
    alone, _ = sample_chains("nfc", ShrinkPrior(), Measurement(op, y[1:], noise), cfg, seeds=[5])
    torch.testing.assert_close(alone[0], whole[1], atol=1e-5, rtol=0)


def test_measurement_checks_its_shapes_and_noise():
    m = _measurement()
    assert m.image_shape == (2, 1, 16, 16) and m.noise == GaussianNoise(0.02) and m.sigma_y == 0.02
    with pytest.raises(ValueError, match=r"image_shape must be \(B, C, H, W\) with B = 2"):
        Measurement(m.operator, m.y, 0.02, (3, 1, 16, 16))
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        Measurement(m.operator, m.y, -0.1)
    with pytest.raises(TypeError, match="noise must be a noise model"):
        Measurement(m.operator, m.y, [0.1])
    with pytest.raises(ValueError, match="unknown kind 'loud'"):
        Measurement(m.operator, m.y, "loud")
    assert Measurement(m.operator, m.y, "poisson:30").noise == PoissonNoise(30)
    with pytest.raises(ValueError, match="got 1 seeds for a measurement of 2 images"):
        sample_chains("nfc", ShrinkPrior(), m, _config("nfc"), seeds=[0])


def test_an_operator_the_method_cannot_take_is_refused_by_the_driver():
    from nfc_dps.baselines import NotApplicable, restore_classical
    from nfc_dps.operators import HighDynamicRange

    hdr = HighDynamicRange()
    m = Measurement(hdr, torch.rand(1, 1, 8, 8), 0.02)
    with pytest.raises(ValueError, match=r"DDNM\+ needs a linear operator"):
        sample_chains("ddnm", ShrinkPrior(), m, _config("ddnm"), seeds=[0])
    with pytest.raises(NotApplicable, match="takes a linear operator"):
        restore_classical("tv", hdr, m.y, 0.02)


def test_a_weighted_operator_bounds_its_norm_per_image_through_a_crop():
    from nfc_dps.operators import CroppedOperator, WeightedOperator
    from nfc_dps.samplers.common import data_gain

    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    w = torch.ones(2, 1, 16, 16)
    w[1] *= 3
    weighted = WeightedOperator(op, w)
    torch.testing.assert_close(weighted.norm_bound(), torch.tensor([1.0, 9.0]))
    cropped = CroppedOperator(weighted, (16, 16), (24, 24))
    torch.testing.assert_close(data_gain(cropped, torch.zeros(2, 1, 24, 24)), torch.tensor([1.0, 9.0]))
    assert data_gain(op, torch.zeros(2, 1, 16, 16)) == 1.0

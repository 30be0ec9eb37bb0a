"""DPIR's periodical geometric self-ensemble (``SelfEnsemblePrior``) and where it is switched on."""

import dataclasses

import pytest
import torch

from nfc_dps.priors import GaussianSpectralPrior, Prior
from nfc_dps.samplers import Measurement, get_config
from nfc_dps.samplers.dpir import DPIRConfig
from nfc_dps.samplers.nfc import NFCConfig
from nfc_dps.samplers.self_ensemble import DIHEDRAL_ORDER, SelfEnsemblePrior, dihedral, dihedral_inverse


def test_dihedral_is_the_group_of_the_square_and_inverts():
    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    for k in range(DIHEDRAL_ORDER):
        t = dihedral(x, k)
        assert t.shape[-2:] == ((5, 7) if k % 2 == 0 else (7, 5))  # a quarter turn swaps H and W
        assert torch.equal(dihedral_inverse(t, k), x)
    # eight different transforms of a generic image (compare as sets of pixel positions)
    ramp = torch.arange(36.0).view(1, 1, 6, 6)
    assert len({tuple(dihedral(ramp, k).flatten().tolist()) for k in range(DIHEDRAL_ORDER)}) == DIHEDRAL_ORDER


class RecordingPrior(Prior):
    """D(x) = x + a fixed ramp (not equivariant); records each call's input."""

    channels = 1

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def denoise(self, x, sigma):
        self.inputs.append(x.clone())
        h, w = x.shape[-2:]
        return x + torch.arange(h * w, dtype=x.dtype).view(1, 1, h, w)


def test_call_j_sees_symmetry_j_mod_8_and_is_turned_back():
    x = torch.randn(1, 1, 4, 6, generator=torch.Generator().manual_seed(1))
    inner = RecordingPrior()
    wrapped = SelfEnsemblePrior(inner)
    sigma = torch.ones(1)
    outs = [wrapped.denoise(x, sigma) for _ in range(10)]
    for j, (seen, out) in enumerate(zip(inner.inputs, outs)):
        k = j % DIHEDRAL_ORDER
        assert torch.equal(seen, dihedral(x, k))
        ramp = torch.arange(seen.shape[-2] * seen.shape[-1], dtype=x.dtype).view(1, 1, *seen.shape[-2:])
        assert torch.equal(out, x + dihedral_inverse(ramp, k))
    assert not torch.equal(outs[0], outs[1])  # the test tells the ensemble from the identity
    assert torch.equal(outs[0], outs[8])


def test_an_equivariant_prior_is_unchanged():
    """An isotropic Gaussian prior on a square image commutes with the square's symmetries."""
    prior = GaussianSpectralPrior((16, 16), alpha=2.0, pixel_std=0.5, channels=1)
    x = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    wrapped, sigma = SelfEnsemblePrior(prior), torch.full((2,), 0.3, dtype=torch.float64)
    for _ in range(DIHEDRAL_ORDER):
        assert torch.allclose(wrapped.denoise(x, sigma), prior.denoise(x, sigma), atol=1e-12)


def test_where_it_is_on():
    assert DPIRConfig().self_ensemble and get_config("dpir", "paper").self_ensemble  # DPIR's released x8 = True
    assert get_config("nfc", "deterministic").self_ensemble and get_config("nfc", "fast_psnr").self_ensemble
    for preset in ("paper", "fast"):  # the posterior samplers are unchanged
        assert not get_config("nfc", preset).self_ensemble
    with pytest.raises(ValueError, match="self_ensemble"):
        NFCConfig(self_ensemble=1)
    with pytest.raises(ValueError, match="self_ensemble"):
        DPIRConfig(self_ensemble="yes")


class RampPrior(Prior):
    """Shrinks towards a position-dependent ramp: a denoiser that no symmetry leaves alone."""

    channels = 1

    def denoise(self, x, sigma):
        h, w = x.shape[-2:]
        ramp = torch.linspace(-0.5, 0.5, h * w, dtype=x.dtype).view(1, 1, h, w)
        s2 = sigma.view(-1, 1, 1, 1) ** 2
        return (x + s2 * ramp / 0.25) / (1 + s2 / 0.25)


def test_the_deterministic_presets_stay_deterministic_and_batch_invariant_with_it():
    from nfc_dps.operators import BlurOperator, gaussian_kernel
    from nfc_dps.samplers.dpir import sample_dpir
    from nfc_dps.samplers.nfc_continuation import sample_nfc_continuation

    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 1, 16, 16, generator=g)
    y = op.A(x) + 0.025 * torch.randn(x.shape, generator=g)
    prior = RampPrior()
    for sample, cfg in ((sample_nfc_continuation, get_config("nfc", "deterministic")), (sample_dpir, get_config("dpir"))):
        full = sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), cfg)
        assert torch.equal(full, sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), cfg))
        alone = torch.cat([sample(prior, Measurement(op, y[i:i + 1], 0.025, (1, 1, 16, 16)).in_model_units(), cfg) for i in range(3)])
        assert torch.allclose(full, alone, atol=2e-6, rtol=0)  # model units
        off = sample(prior, Measurement(op, y, 0.025, y.shape).in_model_units(), dataclasses.replace(cfg, self_ensemble=False))
        assert not torch.allclose(full, off, atol=1e-4)  # the ensemble acts on this prior


def test_wrappers_answer_for_the_prior_they_wrap():
    from nfc_dps.priors import TiledPrior
    from nfc_dps.samplers import CountingPrior

    inner = GaussianSpectralPrior((16, 16), alpha=2.0, pixel_std=0.5, channels=1)
    inner.sigma_min, inner.sigma_max, inner.size_multiple, inner.precision = 0.01, 20.0, 4, "bfloat16"
    for wrapper in (SelfEnsemblePrior(inner), CountingPrior(inner), TiledPrior(inner, 8)):
        assert (wrapper.channels, wrapper.sigma_min, wrapper.sigma_max, wrapper.precision) == (1, 0.01, 20.0, "bfloat16")
        assert wrapper.spectrum_is_exact and torch.equal(wrapper.spectrum(16, 16), inner.spectrum(16, 16))
    assert SelfEnsemblePrior(inner).size_multiple == 4 and TiledPrior(inner, 8).size_multiple == 1


def test_a_prior_of_one_size_keeps_the_shape_on_non_square_images():
    """A quarter turn would hand a 16x24 oracle a 24x16 image: for priors built for one size the
    ensemble takes the four shape-keeping symmetries in turn, and restore() runs (it raised)."""
    import nfc_dps
    from nfc_dps.samplers.self_ensemble import SHAPE_KEEPING

    prior = GaussianSpectralPrior((16, 24), alpha=2.0, pixel_std=0.5, channels=1)
    assert prior.fixed_size == (16, 24) and SelfEnsemblePrior(prior).fixed_size == (16, 24)
    assert RecordingPrior().fixed_size is None
    x = torch.randn(1, 1, 16, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    wrapped, sigma = SelfEnsemblePrior(prior), torch.full((1,), 0.3, dtype=torch.float64)
    for j in range(6):
        k = SHAPE_KEEPING[j % 4]
        assert torch.equal(wrapped.denoise(x, sigma), dihedral_inverse(prior.denoise(dihedral(x, k), sigma), k))
    op = nfc_dps.build_operator("deblur_gaussian", image_size=(16, 24), kernel_size=5, kernel_std=1.0)
    y = op.measure(torch.rand(1, 1, 16, 24, generator=torch.Generator().manual_seed(4)), 0.025,
                   torch.Generator().manual_seed(5))
    for method in ("nfc", "dpir"):
        out = nfc_dps.restore(y, op, prior=prior, method=method, progress=False)
        assert out.image.shape == (1, 1, 16, 24) and torch.isfinite(out.image).all()

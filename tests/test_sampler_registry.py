"""The registry collects each sampler module's own ``METHODS``: a throwaway sampler declared in a
module of its own reaches ``get_config``, the harness's columns and ``restore`` with no list edited."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch
from test_samplers import ShrinkPrior

import nfc_dps
from nfc_dps.bench.spec import diffusion_methods
from nfc_dps.operators import Denoising
from nfc_dps.samplers import METHODS, get_config
from nfc_dps.samplers.common import StepConfig, sigma_vector
from nfc_dps.samplers.method import Method
from nfc_dps.samplers.registry import collect_methods, sampler_modules


@dataclass(frozen=True)
class OneStepConfig(StepConfig):
    """One denoiser call at ``sigma``."""

    num_steps: int = 1
    sigma: float = 0.1

    def noise_levels(self, prior, measurement):
        return [self.sigma]


def sample_one_step(prior, measurement, config, generators=None, callback=None):
    """Denoise the (identity-operator) measurement once."""
    x = prior.denoise(measurement.y, sigma_vector(config.sigma, measurement.y))
    if callback is not None:
        callback({"i": 0, "sigma": config.sigma, "x": x, "denoised": x})
    return x


def throwaway_module(name: str = "one_step", rank: int = 35) -> types.ModuleType:
    """A sampler module as a new one would be written: its config, its sampler, its ``METHODS``."""
    module = types.ModuleType("nfc_dps.samplers.one_step")
    module.METHODS = {name: Method(sample_one_step, OneStepConfig, {"fast": OneStepConfig()}, "One step", rank=rank)}
    return module


@pytest.fixture
def registered_throwaway():
    """METHODS with the throwaway module's entry, collected as the registry collects the package's."""
    saved = dict(METHODS)
    METHODS.clear()
    METHODS.update(collect_methods([*sampler_modules(), throwaway_module()]))
    yield
    METHODS.clear()
    METHODS.update(saved)


def test_the_package_modules_declare_every_method_in_rank_order():
    assert list(collect_methods(sampler_modules())) == list(METHODS) == [
        "nfc", "daps", "dps", "diffpir", "ddnm", "ddrm", "dpir"]
    assert METHODS["ddrm"].problem("ddrm", nfc_dps.build_operator("phase_retrieval", 16), None, None).endswith(
        "use nfc, daps, dps, dpir")


def test_a_new_sampler_module_is_a_method_with_no_list_edited(registered_throwaway):
    assert diffusion_methods() == ("nfc", "daps", "dps", "one_step", "diffpir", "ddnm", "ddrm", "dpir")
    assert get_config("one_step", sigma=0.2) == OneStepConfig(sigma=0.2)
    y = torch.rand(1, 3, 8, 8)
    result = nfc_dps.restore(y, Denoising(), prior=ShrinkPrior(), method="one_step", sigma_y=0.05, progress=False)
    assert result.image.shape == y.shape and torch.isfinite(result.image).all()
    assert "one_step" in METHODS["ddrm"].nonlinear_alternatives


def test_a_name_or_rank_declared_twice_names_both_modules():
    twin = throwaway_module("dps")
    with pytest.raises(ValueError, match="'dps' is declared by both nfc_dps.samplers.dps and nfc_dps.samplers.one_step"):
        collect_methods([*sampler_modules(), twin])
    with pytest.raises(ValueError, match=r"'dps' \(nfc_dps.samplers.dps\) and 'one_step' \(nfc_dps.samplers.one_step\)"):
        collect_methods([*sampler_modules(), throwaway_module(rank=30)])

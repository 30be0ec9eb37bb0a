"""Posterior samplers. Each is ``sample(prior, measurement, config, generators, callback) -> x``
with a :class:`~nfc_dps.samplers.common.ModelMeasurement` (the operator, y and its Gaussian noise
in the prior's [-1, 1] units) and x (B, C, H, W) in model units; ``config.noise_levels(prior,
measurement)`` is its noise schedule. Callers run them through
:func:`~nfc_dps.samplers.chains.sample_chains`, which counts the network calls, whitens, converts
to model units and back ([0, 1] images, unclipped) and adds ``"nfe"`` to the callback's dict.

One module per method (nfc: NFC's posterior sampler and DAPS, nfc_continuation: NFC's default
deterministic continuation, dps, diffpir, ddnm, ddrm, dpir); ``common`` holds the
shared pieces, ``gaussian_step`` NFC's Gaussian-conditional data step, ``presets`` NFC's and
DAPS's named configs and entries. Each sampler module declares its :class:`~nfc_dps.samplers.method.Method`
entries in its own ``METHODS`` dict; :data:`~nfc_dps.samplers.registry.METHODS` collects them.
"""

from __future__ import annotations

from .chains import Measurement, chain_generators, image_generators, iter_chains, sample_chains
from .common import CountingPrior, counting
from .ddnm import DDNMConfig, sample_ddnm
from .ddrm import DDRMConfig, sample_ddrm
from .diffpir import DiffPIRConfig, sample_diffpir
from .dpir import DPIRConfig, sample_dpir
from .dps import DPSConfig, sample_dps
from .method import Method
from .nfc import NFCConfig, sample_daps, sample_nfc
from .nfc_continuation import ContinuationConfig, sample_nfc_continuation
from .registry import (
    METHODS,
    get_config,
    get_method,
    nonlinear_methods,
    override_config,
    with_preset_hint,
)

__all__ = ["METHODS", "Method", "Measurement", "sample_chains", "iter_chains", "image_generators", "chain_generators",
           "get_method", "get_config", "override_config", "with_preset_hint", "CountingPrior", "counting", "nonlinear_methods",
           "NFCConfig", "sample_nfc", "sample_daps", "ContinuationConfig", "sample_nfc_continuation", "DPSConfig",
           "sample_dps", "DiffPIRConfig", "sample_diffpir", "DDNMConfig", "sample_ddnm", "DDRMConfig", "sample_ddrm",
           "DPIRConfig", "sample_dpir"]

"""NFC's and DAPS's method entries (:data:`METHODS`) and their named presets. ``deterministic`` (NFC only, its default) is the plug-and-play
continuation (``nfc_continuation.py``, its own config): a Wiener start, 16 levels from DPIR's
first level down to max(0.02, sigma_y / 2) in model units, no re-noising, no random draw (16 NFE). ``paper``
reproduces the published settings (1000 NFE);
``fast`` is 100 NFE: NFC with the exact Gaussian-conditional inner step, DAPS with its own
Langevin inner loop (as published). ``fast_psnr`` (NFC only) is ``fast`` with the conditional
mean as the inner step (``inner_temperature=0``), ``renoise="matched"`` and the geometric
self-ensemble (``self_ensemble=True``): higher PSNR, but no
longer a calibrated posterior sampler (its ``std`` maps understate the posterior spread)."""

from __future__ import annotations

from dataclasses import replace

from ..schedules import BandSchedule, DetailSchedule
from .method import Method
from .nfc import NFCConfig, nonlinear_problem, sample_daps, sample_nfc
from .nfc_continuation import ContinuationConfig, sample_nfc_continuation

NFC_PRESETS: dict[str, NFCConfig | ContinuationConfig] = {
    # arXiv 2602.00176 as published: N=200, n=5, T=200 Langevin steps, linear band 0.4 -> 1.0
    # blended by a cosine 0.35 -> 0, one-level Haar with w_L = 1, w_H = 0.2 unlocked 0.05 -> 1.
    "paper": NFCConfig(
        num_levels=200, ode_steps=5, inner="langevin", langevin_steps=200, final_step="sample",
        band=BandSchedule(cutoff="linear", cutoff_start=0.4, blend_start=0.35),
        detail=DetailSchedule(levels=1, detail_weight=0.2, unlock_start=0.05),
    ),
    # 100 NFE as 50 levels x 2 Euler steps (rather than 20 x 5 or 100 x 1).
    "fast": NFCConfig(
        num_levels=50, ode_steps=2, inner="exact", prior_covariance="spectral",
        band=BandSchedule(cutoff="linear", cutoff_start=0.4, blend_start=0.35),
        detail=DetailSchedule(levels=1, detail_weight=0.2, unlock_start=0.05),
    ),
}
# "fast" with conditional-mean inner steps (with ``spectrum: auto`` they use a power law fitted to
# A^+ y on blur, SR and denoising), re-noising matched to the data step's error, which adds
# only the noise the mean lacks, and DPIR's geometric self-ensemble (docs/notes/presets.md compares
# each with "fast")
NFC_PRESETS["fast_psnr"] = replace(NFC_PRESETS["fast"], inner_temperature=0.0, renoise="matched", self_ensemble=True)
# the deterministic continuation: its config's defaults (ContinuationConfig): a Wiener start, no
# re-noising, conditional-mean data steps weighted as DPIR's HQS with lam = 0.30 (DPIR's is 0.23;
# chosen on validation images), 16 levels from sigma_max "auto" (DPIR's 49/255 in [0, 1] units;
# for inpainting 0.2 in model units, nfc_continuation.top_sigma) down to half the measurement
# noise or sigma_min 0.02, whichever is larger, with DPIR's periodical geometric self-ensemble
# (docs/notes/presets.md; its results: docs/benchmarks.md, the 256-px tier)
NFC_PRESETS["deterministic"] = ContinuationConfig()

DAPS_PRESETS: dict[str, NFCConfig] = {
    # DAPS-1K (Zhang et al. 2025): 200 levels x 5 Euler steps, 100 Langevin steps per level.
    "paper": NFCConfig(num_levels=200, ode_steps=5, inner="langevin", langevin_steps=100, final_step="sample").as_daps(),
    "fast": NFCConfig(num_levels=20, ode_steps=5, inner="langevin", langevin_steps=100, final_step="sample").as_daps(),
}


def sample_nfc_method(prior, measurement, config, generators=None, callback=None):
    """Method ``nfc``: the deterministic continuation for a :class:`ContinuationConfig`, else the
    posterior sampler :func:`sample_nfc`."""
    sample = sample_nfc_continuation if isinstance(config, ContinuationConfig) else sample_nfc
    return sample(prior, measurement, config, generators, callback)


METHODS = {
    "nfc": Method(sample_nfc_method, NFCConfig, NFC_PRESETS, "NFC", rank=10, default_preset="deterministic",
                  nonlinear_config_problem=lambda c: nonlinear_problem(c) if isinstance(c, NFCConfig) else None),
    # DAPS is NFC's skeleton with the band and the Haar commitment off (sample_daps turns them off)
    "daps": Method(sample_daps, NFCConfig, DAPS_PRESETS, "DAPS", rank=20, fixed_fields=frozenset({"band", "detail"})),
}

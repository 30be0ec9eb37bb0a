"""NFC's deterministic continuation: method ``nfc``'s default preset, a plug-and-play estimate.

Algorithm, for levels sigma_0 > ... > sigma_{N-1} (model units) and the measurement's noise sigma_y:

    x = Wiener(y)                                    # linear MMSE estimate under a power law S, no noise
    for k = 0 .. N-1:
        x0_hat = x + (sigma_ode - sigma_k) (x - D(x, sigma_k)) / sigma_k     # 1 Euler step of the PF-ODE, 1 NFE
        x      = argmin ||y - A x||^2 / (2 sigma_y^2) + lam ||x - x0_hat||^2 / (2 sigma_k^2)   # operator.prox
    return x

A denoising measurement (operator family "denoise": A = I, or I whitened per pixel for Poisson
noise) is the image itself under noise, A^+ y = x + noise, so the continuation's first level is
that noise and its posterior mean is the denoiser's output there: the estimate is D(A^+ y, s), s
the image's noise level, in one call (with ``self_ensemble``: the mean over min(N, 8) of the
symmetries of the square, one call each; the other settings are unused); data steps below the
noise would only put the noise back.

The data step is the conditional mean of the Gaussian step with covariance sigma_k^2 / lam (DPIR's HQS
weighting); nothing is re-noised between levels, so the run draws no random number. The levels
are EDM's rho-grid from ``sigma_max`` (see :func:`top_sigma`) down to max(sigma_min, noise_floor
sigma_y). With ``self_ensemble`` the denoiser's call k sees its input under the (k mod 8)-th
symmetry of the square (DPIR's periodical geometric self-ensemble; ``self_ensemble.py``).
Profiling: the building blocks run inside ``torch.profiler.record_function("nfc.<phase>")``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor
from torch.profiler import record_function

from ..generators import Generators
from ..operators.base import LinearOperator
from ..operators.nonlinear import is_linear
from ..priors.base import Prior
from ..schedules import AUTO_SIGMA_MAX_INPAINT, DPIR_SIGMA_MAX, karras_sigmas
from .common import (
    Callback,
    ModelMeasurement,
    StepConfig,
    check_flag,
    initial_estimate,
    pf_ode_predict,
    schedule_top,
    spectrum_for,
    warn_above_range,
)
from .nfc import ODE_SIGMA_MIN, RHO
from .self_ensemble import DIHEDRAL_ORDER, SelfEnsemblePrior

#: ``sigma_max="auto"``, model units: DPIR's first level (49/255 in [0, 1] units), except for
#: inpainting and a clipped sensor's measurement (HDR, exposure: ``fills_clipped_pixels``)
#: (``AUTO_SIGMA_MAX_INPAINT``): the observed pixels carry only the measurement noise and the start
#: already holds them (and, for inpainting, the linear-MMSE fill of the holes), which deterministic
#: steps from higher up replace by the prior's guess (docs/notes/presets.md, "Range for inpainting"
#: and "Range for clipped measurements"); never below the measurement noise itself
AUTO_SIGMA_MAX = DPIR_SIGMA_MAX
#: ``sigma_max="auto"`` for an operator whose first estimate holds no image (``start_is_informative``
#: False: phase retrieval starts from mid-grey): the prior has to draw the image's structure, from
#: high up (chosen on validation tiles; capped at a denoiser-only prior's range)
AUTO_SIGMA_MAX_UNINFORMED = 30.0


@dataclass(frozen=True)
class ContinuationConfig(StepConfig):
    """The deterministic continuation's settings; every field is a YAML key (sigmas in [-1, 1]
    model units). The defaults are the ``deterministic`` preset.

    num_levels: N levels = network calls (NFE); on a denoising measurement min(N, 8) calls with the
        self-ensemble, else 1 (see the module docstring).
    sigma_max: the first level, a number or "auto": max(``AUTO_SIGMA_MAX_INPAINT``, sigma_y) when
        the operator's family is "inpaint" or it fills clipped pixels (HDR, exposure), ``AUTO_SIGMA_MAX_UNINFORMED`` when its first estimate
        holds no image (phase retrieval), else ``AUTO_SIGMA_MAX`` (:func:`top_sigma`).
    sigma_min / noise_floor: the last level is max(sigma_min, noise_floor * sigma_y), sigma_y in
        model units (below the measurement noise a data step cannot tell detail from noise).
    prior_weight: lam, the data step's trust in x0_hat (DPIR's HQS weighting is lam = 0.23).
    self_ensemble: DPIR's periodical geometric self-ensemble (``SelfEnsemblePrior``); no extra NFE
        (on a denoising measurement: the mean of the calls' symmetries).
    """

    num_levels: int = 16
    sigma_max: float | str = "auto"
    sigma_min: float = 0.02
    noise_floor: float = 0.5
    prior_weight: float = 0.30
    self_ensemble: bool = True

    def __post_init__(self) -> None:
        number = isinstance(self.sigma_max, numbers.Real) and not isinstance(self.sigma_max, bool)
        if self.sigma_max != "auto" and not (number and math.isfinite(self.sigma_max) and self.sigma_max > 0):
            raise ValueError(f"sigma_max must be a finite number > 0 (model units) or 'auto', got {self.sigma_max!r}")
        if not (isinstance(self.sigma_min, numbers.Real) and math.isfinite(self.sigma_min) and self.sigma_min >= 0):
            raise ValueError(f"sigma_min must be a finite number >= 0 (model units), got {self.sigma_min!r}")
        if number and self.sigma_min >= self.sigma_max:
            raise ValueError(f"need sigma_min < sigma_max (model units), got {self.sigma_min}, {self.sigma_max}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight > 0):
            raise ValueError(f"prior_weight must be finite and > 0, got {self.prior_weight}")
        if not (math.isfinite(self.noise_floor) and self.noise_floor >= 0):
            raise ValueError(f"noise_floor must be finite and >= 0, got {self.noise_floor}")
        check_flag("self_ensemble", self.self_ensemble)
        if isinstance(self.num_levels, bool) or not isinstance(self.num_levels, int) or self.num_levels < 1:
            raise ValueError(f"num_levels must be an int >= 1, got {self.num_levels!r}")

    steps_field: ClassVar[str] = "num_levels"  # one network call per level

    @property
    def is_deterministic(self) -> bool:
        """No random draw anywhere: K samples are K copies."""
        return True

    def noise_levels(self, prior: Prior, measurement: ModelMeasurement) -> list[float]:
        top = top_sigma(self.sigma_max, measurement.operator, measurement.sigma)
        if self.sigma_max == "auto" and not getattr(measurement.operator, "start_is_informative", True) \
                and prior.denoiser_only:
            top = min(top, float(prior.sigma_max))  # the uninformed start's rule stays within a denoiser's range
        return continuation_sigmas(self, schedule_top(prior, top), measurement.sigma)


def top_sigma(sigma_max: float | str, operator: LinearOperator, sigma_y: float) -> float:
    """The first level in model units: ``sigma_max`` itself, or the "auto" rule for ``operator``
    and the measurement noise ``sigma_y`` (model units)."""
    if sigma_max != "auto":
        return float(sigma_max)
    if not getattr(operator, "start_is_informative", True):
        return AUTO_SIGMA_MAX_UNINFORMED  # capped at a denoiser-only prior's range by the sampler
    fills_holes = operator.family == "inpaint" or getattr(operator, "fills_clipped_pixels", False)
    return max(AUTO_SIGMA_MAX_INPAINT, sigma_y) if fills_holes else AUTO_SIGMA_MAX


def continuation_sigmas(cfg: ContinuationConfig, top: float, sigma_y: float) -> list[float]:
    """The N levels from ``top`` down to max(sigma_min, noise_floor sigma_y), then 0 (model units).
    Where that floor reaches the top, all N levels sit at the top."""
    low = min(top, max(cfg.sigma_min, cfg.noise_floor * sigma_y))
    return karras_sigmas(cfg.num_levels, low, top, RHO).tolist()


def sample_nfc_continuation(prior: Prior, measurement: ModelMeasurement, config: ContinuationConfig = ContinuationConfig(),
                            generators: Generators = None, callback: Callback = None) -> Tensor:
    """The continuation's estimate per image of the measurement (deterministic; ``generators``
    unused; a nonlinear operator's data steps are Gauss-Newton). Returns (B, C, H, W) in model units."""
    if not isinstance(config, ContinuationConfig):
        raise TypeError(f"sample_nfc_continuation takes a ContinuationConfig, got {type(config).__name__} (the "
                        f"posterior presets' NFCConfig runs with sample_nfc, or as method 'nfc')")
    operator, y, sigma_y, cfg = measurement.operator, measurement.y, measurement.sigma, config
    if operator.family == "denoise" and is_linear(operator):
        if measurement.noise == 0:  # a noiseless denoising measurement is the image itself
            return operator.A_pinv(y)
        return _denoise_measurement(prior, operator, y, sigma_y, cfg, callback)
    sigmas = cfg.noise_levels(prior, measurement)
    spectrum = None
    if is_linear(operator):  # a nonlinear operator starts from its own estimate (operator.start)
        with record_function("nfc.spectrum"):
            spectrum = spectrum_for("auto", prior, operator, y, measurement.image_shape, mean_steps=True)
    x = initial_estimate(operator, y, sigma_y, measurement.image_shape, "wiener", spectrum)
    denoiser = SelfEnsemblePrior(prior) if cfg.self_ensemble else prior
    for k, sigma in enumerate(sigmas[:-1]):
        with record_function("nfc.predictor"):
            x0_hat = pf_ode_predict(denoiser, x, sigma, ODE_SIGMA_MIN, 1, RHO)
        with record_function("nfc.inner_exact"):
            x = operator.prox(y, x0_hat, sigma_y, (sigma**2 / cfg.prior_weight) ** 0.5)
        if callback is not None:
            callback({"i": k, "sigma": sigma, "x": x, "denoised": x0_hat, "x0": x})
    return x


def _denoise_measurement(prior: Prior, operator: LinearOperator, y: Tensor, sigma_y: float, cfg: ContinuationConfig,
                         callback: Callback) -> Tensor:
    """The posterior mean of a denoising measurement y (B, C, H, W, model units, noise std sigma_y of
    the diagonal operator's measurement): D(A^+ y, s) at the image's noise level s (per image, the
    root mean square of A^+ y's per-pixel noise std sigma_y / A(1): sigma_y itself for A = I),
    averaged over the first min(N, 8) symmetries of the square with ``self_ensemble`` (4 on a
    non-square image for a prior of one size). A denoiser-only prior is called at most at the top of
    its range, as DPIR calls it."""
    image = operator.A_pinv(y)
    gain = operator.A(torch.ones_like(image[:1]))
    level = ((sigma_y / gain).square().flatten(1).mean(1)).sqrt().expand(image.shape[0])
    warn_above_range(prior, float(level.max()))
    level = level.clamp(max=float(prior.sigma_max))
    symmetries = DIHEDRAL_ORDER if image.shape[-2] == image.shape[-1] or prior.fixed_size is None else 4
    calls = min(cfg.num_levels, symmetries) if cfg.self_ensemble else 1
    denoiser = SelfEnsemblePrior(prior) if calls > 1 else prior
    x0_hat = sum(denoiser.denoise(image, level.to(image.dtype)) for _ in range(calls)) / calls
    if callback is not None:
        callback({"i": 0, "sigma": float(level.max()), "x": x0_hat, "denoised": x0_hat, "x0": x0_hat})
    return x0_hat

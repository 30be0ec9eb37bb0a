"""DPIR: plug-and-play image restoration with a deep denoiser prior (Zhang et al., TPAMI 2021).

Half-quadratic splitting with a denoiser in place of the prior's proximal map, on a geometric
noise schedule sigma_0 > ... > sigma_{N-1} (model units):

    z = x_init                                             # from the measurement, no noise
    for k = 0 .. N-1:
        x = argmin ||y - A x||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r_k^2),  r_k = sigma_k / sqrt(lam)
        z = D(x, sigma_k)                                   # 1 NFE (self-ensemble: D under symmetry k mod 8)
    return z

DPIR writes the data step as argmin ||y - H x||^2 + alpha_k ||x - z||^2 with alpha_k = lam
sigma_y^2 / sigma_k^2; dividing by 2 sigma_y^2 gives the operator's prox with r_k^2 = sigma_k^2 /
lam, and the ratio sigma_k / r_k does not depend on the units. Published schedule: sigma_k
geometric from 49/255 down to max(sigma_y, 0.01) in [0, 1] units over 8 iterations, lam = 0.23;
in model units (x 2) that is 0.384 down to max(2 sigma_y, 0.02). The denoiser is the prior's
one-step D(x, sigma): no diffusion sampling, deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from ..operators.base import LinearOperator
from ..operators.nonlinear import is_linear
from ..priors.base import Prior
from ..schedules import DPIR_SIGMA_MAX
from .common import (
    START_ESTIMATES,
    Callback,
    Generators,
    ModelMeasurement,
    StepConfig,
    check_flag,
    initial_estimate,
    schedule_top,
    sigma_vector,
    spectrum_for,
)
from .method import Method
from .self_ensemble import SelfEnsemblePrior


@dataclass(frozen=True)
class DPIRConfig(StepConfig):
    """DPIR settings; every field is a YAML key (sigmas in [-1, 1] model units).

    num_steps: HQS iterations = denoiser calls = NFE (DPIR: 8).
    sigma_max: the first denoiser level (DPIR: 49/255 in [0, 1] units = 0.384).
    sigma_min: the lowest last level; the last level is max(sigma_min, noise_floor * sigma_y)
        with sigma_y in model units (DPIR: max(sigma_y, 0.01) in [0, 1] units).
    noise_floor: see sigma_min (DPIR: 1).
    lam: the data step's trust in the denoised estimate, r_k = sigma_k / sqrt(lam) (DPIR: 0.23).
    start: the first z, from the measurement: "auto" (:func:`dpir_start`) or one of
        ``initial_estimate``'s kinds ("wiener" with the spectrum NFC's start uses).
    self_ensemble: DPIR's periodical geometric self-ensemble (its released code's ``x8 = True``):
        iteration k denoises under the (k mod 8)-th flip/quarter turn (``SelfEnsemblePrior``);
        no extra NFE.
    """

    num_steps: int = 8
    sigma_max: float = DPIR_SIGMA_MAX
    sigma_min: float = 0.02
    noise_floor: float = 1.0
    lam: float = 0.23
    start: str = "auto"
    self_ensemble: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not (math.isfinite(self.lam) and self.lam > 0):
            raise ValueError(f"lam must be finite and > 0, got {self.lam!r}")
        if not 0 < self.sigma_min <= self.sigma_max:
            raise ValueError(f"need 0 < sigma_min <= sigma_max (model units), got {self.sigma_min}, {self.sigma_max}")
        if not self.noise_floor >= 0:
            raise ValueError(f"noise_floor must be >= 0, got {self.noise_floor!r}")
        if self.start not in ("auto", *START_ESTIMATES):
            raise ValueError(f"start must be one of {['auto', *START_ESTIMATES]}, got {self.start!r}")
        check_flag("self_ensemble", self.self_ensemble)


    @property
    def is_deterministic(self) -> bool:
        """No random draw anywhere: K samples are K copies."""
        return True

    def noise_levels(self, prior: Prior, measurement: ModelMeasurement) -> list[float]:
        schedule_top(prior, self.sigma_max)  # the first level: a denoiser-only prior whose range it leaves refuses
        return dpir_sigmas(self, measurement.sigma)


#: "fast": DPIR's 8 iterations; "paper": 24 on the same range (the same PSNR on the local protocol).
PRESETS = {
    "fast": DPIRConfig(num_steps=8),
    "paper": DPIRConfig(num_steps=24),
}


def dpir_sigmas(cfg: DPIRConfig, sigma_y_model: float) -> list[float]:
    """The geometric schedule, model units: sigma_max down to max(sigma_min, noise_floor * sigma_y)
    (every step at sigma_max where that floor reaches it: measurement noise above DPIR's first level)."""
    low = min(cfg.sigma_max, max(cfg.sigma_min, cfg.noise_floor * sigma_y_model))
    if cfg.num_steps == 1:
        return [cfg.sigma_max]
    ratio = (low / cfg.sigma_max) ** (1 / (cfg.num_steps - 1))
    return [cfg.sigma_max * ratio**k for k in range(cfg.num_steps)]


def dpir_start(prior: Prior, operator: LinearOperator, y_m: Tensor, sigma_m: float, image_shape: tuple[int, ...],
               kind: str = "auto") -> Tensor:
    """DPIR's first z, model units, (B, C, H, W). "auto": for an inpainting operator (family
    "inpaint", the same test that lowers NFC's default's first level), the Wiener interpolation of
    the observed pixels ("wiener"), since a flat fill of the holes would reach the first denoiser
    call as image content (DPIR's own demosaicking and SR start from an interpolation of y); else
    A^T y / g ("adjoint": y itself for a normalised blur, DPIR's deblurring start; a box
    upsampling for SR)."""
    if kind == "auto":
        kind = "wiener" if operator.family == "inpaint" else "adjoint"
    if not is_linear(operator):
        return initial_estimate(operator, y_m, sigma_m, image_shape, kind)  # the operator's own start
    spectrum = spectrum_for("auto", prior, operator, y_m, image_shape, mean_steps=True) if kind == "wiener" else None
    return initial_estimate(operator, y_m, sigma_m, image_shape, kind, spectrum)


def sample_dpir(prior: Prior, measurement: ModelMeasurement, config: DPIRConfig = DPIRConfig(),
                generators: Generators = None, callback: Callback = None) -> Tensor:
    """DPIR's estimate per image of the measurement (deterministic; ``generators`` unused; a
    nonlinear operator's prox is Gauss-Newton). Returns (B, C, H, W) in model units."""
    operator, y, sigma_y, cfg = measurement.operator, measurement.y, measurement.sigma, config
    denoiser = SelfEnsemblePrior(prior) if cfg.self_ensemble else prior
    sigmas = cfg.noise_levels(prior, measurement)
    z = dpir_start(prior, operator, y, sigma_y, measurement.image_shape, cfg.start)
    for k, sigma in enumerate(sigmas):
        x = operator.prox(y, z, sigma_y, sigma / cfg.lam**0.5)
        z = denoiser.denoise(x, sigma_vector(min(sigma, prior.sigma_max), x))
        if callback is not None:
            callback({"i": k, "sigma": sigma, "x": x, "denoised": z})
    return z


METHODS = {
    "dpir": Method(sample_dpir, DPIRConfig, PRESETS, "DPIR", rank=70),
}

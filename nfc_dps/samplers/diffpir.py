"""DiffPIR: denoising diffusion models for plug-and-play image restoration (Zhu et al., CVPRW 2023).

Algorithm (DiffPIR Alg. 1, in VE units x = x_vp / sqrt(abar)), sigma_0 > ... > sigma_{N-1}, sigma_N = 0:

    x ~ N(0, sigma_0^2 I)
    for i = 0 .. N-1:
        x0     = D(x, sigma_i)                                   # 1 NFE
        x0_hat = argmin ||y - A z||^2 / (2 sigma_y^2) + ||z - x0||^2 / (2 r_i^2),  r_i = sigma_i / sqrt(lam)
                 (skipped at the last step, as in the released code)
        eps    = (x - x0_hat) / sigma_i
        x      = x0_hat + sigma_{i+1} (sqrt(1 - zeta) eps + sqrt(zeta) noise)
    return x

The data step. DiffPIR solves x0_hat = argmin ||y - H z||^2 + rho_t ||z - x0||^2 with
rho_t = lam sigma_y^2 / sigma_bar_t^2, sigma_bar_t = sqrt(1 - abar_t) / sqrt(abar_t), which is our
VE sigma_t. Dividing the objective by 2 sigma_y^2 gives
||y - H z||^2 / (2 sigma_y^2) + lam ||z - x0||^2 / (2 sigma_t^2), i.e. the operator's prox with
r^2 = sigma_t^2 / lam (closed form by FFT for circular blur, CG otherwise). Here sigma_y and
sigma_t are both in [-1, 1] model units.

Units of lam (a difference from the released code). DiffPIR's scripts solve the prox on [0, 1]
images and set rho_t with the [0, 1] noise level (12.75/255) but sigma_bar_t in [-1, 1] units.
Rewritten consistently in model units that is r^2 = 4 sigma_t^2 / lam_code, so our
``lam = lam_code / 4``. Their deblur script runs lam_code = 7, zeta = 0.3 (configs: lam_code = 1;
zeta = 0.1 deblur, 0.25 SR, 1.0 inpainting): our default lam = 1.75, zeta = 0.3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from ..generators import randn_per_image
from ..priors.base import Prior
from ..schedules import DDPM_SIGMA_MAX, SCHEDULES
from .common import Callback, DDPMStepConfig, Generators, ModelMeasurement, ddim_step, sigma_vector
from .method import Method


@dataclass(frozen=True)
class DiffPIRConfig(DDPMStepConfig):
    """DiffPIR settings; every field is a YAML key.

    num_steps: denoiser calls = NFE (paper: 100; 20 for inpainting).
    lam: lambda in rho_t = lam sigma_y^2 / sigma_t^2 with sigma_y, sigma_t in the same ([-1, 1]
        model) units; the prox radius is r_t = sigma_t / sqrt(lam). lam = lam_code / 4 for the
        released code's lambda (module docstring). Default 1.75 = the deblur script's lambda 7.
    zeta: fraction of fresh noise in the re-noising step, in [0, 1] (0 = DDIM, 1 = full re-noise).
        Default 0.3 (deblur script); configs: 0.25 SR, 1.0 inpainting.
    sigma_max: top noise level (model units), clamped to 157 (t = 999) and the prior's sigma_max.
    schedule: "quad" (DiffPIR's skip: t = t_max (1 - sqrt(u))), "uniform" or "karras".
    final_data_step: also apply the prox at the last step (the released code does not).
    """

    num_steps: int = 100
    lam: float = 1.75
    zeta: float = 0.3
    sigma_max: float = DDPM_SIGMA_MAX
    schedule: str = "quad"
    final_data_step: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not (math.isfinite(self.lam) and self.lam > 0):
            raise ValueError(f"lam must be finite and > 0, got {self.lam!r}")
        if not 0 <= self.zeta <= 1:
            raise ValueError(f"zeta must be in [0, 1], got {self.zeta!r}")
        if not self.sigma_max > 0:
            raise ValueError(f"sigma_max must be > 0 (model units), got {self.sigma_max!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")



#: "paper": the deblur script's setting, 100 NFE (quad skip, lambda 7 -> lam 1.75, zeta 0.3).
#: "fast": the same 100 NFE (DiffPIR is already a 100-NFE method) on the EDM/Karras grid.
PRESETS = {
    "paper": DiffPIRConfig(num_steps=100, lam=1.75, zeta=0.3, schedule="quad"),
    "fast": DiffPIRConfig(num_steps=100, lam=1.75, zeta=0.3, schedule="karras"),
}


def sample_diffpir(prior: Prior, measurement: ModelMeasurement, config: DiffPIRConfig = DiffPIRConfig(),
                   generators: Generators = None, callback: Callback = None) -> Tensor:
    """One DiffPIR sample per image of the measurement (Gaussian noise). Returns (B, C, H, W) in model
    units."""
    operator, y, sigma_y, cfg = measurement.operator, measurement.y, measurement.sigma, config
    sigmas = cfg.noise_levels(prior, measurement)

    x = sigmas[0] * randn_per_image(measurement.image_shape, generators, y.dtype, y.device)
    for i in range(cfg.num_steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0 = prior.denoise(x, sigma_vector(sigma, x))
        last = i == cfg.num_steps - 1
        x0_hat = x0
        if not last or cfg.final_data_step:
            x0_hat = operator.prox(y, x0, sigma_y, sigma / cfg.lam**0.5)
        eps = (x - x0_hat) / sigma
        x = ddim_step(x0_hat, eps, sigma_next, cfg.zeta, generators)
        if callback is not None:
            callback({"i": i, "sigma": sigma, "x": x, "denoised": x0_hat})
    return x


METHODS = {
    "diffpir": Method(sample_diffpir, DiffPIRConfig, PRESETS, "DiffPIR", rank=40, takes_nonlinear=False),
}

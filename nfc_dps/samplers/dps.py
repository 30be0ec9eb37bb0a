"""DPS: diffusion posterior sampling (Chung et al., ICLR 2023), on the VE sigma grid.

Algorithm (DPS Alg. 1 with the released code's step normalisation), for timesteps
t_0 > t_1 > ... > t_{N-1} of the DDPM linear-beta schedule, sigma_t = sqrt((1 - abar_t) / abar_t):

    x ~ N(0, (1 + sigma_0^2) I)                       # x_vp ~ N(0, I), stored in VE units
    for i = 0 .. N-1:                                  # t = t_i, s = t_{i+1} (sigma_s = 0 at the end)
        x0_hat = D(x, sigma_t)                         # 1 NFE, autograd kept through the network
        g      = grad_x || y - A x0_hat ||_2           # per image: the norm, not its square
        x      = ancestral DDPM step t -> s (x0_hat, fresh noise)
        x      = x - zeta * g / (sqrt(abar_t) sqrt(abar_s))
    return x

Why the last factor: DPS updates the VP state, x_vp <- x_vp - zeta * grad_{x_vp} ||.||. With
x_vp = sqrt(abar) x_ve, grad_{x_vp} = grad_{x_ve} / sqrt(abar_t) at time t, and the update lands
on x_vp at time s, i.e. on x_ve = x_vp / sqrt(abar_s). So ``step_size`` is DPS's zeta' exactly.

The ancestral step is the DDPM posterior q(x_s | x_t, x0_hat); in VE units it is
x_s = (sigma_s^2 / sigma_t^2) x_t + (1 - sigma_s^2 / sigma_t^2) x0_hat + std * noise with
std^2 = sigma_s^2 (sigma_t^2 - sigma_s^2) / sigma_t^2 (``variance="small"``, DDPM's beta-tilde) or
(sigma_t^2 - sigma_s^2)(1 + sigma_s^2) / (1 + sigma_t^2) (``"large"``, beta). Both are exact
transcriptions of the VP formulas.

The residual is measured in the prior's [-1, 1] model units, as in DPS's code. The optional
``band`` (FGPS, Thaker et al. 2025; REFERENCE 2.1) replaces the residual by its low-passed
version under a hard disk whose radius grows with the DDPM timestep.

The DDPM grid (:func:`~nfc_dps.schedules.sigma_grid`) is in :mod:`nfc_dps.schedules`, shared
with DiffPIR, DDNM and DDRM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..frequency import fourier_filter, lowpass_mask
from ..generators import randn_per_image
from ..operators.base import LinearOperator
from ..operators.nonlinear import is_linear
from ..priors.base import Prior
from ..schedules import DDPM_SIGMA_MAX, NUM_TRAIN_TIMESTEPS, SCHEDULES
from .common import Callback, DDPMStepConfig, Generators, ModelMeasurement, adjoint_at, sigma_vector
from .method import Method

# ---------------------------------------------------------------------------------------------
# DPS
# ---------------------------------------------------------------------------------------------

VARIANCES = ("small", "large")
BANDS = ("none", "linear", "exponential")


@dataclass(frozen=True)
class DPSConfig(DDPMStepConfig):
    """DPS settings; every field is a YAML key.

    num_steps: ancestral steps = NFE (each with one backprop through the network). Paper: 1000.
    step_size: zeta' (dimensionless; the residual norm is in [-1, 1] model units, the update in
        DPS's VP state units). Paper App. D.1 (FFHQ): 1.0; the released configs: 0.3 for SR and
        Gaussian/motion deblur, 0.5 for inpainting. Default 0.5 (the inpainting config; use 0.3
        for SR/deblur to reproduce the repo, 1.0 for the paper).
    sigma_max: top noise level in model units (clamped to the DDPM grid's 157 and to the prior's
        sigma_max; DPS starts at t = 999, sigma = 157).
    schedule: timestep spacing on the DDPM grid, "uniform" (DDPM/DPS), "quad" or "karras".
    variance: ancestral noise, "small" (DDPM's posterior beta-tilde) or "large" (beta). DPS's ADM
        checkpoints learn the variance (between the two); our priors give only x0_hat.
    band: "none" (DPS) or the FGPS residual low-pass schedule, "linear" or "exponential"
        (radius r(u) = end - (end - start) exp(-5u), u = 1 - t/999).
    band_start, band_end: disk radius as a fraction of the measurement grid's corner frequency.
        FGPS: 10 -> 75 px on a 256 grid (corner 181 px) = 0.055 -> 0.414.
    """

    num_steps: int = 1000
    step_size: float = 0.5
    sigma_max: float = DDPM_SIGMA_MAX
    schedule: str = "uniform"
    variance: str = "small"
    band: str = "none"
    band_start: float = 10 / 181.0
    band_end: float = 75 / 181.0

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not math.isfinite(self.step_size) or self.step_size < 0:
            raise ValueError(f"step_size must be finite and >= 0, got {self.step_size!r}")
        if not self.sigma_max > 0:
            raise ValueError(f"sigma_max must be > 0 (model units), got {self.sigma_max!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.variance not in VARIANCES:
            raise ValueError(f"variance must be one of {VARIANCES}, got {self.variance!r}")
        if self.band not in BANDS:
            raise ValueError(f"band must be one of {BANDS}, got {self.band!r}")
        if not 0 <= self.band_start <= self.band_end:
            raise ValueError(f"need 0 <= band_start <= band_end, got band_start={self.band_start!r}, band_end={self.band_end!r}")


    def band_cutoff(self, t: float) -> float:
        """FGPS disk radius (fraction of the corner frequency) at DDPM timestep t (999 -> 0)."""
        u = 1 - t / (NUM_TRAIN_TIMESTEPS - 1)
        if self.band == "linear":
            return self.band_start + (self.band_end - self.band_start) * u
        return self.band_end - (self.band_end - self.band_start) * math.exp(-5 * u)


#: "paper": 1000 NFE, zeta' = 1.0 (DPS App. D.1, FFHQ). "fast": 100 NFE; zeta' = 1.0 as well, the
#: larger published value, since 10x fewer guidance steps pull 10x less in total.
PRESETS = {
    "paper": DPSConfig(num_steps=1000, step_size=1.0),
    "fast": DPSConfig(num_steps=100, step_size=1.0),
}


def ancestral_step(x: Tensor, x0_hat: Tensor, sigma: float, sigma_next: float, variance: str,
                   generators: Generators) -> Tensor:
    """DDPM's x_s ~ q(x_s | x_t, x0_hat), written in VE units (see the module docstring)."""
    if sigma_next == 0:
        return x0_hat
    c = sigma_next**2 / sigma**2
    mean = c * x + (1 - c) * x0_hat
    if variance == "small":
        var = sigma_next**2 * (1 - c)
    else:
        var = (sigma**2 - sigma_next**2) * (1 + sigma_next**2) / (1 + sigma**2)
    return mean + var**0.5 * randn_per_image(x.shape, generators, x.dtype, x.device)


def dps_guidance(prior: Prior, operator: LinearOperator, y: Tensor, x: Tensor, sigma: float,
                 band: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(x0_hat, g): the Tweedie estimate and g = grad_x ||W (y - A x0_hat)||_2 per image (VE units).

    One network call with a vector-Jacobian product: g = -J^T A^T W^T W r / ||W r||, r = y - A x0_hat.
    """
    with torch.enable_grad():
        x_in = x.detach().requires_grad_(True)
        x0_hat = prior.denoise(x_in, sigma_vector(sigma, x))
        residual = y - operator.A(x0_hat.detach())
        if band is not None:
            residual = fourier_filter(residual, band)
        norm = residual.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (x.ndim - 1)))
        if band is not None:
            residual = fourier_filter(residual, band)
        direction = -adjoint_at(operator, x0_hat.detach(), residual / norm)
        (g,) = torch.autograd.grad(x0_hat, x_in, grad_outputs=direction)
    return x0_hat.detach(), g


def sample_dps(prior: Prior, measurement: ModelMeasurement, config: DPSConfig = DPSConfig(),
               generators: Generators = None, callback: Callback = None) -> Tensor:
    """One DPS sample per image of the measurement (its noise std is not used by DPS itself; a
    nonlinear operator is differentiated through). Returns (B, C, H, W) in model units."""
    operator, y, cfg = measurement.operator, measurement.y, config
    if cfg.band != "none" and not is_linear(operator):
        raise ValueError(f"DPS's band={cfg.band!r} filters a linear operator's measurement; use band='none' with "
                         f"the nonlinear {operator.name}")
    sigmas, ts = cfg.ddpm_grid(prior)
    h, w = y.shape[-2:]

    x = (1 + sigmas[0] ** 2) ** 0.5 * randn_per_image(measurement.image_shape, generators, y.dtype, y.device)
    for i in range(cfg.num_steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        band = None
        if cfg.band != "none":
            band = lowpass_mask(h, w, cfg.band_cutoff(ts[i]), transition=0.0, device=y.device, dtype=y.dtype)
        x0_hat, g = dps_guidance(prior, operator, y, x, sigma, band)
        x = ancestral_step(x.detach(), x0_hat, sigma, sigma_next, cfg.variance, generators)
        scale = ((1 + sigma**2) * (1 + sigma_next**2)) ** 0.5  # 1 / (sqrt(abar_t) sqrt(abar_s))
        x = x - cfg.step_size * scale * g
        if callback is not None:
            callback({"i": i, "sigma": sigma, "x": x, "denoised": x0_hat})
    return x


METHODS = {
    "dps": Method(sample_dps, DPSConfig, PRESETS, "DPS", rank=30),
}

"""Noise-level grids and NFC's per-level schedules, as plain tensors and small frozen dataclasses.

All sigmas are in the prior's [-1, 1] model units (VE/EDM convention: x_sigma = x0 + sigma * n).
Level progress u_k = k / (N - 1) runs from 0 (first, noisiest level) to 1 (last level).

Grids: :func:`karras_sigmas` (EDM's poly-rho grid: NFC, DAPS, DPIR) and :func:`sigma_grid`, the
DDPM linear-beta training schedule (Ho et al. 2020) seen on the VE sigma axis,
sigma_t = sqrt((1 - abar_t) / abar_t), with its timestep skips (DPS, DiffPIR, DDNM, DDRM).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor


def karras_sigmas(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0, append_zero: bool = True) -> Tensor:
    """EDM poly-rho grid of n sigmas from sigma_max down to sigma_min (float64), then 0 if asked."""
    if n < 1:
        raise ValueError(f"need at least one level, got {n}")
    if not 0 < sigma_min <= sigma_max:
        raise ValueError(f"need 0 < sigma_min <= sigma_max, got {sigma_min}, {sigma_max}")
    if n == 1:
        sig = torch.tensor([sigma_max], dtype=torch.float64)
    else:
        ramp = torch.linspace(0, 1, n, dtype=torch.float64)
        lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
        sig = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sig, sig.new_zeros(1)]) if append_zero else sig


# ---------------------------------------------------------------------------------------------
# The DDPM (VP, linear beta) schedule seen on the VE sigma axis
# ---------------------------------------------------------------------------------------------

#: DDPM training schedule of the ADM checkpoints used by DPS, DiffPIR, DDRM and DDNM
NUM_TRAIN_TIMESTEPS = 1000
BETA_START, BETA_END = 1e-4, 0.02

SCHEDULES = ("uniform", "quad", "karras")

#: DPIR's first noise level, 49/255 in [0, 1] units, in model units: the top of the schedules that
#: stay in a plain denoiser's range (DPIR, NFC's deterministic continuation)
DPIR_SIGMA_MAX = 2 * 49 / 255
#: the deterministic continuation's first level for inpainting, model units (see
#: :func:`nfc_dps.samplers.nfc_continuation.top_sigma`)
AUTO_SIGMA_MAX_INPAINT = 0.2


def _log_sigmas_ddpm() -> Tensor:
    betas = torch.linspace(BETA_START, BETA_END, NUM_TRAIN_TIMESTEPS, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    return (((1 - abar) / abar).sqrt()).log()


_LOG_SIGMAS = _log_sigmas_ddpm()

#: sigma of the DDPM schedule at t = 0 and t = 999 (model units): about 0.0100 and 157
DDPM_SIGMA_MIN = float(_LOG_SIGMAS[0].exp())
DDPM_SIGMA_MAX = float(_LOG_SIGMAS[-1].exp())


def vp_sigma(t: Tensor | float) -> Tensor:
    """sigma(t) of the DDPM schedule for (fractional) timesteps t in [0, 999], log-linear between steps."""
    t = torch.as_tensor(t, dtype=torch.float64).clamp(0, NUM_TRAIN_TIMESTEPS - 1)
    lo = t.floor().long().clamp(max=NUM_TRAIN_TIMESTEPS - 2)
    w = t - lo
    return ((1 - w) * _LOG_SIGMAS[lo] + w * _LOG_SIGMAS[lo + 1]).exp()


def vp_timestep(sigma: float) -> float:
    """Inverse of :func:`vp_sigma` (clamped to [0, 999])."""
    log_s = math.log(min(max(sigma, DDPM_SIGMA_MIN), DDPM_SIGMA_MAX))
    i = int(torch.searchsorted(_LOG_SIGMAS, torch.tensor(log_s, dtype=torch.float64)).clamp(1, NUM_TRAIN_TIMESTEPS - 1))
    lo, hi = float(_LOG_SIGMAS[i - 1]), float(_LOG_SIGMAS[i])
    return i - 1 + (log_s - lo) / (hi - lo)


def sigma_grid(num_steps: int, sigma_max: float, schedule: str = "uniform", rho: float = 7.0) -> tuple[list[float], list[float]]:
    """(sigmas, timesteps): ``num_steps`` noise levels from min(sigma_max, 157) down to sigma(t=0) = 0.01,
    then a final 0 (sigmas has num_steps + 1 entries; timesteps has num_steps, on the DDPM 0..999 scale).

    * ``uniform``: timesteps evenly spaced from t_max to 0 (with sigma_max >= 157 and 1000 steps,
      exactly t = 999, ..., 0: DDPM/DPS);
    * ``quad``: t = t_max (1 - sqrt(u)), u uniform in [0, 1] (DiffPIR's "quad" skip: coarse at high
      noise, fine at low noise);
    * ``karras``: the EDM poly-``rho`` grid between the same end points.
    Timesteps may be fractional (sigma interpolated log-linearly), so every num_steps is valid.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    top = min(float(sigma_max), DDPM_SIGMA_MAX)
    t_max = vp_timestep(top) if top < DDPM_SIGMA_MAX else float(NUM_TRAIN_TIMESTEPS - 1)
    if schedule == "karras":
        sig = karras_sigmas(num_steps, DDPM_SIGMA_MIN, vp_sigma(t_max).item(), rho, append_zero=False)
        ts = [vp_timestep(float(s)) for s in sig]
        return sig.tolist() + [0.0], ts
    u = torch.linspace(0, 1, num_steps, dtype=torch.float64) if num_steps > 1 else torch.zeros(1, dtype=torch.float64)
    frac = u if schedule == "uniform" else u.sqrt()
    t = t_max * (1 - frac)
    return vp_sigma(t).tolist() + [0.0], t.tolist()


def level_progress(k: int, n: int) -> float:
    """u_k = k / (n - 1) in [0, 1] (1.0 when there is a single level)."""
    return 1.0 if n <= 1 else k / (n - 1)


def cosine_decay(u: float, start: float, end: float = 0.0) -> float:
    """start at u = 0, end at u = 1, half-cosine in between."""
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * u))


def smoothstep(t: float) -> float:
    t = min(max(t, 0.0), 1.0)
    return t * t * (3 - 2 * t)


#: width of the band's low-pass edge (a raised cosine), fraction of the corner frequency
BAND_TRANSITION = 0.1
#: level progress at which the Haar commitment starts unlocking the detail bands
UNLOCK_BEGIN = 0.5


@dataclass(frozen=True)
class BandSchedule:
    """Frequency-limited likelihood of NFC (arXiv 2602.00176, module 1).

    The residual's weight per frequency is W_k = (1 - lambda_k) + lambda_k * M_k, M_k a soft
    low-pass with cutoff c_k (fraction of the corner frequency of the measurement grid):

    * ``cutoff="linear"``: c_k = cutoff_start + (1 - cutoff_start) * u_k (the paper's 0.4 -> 1.0);
    * ``cutoff="spectral"``: c_k solves S(c) = sigma_k^2 for the power law S fitted to
      the measurement (clamped to [cutoff_start, 1]): the frequency where the image spectrum
      meets the current diffusion noise (for a stationary Gaussian prior the denoiser is the Wiener gain S/(S +
      sigma^2), a low-pass with cutoff S(c) = sigma^2);
    * lambda_k = cosine decay from ``blend_start`` to 0; the last level is all-pass (lambda = 0,
      c = 1) so the target returns to the true posterior.
    M_k's edge is a raised cosine ``BAND_TRANSITION`` wide (fraction of the corner frequency).
    """

    cutoff: str = "linear"
    cutoff_start: float = 0.4
    blend_start: float = 0.35

    def __post_init__(self) -> None:
        if self.cutoff not in ("linear", "spectral"):
            raise ValueError(f"cutoff must be 'linear' or 'spectral', got {self.cutoff!r}")
        if not 0 <= self.blend_start <= 1:
            raise ValueError(f"blend_start must be in [0, 1], got {self.blend_start}")

    @property
    def active(self) -> bool:
        return self.blend_start > 0

    def blend(self, k: int, n: int) -> float:
        if k >= n - 1:
            return 0.0
        return cosine_decay(level_progress(k, n), self.blend_start, 0.0)

    def linear_cutoff(self, k: int, n: int) -> float:
        if k >= n - 1:
            return 1.0
        u = level_progress(k, n)
        return self.cutoff_start + (1.0 - self.cutoff_start) * u

    def spectral_cutoff(self, crossing: Tensor, k: int, n: int) -> Tensor:
        """Per-image cutoff (B,) from the radius where S meets sigma_k^2 (see
        ``samplers.gaussian_step.spectral_crossing``), clamped to [cutoff_start, 1]; 1 at the last level."""
        if k >= n - 1:
            return torch.ones_like(crossing)
        return crossing.clamp(self.cutoff_start, 1.0)


@dataclass(frozen=True)
class DetailSchedule:
    """Haar-domain commitment of NFC (arXiv 2602.00176, module 2).

    The refined x0 and the predictor's x0_hat are fused in a ``levels``-level orthonormal Haar
    domain: the LL band takes the refinement (weight 1), every detail band
    w_k = detail_weight + (1 - detail_weight) * unlock_k, where unlock_k rises from
    ``unlock_start`` to 1 by a smoothstep that begins at progress ``UNLOCK_BEGIN`` (the paper's
    "d_s": unlocking early costs dB). Every weight is exactly 1 at the last level.
    """

    levels: int = 1
    detail_weight: float = 0.2
    unlock_start: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.levels <= 8:
            raise ValueError(f"levels must be in [0, 8], got {self.levels}")
        for name in ("detail_weight", "unlock_start"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")

    @property
    def active(self) -> bool:
        return self.levels > 0 and self.detail_weight < 1

    def unlock(self, k: int, n: int) -> float:
        ramp = smoothstep((level_progress(k, n) - UNLOCK_BEGIN) / (1 - UNLOCK_BEGIN))
        return self.unlock_start + (1 - self.unlock_start) * ramp

    def weights(self, k: int, n: int) -> tuple[float, float]:
        """(low_weight_k, detail_weight_k): (1, w_k); both exactly 1.0 at the last level."""
        if k >= n - 1:
            return 1.0, 1.0
        return 1.0, self.detail_weight + (1 - self.detail_weight) * self.unlock(k, n)


def as_dict(schedule) -> dict:
    """A schedule's fields as a plain dict (for saving next to results)."""
    return asdict(schedule)

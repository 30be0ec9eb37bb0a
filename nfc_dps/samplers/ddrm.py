"""DDRM: denoising diffusion restoration in a basis where the operator is diagonal.

DDRM (Kawar et al., NeurIPS 2022) in a basis where A is diagonal with singular values s_k: the
Fourier basis for circulant blur (A = F* diag(H) F, s = |H|, y_bar = Y / H) and the pixel basis
for inpainting (s = mask) and denoising (s = 1). Per component, with sigma_k = sigma_y / s_k and
x_bar = the transformed x0_hat, for the step sigma_i -> sigma_{i+1}:

    s_k = 0 (or below ``singular_cutoff``): x_bar + sqrt(1-eta^2) sigma_{i+1} (x_t - x_bar) / sigma_i + eta sigma_{i+1} z
    sigma_{i+1} <  sigma_k:               x_bar + sqrt(1-eta^2) sigma_{i+1} (y_bar - x_bar) / sigma_k + eta sigma_{i+1} z
    sigma_{i+1} >= sigma_k:               (1 - eta_b) x_bar + eta_b y_bar + sqrt(sigma_{i+1}^2 - eta_b^2 sigma_k^2) z

(z is the transform of real white noise, so every coefficient stays Hermitian and the image real.)

The basis is the one the operator declares (``LinearOperator.diagonal_basis``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..operators.base import LinearOperator, randn_per_image
from ..priors.base import Prior
from ..schedules import DDPM_SIGMA_MAX, sigma_grid
from .common import (StepConfig, Callback, Generators, check_step_settings, counting, schedule_top, sigma_vector,
                     to_image_units, to_model_units)


@dataclass(frozen=True)
class DDRMConfig(StepConfig):
    """DDRM settings; every field is a YAML key.

    num_steps: denoiser calls = NFE (DDRM: 20).
    eta: noise weight for components less noisy than the measurement or unobserved (DDRM: 0.85).
    eta_b: weight of the measurement for components noisier than it (DDRM: 1.0).
    singular_cutoff: singular values |H| below this are treated as 0 (unobserved). DDRM zeroes
        small singular values too (1e-3 to 5e-2 across its operator classes); default 3e-2.
    sigma_max, schedule: as for DDNM ("uniform" = DDRM's skip on the DDPM grid).
    """

    num_steps: int = 20
    eta: float = 0.85
    eta_b: float = 1.0
    singular_cutoff: float = 3e-2
    sigma_max: float = DDPM_SIGMA_MAX
    schedule: str = "uniform"

    def __post_init__(self) -> None:
        check_step_settings(self.num_steps, self.eta, self.sigma_max, self.schedule)
        if not 0 <= self.eta_b <= 1:
            raise ValueError(f"eta_b must be in [0, 1], got {self.eta_b!r}")
        if not (math.isfinite(self.singular_cutoff) and self.singular_cutoff >= 0):
            raise ValueError(f"singular_cutoff must be finite and >= 0, got {self.singular_cutoff!r}")



#: "paper": DDRM's 20 NFE, eta 0.85, eta_b 1. "fast": 100 NFE.
PRESETS = {
    "paper": DDRMConfig(num_steps=20),
    "fast": DDRMConfig(num_steps=100),
}


@dataclass
class SpectralBasis:
    """A diagonalising basis of A: forward/inverse transforms, singular values s (broadcastable
    to the transformed image) and y_bar = the measurement divided by s in that basis."""

    forward: Callable[[Tensor], Tensor]
    inverse: Callable[[Tensor], Tensor]
    singular: Tensor
    y_bar: Tensor


def spectral_basis(operator: LinearOperator, y: Tensor, image_shape: tuple[int, ...], cutoff: float) -> SpectralBasis:
    """The operator's declared ``diagonal_basis``: Fourier for circulant operators (blur with
    circular boundary, denoising), pixel for masks (inpainting)."""
    h, w = image_shape[-2:]
    basis = operator.diagonal_basis
    if basis == "fourier":
        H = operator.transfer_function(h, w, dtype=y.dtype, device=y.device)
        s = H.abs()
        observed = s > cutoff
        safe = torch.where(observed, H, torch.ones_like(H))
        y_bar = torch.where(observed, torch.fft.fft2(y, norm="ortho") / safe, torch.zeros_like(H))
        return SpectralBasis(lambda v: torch.fft.fft2(v, norm="ortho"),
                             lambda v: torch.fft.ifft2(v, norm="ortho").real,
                             torch.where(observed, s, torch.zeros_like(s)), y_bar)
    if basis == "pixel":
        if tuple(y.shape[-2:]) != (h, w):
            raise ValueError("DDRM's pixel basis needs a full-size masked measurement")
        s = operator.pixel_mask().to(dtype=y.dtype, device=y.device)[None, None]
        s = torch.where(s > cutoff, s, torch.zeros_like(s))
        y_bar = torch.where(s > 0, y / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(y))
        return SpectralBasis(lambda v: v, lambda v: v, s, y_bar)
    raise ValueError(operator_problem(operator))


def operator_problem(operator: LinearOperator) -> str | None:
    """Why DDRM cannot restore ``operator`` (it needs the operator's diagonal basis), or None."""
    if operator.diagonal_basis in ("fourier", "pixel"):
        return None
    padded = operator.image_region() is not None  # declared by a padded canvas (CroppedOperator)
    return (f"DDRM needs a diagonalisable operator (circulant blur or denoising, inpainting mask), got "
            f"{type(operator).__name__}"
            + (" (the image size is not a multiple of the prior's size_multiple, so it is restored on a padded "
               "canvas, which no basis diagonalises; crop the image to a multiple)" if padded else "")
            + "; use method 'ddnm' instead")


def sample_ddrm(
    prior: Prior,
    operator: LinearOperator,
    y: Tensor,
    sigma_y: float,
    image_shape: tuple[int, ...],
    config: DDRMConfig = DDRMConfig(),
    generators: Generators = None,
    callback: Callback = None,
) -> Tensor:
    """One DDRM sample per image (circulant blur, inpainting, denoising). Units as :func:`~nfc_dps.samplers.ddnm.sample_ddnm`."""
    prior = counting(prior)
    prob = to_model_units(operator, y, sigma_y, image_shape)
    cfg = config
    sigmas, _ = sigma_grid(cfg.num_steps, schedule_top(prior, min(cfg.sigma_max, DDPM_SIGMA_MAX)), cfg.schedule)
    noise = 2.0 * float(sigma_y)
    basis = spectral_basis(operator, prob.y, image_shape, cfg.singular_cutoff)
    s = basis.singular
    observed = s > 0
    # per-component measurement noise sigma_y / s (0 where unobserved: unused there)
    sig_k = torch.where(observed, noise / torch.where(observed, s, torch.ones_like(s)), torch.zeros_like(s))

    x = sigmas[0] * randn_per_image(image_shape, generators, y.dtype, y.device)
    for i in range(cfg.num_steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0_hat = prior.denoise(x, sigma_vector(sigma, x))
        xb, xtb = basis.forward(x0_hat), basis.forward(x)
        z = basis.forward(randn_per_image(image_shape, generators, y.dtype, y.device)) if sigma_next > 0 else 0.0
        direction = (1 - cfg.eta**2) ** 0.5 * sigma_next
        missing = xb + direction * (xtb - xb) / sigma + cfg.eta * sigma_next * z
        less_noisy = sigma_next < sig_k
        safe_k = torch.where(less_noisy, sig_k, torch.ones_like(sig_k))
        soft = xb + direction * (basis.y_bar - xb) / safe_k + cfg.eta * sigma_next * z
        hard_std = (sigma_next**2 - cfg.eta_b**2 * sig_k**2).clamp_min(0).sqrt()
        hard = (1 - cfg.eta_b) * xb + cfg.eta_b * basis.y_bar + hard_std * z
        xb_next = torch.where(~observed, missing, torch.where(less_noisy, soft, hard))
        x = basis.inverse(xb_next)
        if callback is not None:
            callback({"step": i, "sigma": sigma, "x": x, "x0_hat": x0_hat, "nfe": prior.nfe})
    return to_image_units(x)

"""DDRM: denoising diffusion restoration in the operator's singular basis.

DDRM (Kawar et al., NeurIPS 2022) in the basis of the operator's decomposition A = U diag(d) V^H
(``LinearOperator.decomposition``), singular values s_k = |d_k|, y_bar = U^H y / d: the Fourier
basis for circulant blur and denoising (d = H), the pixel basis for inpainting (d = mask), the
channel basis for colour mixing. Per component, with sigma_k = sigma_y / s_k and
x_bar = V^H x0_hat, for the step sigma_i -> sigma_{i+1}:

    s_k = 0 (or below ``singular_cutoff``): x_bar + sqrt(1-eta^2) sigma_{i+1} (x_t - x_bar) / sigma_i + eta sigma_{i+1} z
    sigma_{i+1} <  sigma_k:               x_bar + sqrt(1-eta^2) sigma_{i+1} (y_bar - x_bar) / sigma_k + eta sigma_{i+1} z
    sigma_{i+1} >= sigma_k:               (1 - eta_b) x_bar + eta_b y_bar + sqrt(sigma_{i+1}^2 - eta_b^2 sigma_k^2) z

(z = V^H of real white noise, so in Fourier every coefficient stays Hermitian and the image real.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..generators import randn_per_image
from ..operators.base import LinearOperator
from ..operators.decomposition import Decomposition
from ..priors.base import Prior
from ..schedules import DDPM_SIGMA_MAX
from .common import Callback, DDPMStepConfig, Generators, ModelMeasurement, check_step_settings, sigma_vector
from .method import Method


@dataclass(frozen=True)
class DDRMConfig(DDPMStepConfig):
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
class MeasuredCoefficients:
    """The measurement in the operator's basis: singular values s (broadcastable to the image's
    coefficients; 0 where unobserved or below the cutoff) and y_bar = U^H y / d there (0 elsewhere)."""

    singular: Tensor
    y_bar: Tensor


def measured_coefficients(decomposition: Decomposition, y: Tensor, image_shape: tuple[int, ...],
                          cutoff: float) -> MeasuredCoefficients:
    """y in the basis of A = U diag(d) V^H, components with |d| <= ``cutoff`` taken as unobserved."""
    d = decomposition.diagonal(*image_shape[-2:], y.dtype, y.device)
    s = d.abs()
    observed = s > cutoff
    safe = torch.where(observed, d, torch.ones_like(d))
    y_bar = torch.where(observed, decomposition.U_adjoint(y) / safe, torch.zeros_like(d))
    return MeasuredCoefficients(torch.where(observed, s, torch.zeros_like(s)), y_bar)


def operator_problem(operator: LinearOperator) -> str | None:
    """Why DDRM cannot restore ``operator`` (it needs the operator's decomposition), or None."""
    if operator.decomposition() is not None:
        return None
    padded = operator.image_region() is not None  # declared by a padded canvas (CroppedOperator)
    return (f"DDRM needs a diagonalisable operator (one with a singular decomposition: circulant blur, denoising, "
            f"inpainting mask, channel mixing), got {type(operator).__name__}"
            + (" (the image size is not a multiple of the prior's size_multiple, so it is restored on a padded "
               "canvas, which no basis diagonalises; crop the image to a multiple)" if padded else "")
            + "; use method 'ddnm' instead")


def sample_ddrm(prior: Prior, measurement: ModelMeasurement, config: DDRMConfig = DDRMConfig(),
                generators: Generators = None, callback: Callback = None) -> Tensor:
    """One DDRM sample per image (an operator with a decomposition). Units as :func:`~nfc_dps.samplers.ddnm.sample_ddnm`."""
    operator, y, image_shape, cfg = measurement.operator, measurement.y, measurement.image_shape, config
    sigmas, noise = cfg.noise_levels(prior, measurement), measurement.noise
    basis = operator.decomposition()
    if basis is None:
        raise ValueError(operator_problem(operator))
    measured = measured_coefficients(basis, y, image_shape, cfg.singular_cutoff)
    s = measured.singular
    observed = s > 0
    # per-component measurement noise sigma_y / s (0 where unobserved: unused there)
    sig_k = torch.where(observed, noise / torch.where(observed, s, torch.ones_like(s)), torch.zeros_like(s))

    x = sigmas[0] * randn_per_image(image_shape, generators, y.dtype, y.device)
    for i in range(cfg.num_steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0_hat = prior.denoise(x, sigma_vector(sigma, x))
        xb, xtb = basis.V_adjoint(x0_hat), basis.V_adjoint(x)
        z = basis.V_adjoint(randn_per_image(image_shape, generators, y.dtype, y.device)) if sigma_next > 0 else 0.0
        direction = (1 - cfg.eta**2) ** 0.5 * sigma_next
        missing = xb + direction * (xtb - xb) / sigma + cfg.eta * sigma_next * z
        less_noisy = sigma_next < sig_k
        safe_k = torch.where(less_noisy, sig_k, torch.ones_like(sig_k))
        soft = xb + direction * (measured.y_bar - xb) / safe_k + cfg.eta * sigma_next * z
        hard_std = (sigma_next**2 - cfg.eta_b**2 * sig_k**2).clamp_min(0).sqrt()
        hard = (1 - cfg.eta_b) * xb + cfg.eta_b * measured.y_bar + hard_std * z
        xb_next = torch.where(~observed, missing, torch.where(less_noisy, soft, hard))
        x = basis.V(xb_next)
        if callback is not None:
            callback({"i": i, "sigma": sigma, "x": x, "denoised": x0_hat})
    return x


METHODS = {
    "ddrm": Method(sample_ddrm, DDRMConfig, PRESETS, "DDRM", rank=60, takes_nonlinear=False,
                   operator_problem=operator_problem,
                   noise_kinds=frozenset({"gaussian"})),  # its SVD does not survive per-pixel weights,
}

"""DDNM+: null-space decomposition sampling for any operator with a pseudo-inverse.

DDNM+ (Wang et al., ICLR 2023), VE units, sigma_0 > ... > sigma_{N-1}, sigma_N = 0:

    x ~ N(0, sigma_0^2 I)
    for i = 0 .. N-1:
        x0_hat  = D(x, sigma_i)                                     # 1 NFE
        eps     = (x - x0_hat) / sigma_i                            # the network's epsilon
        x0_hat' = range-space correction of x0_hat (below)
        x       = x0_hat' + gamma_i (sqrt(1 - eta^2) eps + eta noise)
    return x

Range-space correction, ``correction=``:

* ``"scaled"`` -- DDNM+'s scalar rule: x0_hat' = x0_hat + lam_i A^+(y - A x0_hat) with
  lam_i = 1 and gamma_i = sqrt(sigma_{i+1}^2 - sigma_y^2) while sigma_{i+1} >= sigma_y, else
  lam_i = sigma_{i+1} / sigma_y and gamma_i = 0: the correction's noise lam_i A^+ n is counted
  against the next level's noise budget. Where A A^T = c I (inpainting and denoising: c = 1;
  one row w of channel weights: c = ||w||^2; block-average SR by s: c = 1 / s^2) A^+ n is noise of std sigma_y /
  sqrt(c) on each orthonormal direction of A's row space, and
  sigma_y / sqrt(c) is what the rule counts (:func:`row_space_noise`); gamma_i re-noises A's
  null space too (:func:`scaled_projection`). Other operators with a decomposition (circulant blur,
  denoising) take the rule per singular value, as DDNM+'s SVD form: lam_k = min(1, s_k
  sigma_{i+1} / sigma_y), gamma_k re-noises component k alone, components with
  s_k <= ``singular_cutoff`` dropped (:func:`scaled_rule`). For bicubic SR the scalar rule counts
  sigma_y, an approximation, since A^+ amplifies the noise unevenly there (use "prox").
* ``"prox"`` -- DDNM+ (prox variant), our noise-aware form: x0_hat' = prox(y, x0_hat, sigma_y,
  r = sigma_i) = argmin ||y - A z||^2 / (2 sigma_y^2) + ||z - x0_hat||^2 / (2 sigma_i^2), the
  Gaussian-conditional mean if x0_hat's error had std sigma_i. In a singular basis it takes
  component k from y in proportion s_k^2 sigma_i^2 / (s_k^2 sigma_i^2 + sigma_y^2): DDRM's
  "s_k sigma_t > sigma_y" rule in soft form. gamma_i = sigma_{i+1} (plain DDIM step).
With sigma_y = 0 both are DDNM's exact projection x0_hat + A^+(y - A x0_hat) at every step, so
the output satisfies A x = y. Not implemented: DDNM+'s "time-travel" (back-and-forth) resampling.
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
from .common import Callback, DDPMStepConfig, Generators, ModelMeasurement, check_step_settings, ddim_step, sigma_vector
from .method import Method

CORRECTIONS = ("prox", "scaled")


@dataclass(frozen=True)
class DDNMConfig(DDPMStepConfig):
    """DDNM+ settings; every field is a YAML key.

    num_steps: denoiser calls = NFE (DDNM: 100).
    eta: noise weight of the re-noising step in [0, 1] (fresh noise eta, DDIM direction
        sqrt(1 - eta^2)); DDNM/DDRM: 0.85.
    correction: "prox" (noise-aware prox, robust on every operator) or "scaled" (DDNM+'s scalar
        rule); see the module docstring. Both are exact null-space DDNM when sigma_y = 0.
    singular_cutoff: for "scaled" on circulant operators (blur, denoising) the rule is applied per
        singular value (DDNM+'s SVD form, :func:`scaled_rule`) and components with |d| <= this
        are dropped, as DDNM's SVD operators (taken from DDRM) do; default 3e-2.
    sigma_max: top noise level (model units), clamped to 157 and to the prior's sigma_max.
    schedule: "uniform" (DDNM's skip on the DDPM grid), "quad" or "karras".
    """

    num_steps: int = 100
    eta: float = 0.85
    correction: str = "prox"
    singular_cutoff: float = 3e-2
    sigma_max: float = DDPM_SIGMA_MAX
    schedule: str = "uniform"

    def __post_init__(self) -> None:
        check_step_settings(self.num_steps, self.eta, self.sigma_max, self.schedule)
        if not (math.isfinite(self.singular_cutoff) and self.singular_cutoff >= 0):
            raise ValueError(f"singular_cutoff must be finite and >= 0, got {self.singular_cutoff!r}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {self.correction!r}")



#: "paper": DDNM+ as published (scalar rule), 100 NFE, eta 0.85, no time-travel.
#: "fast": 100 NFE with the prox correction (the robust choice for blur and bicubic SR).
PRESETS = {
    "paper": DDNMConfig(num_steps=100, eta=0.85, correction="scaled"),
    "fast": DDNMConfig(num_steps=100, eta=0.85, correction="prox"),
}


def gram_scale(operator: LinearOperator, h: int, w: int) -> float | None:
    """c when the nonzero eigenvalues of A^T A, as the operator declares them, all equal c
    (A A^T = c I: a mask, denoising, colour mixing, block-average SR), else None (they differ or
    are not declared)."""
    lam = operator.gram_eigenvalues(h, w)
    if lam is None or not bool((lam > 0).any()):
        return None
    nonzero = lam[lam > 1e-12 * lam.max()]
    c = float(nonzero.max())
    return c if float(nonzero.min()) >= c * (1 - 1e-9) else None


def scaled_projection(operator: LinearOperator, h: int, w: int) -> bool:
    """A A^T = c I and A has a null space (a mask, a row of channel weights, block-average SR). For
    such an operator DDNM+'s scalar rule and its SVD form agree on the row space and differ on the
    null space only; elsewhere with a decomposition (blur, denoising) the SVD form is the rule."""
    lam = operator.gram_eigenvalues(h, w)
    return gram_scale(operator, h, w) is not None and bool((lam <= 1e-12 * lam.max()).any())


def row_space_noise(operator: LinearOperator, h: int, w: int, noise: float) -> float:
    """The std of A^+ n on each orthonormal direction of A's row space, for n white of std ``noise``:
    noise / sqrt(c) when A A^T = c I (:func:`gram_scale`); ``noise`` itself otherwise (an
    approximation)."""
    c = gram_scale(operator, h, w)
    return noise if c is None else noise / math.sqrt(c)


def scaled_rule(decomposition: Decomposition, residual: Tensor, sigma_next: float, noise: float, cutoff: float
                ) -> tuple[Tensor, Tensor]:
    """DDNM+'s noise-aware rule per singular value of A = U diag(d) V^H.

    Component k takes lambda_k = min(1, s_k sigma_next / noise) of A^+ (y - A x0_hat) (s_k = |d_k|;
    components with s_k <= cutoff are dropped, as DDNM's SVD operators do) and is re-noised with
    gamma_k = sqrt(sigma_next^2 - (lambda_k noise / s_k)^2), so its total noise stays sigma_next.
    Returns (correction image, gamma, real and broadcastable to the coefficients).
    """
    d = decomposition.diagonal(*residual.shape[-2:], residual.dtype, residual.device)
    s = d.abs()
    keep = s > cutoff
    safe = torch.where(keep, s, torch.ones_like(s))
    lam = torch.where(keep, (safe * sigma_next / noise).clamp(max=1.0), torch.zeros_like(s))
    inv = torch.where(keep, lam / torch.where(keep, d, torch.ones_like(d)), torch.zeros_like(d))
    correction = decomposition.backproject(residual, inv)
    gamma = (sigma_next**2 - (lam * noise / safe) ** 2).clamp_min(0).sqrt()
    return correction, gamma


def sample_ddnm(prior: Prior, measurement: ModelMeasurement, config: DDNMConfig = DDNMConfig(),
                generators: Generators = None, callback: Callback = None) -> Tensor:
    """One DDNM+ sample per image of the measurement (Gaussian noise). Returns (B, C, H, W) in model
    units."""
    operator, y, image_shape, cfg = measurement.operator, measurement.y, measurement.image_shape, config
    noise = measurement.noise  # the stated noise std (measurement.sigma is floored)
    sigmas = cfg.noise_levels(prior, measurement)

    basis = operator.decomposition()
    if cfg.correction == "scaled" and scaled_projection(operator, *image_shape[-2:]):
        basis = None  # DDNM+'s scalar rule, which re-noises the null space with the row space's gamma
    if cfg.correction == "scaled" and basis is None and noise > 0:
        row_noise = row_space_noise(operator, *image_shape[-2:], noise)

    x = sigmas[0] * randn_per_image(image_shape, generators, y.dtype, y.device)
    for i in range(cfg.num_steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0_hat = prior.denoise(x, sigma_vector(sigma, x))
        eps = (x - x0_hat) / sigma
        gamma: float | Tensor = sigma_next
        if noise == 0:
            x0_c = x0_hat + operator.A_pinv(y - operator.A(x0_hat))
        elif cfg.correction == "prox":
            x0_c = operator.prox(y, x0_hat, noise, sigma)
        elif basis is not None:  # the SVD form of the scalar rule: one lambda per singular value
            correction, gamma = scaled_rule(basis, y - operator.A(x0_hat), sigma_next, noise, cfg.singular_cutoff)
            x0_c = x0_hat + correction
        else:
            lam = 1.0 if sigma_next >= row_noise else sigma_next / row_noise
            gamma = math.sqrt(max(sigma_next**2 - (lam * row_noise) ** 2, 0.0))
            x0_c = x0_hat + lam * operator.A_pinv(y - operator.A(x0_hat))
        if isinstance(gamma, Tensor):  # re-noising weights per singular value
            direction = (1 - cfg.eta**2) ** 0.5 * eps
            if cfg.eta > 0 and sigma_next > 0:
                direction = direction + cfg.eta * randn_per_image(x0_c.shape, generators, x0_c.dtype, x0_c.device)
            x = x0_c + basis.scale(direction, gamma)
        else:
            x = ddim_step(x0_c, eps, gamma, cfg.eta**2, generators)
        if callback is not None:
            callback({"i": i, "sigma": sigma, "x": x, "denoised": x0_c})
    return x


METHODS = {
    "ddnm": Method(sample_ddnm, DDNMConfig, PRESETS, "DDNM+", rank=50, takes_nonlinear=False),
}

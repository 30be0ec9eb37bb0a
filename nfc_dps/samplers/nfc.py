"""Noise-frequency continuation (NFC) posterior sampling, and DAPS as NFC with its modules off.

Algorithm (arXiv 2602.00176, on DAPS's skeleton), for levels sigma_0 > ... > sigma_{N-1}, sigma_N = 0:

    x ~ N(0, sigma_0^2 I)                     (start "noise"; or x = an estimate from y, no noise)
    for k = 0 .. N-1:
        x0_hat = PF-ODE(x, sigma_k -> sigma_ode_min, n Euler steps)            # n NFE
        x0     = inner(x0_hat, r_k, band W_k)                                  # operator calls only
                 target ∝ exp(-||W_k (y - A x0)||^2 / 2 sigma_y^2) N(x0; x0_hat, C_k / lam)
        x0     = HaarFuse(x0, x0_hat, w_L, w_H(k))                             # commit coarse first
        x      = x0 + sigma_{k+1} * noise     (renoise "fresh"; "none": x = x0; "matched":
                 noise of std sqrt(max(sigma_{k+1}^2 - e_k^2, 0)), e_k^2 the inner step's error)
    return x

W_k = (1 - lambda_k) + lambda_k M_k, M_k a soft low-pass on the measurement grid whose cutoff
widens with k (``BandSchedule``); C_k = sigma_k^2 I (``isotropic``, DAPS) or the Gaussian-prior
posterior covariance S sigma_k^2 / (S + sigma_k^2) per frequency (``spectral``); lam the inner
step's ``prior_weight`` (1 in the paper). The inner step is DAPS's Langevin dynamics or an exact
Gaussian-conditional sample (perturb-and-solve).

Two regimes. The paper's (start "noise", renoise "fresh", sigma from 100): a posterior sampler.
The deterministic continuation (start from the measurement, renoise "none", conditional-mean
inner steps, a short range below ~0.4 model units, lam near DPIR's 0.23): a plug-and-play estimate.
The band and the Haar commitment can act there too; the ``deterministic`` preset leaves them off.
With ``self_ensemble`` the network's call j sees its input under the (j mod 8)-th symmetry of the
square (DPIR's periodical geometric self-ensemble; ``self_ensemble.py``).
With ``band.blend_start = 0`` and ``detail.levels = 0`` this is exactly DAPS.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor

from ..frequency import fourier_filter, haar_fuse, lowpass_mask
from ..operators.base import Generators, LinearOperator, pixel_gain, randn_per_image
from ..priors.base import Prior
from ..schedules import AUTO_SIGMA_MAX_INPAINT, DPIR_SIGMA_MAX, BandSchedule, DetailSchedule, karras_sigmas
from .common import (
    START_ESTIMATES,
    Callback,
    StepConfig,
    check_budget,
    check_flag,
    counting,
    initial_estimate,
    pf_ode_predict,
    schedule_top,
    to_image_units,
    to_model_units,
)
from .gaussian_step import (
    conditional_error_variance,
    fit_spectrum_from_measurement,
    normal_eigenvalues,
    gaussian_conditional,
    is_nonwrapping_blur,
    pixel_coverage,
    spectral_crossing,
    spectral_prior_variance,
)
from .self_ensemble import SelfEnsemblePrior

INNER_SOLVERS = ("langevin", "exact")
PRIOR_COVARIANCES = ("isotropic", "spectral")
SPECTRUM_SOURCES = ("auto", "measurement", "prior")
FINAL_STEPS = ("sample", "mean")
STARTS = ("noise", *START_ESTIMATES)
RENOISE = ("fresh", "none", "matched")
#: ``sigma_max="auto"``, model units: DPIR's first level (49/255 in [0, 1] units), except for
#: inpainting (``AUTO_SIGMA_MAX_INPAINT``): the observed pixels carry only the measurement noise and
#: the Wiener start already holds the linear-MMSE fill of the holes, which deterministic steps from
#: higher up replace by the prior's guess (docs/notes/presets.md, "Range for inpainting"); never
#: below the measurement noise itself
AUTO_SIGMA_MAX = DPIR_SIGMA_MAX
#: the building blocks :func:`sample_nfc` enters ``timer(phase)`` around (a profiling hook)
PHASES = ("spectrum", "predictor", "inner_exact", "inner_langevin", "band", "haar", "renoise")
#: ``timer(phase)`` returns a context manager entered around each call of that building block
PhaseTimer = Callable[[str], ContextManager[Any]]


@dataclass(frozen=True)
class NFCConfig(StepConfig):
    """NFC / DAPS settings; every field is a YAML key (sigmas in [-1, 1] model units).

    num_levels: N annealing levels. ode_steps: n Euler steps of the predictor (NFE = N * n).
    sigma_max / sigma_min: annealing range (clamped to the prior's range); rho: EDM grid exponent.
    sigma_max may be "auto" (the deterministic preset): max(``AUTO_SIGMA_MAX_INPAINT``, sigma_y)
    when the operator's family is "inpaint", else ``AUTO_SIGMA_MAX`` (see :func:`top_sigma`).
    ode_sigma_min: where the predictor's ODE stops (DAPS: 0.01).
    inner: "langevin" (DAPS's, ``langevin_steps`` steps, step = ``langevin_step`` / Lipschitz,
    decayed linearly to ``langevin_step * langevin_decay`` over the levels) or "exact".
    prior_covariance: "isotropic" (DAPS: sigma_k^2 I) or "spectral".
    spectrum: where S (for the spectral covariance and the spectral cutoff) comes from:
    "measurement" (a power law fitted to A^+ y), "prior" (``prior.spectrum(h, w)``: the power
    law the prior declares, or the Gaussian oracle's true spectrum) or "auto": the prior's exact
    spectrum when it has one (the Gaussian oracle); else the measurement's when the inner step
    is a conditional mean (``inner_temperature`` 0) and the operator observes every pixel (blur,
    SR, denoising: A^+ y is a whole image to fit), except a blur that does not wrap (reflect or
    valid boundary: its A^+ y is an early-stopped solve); else the prior's declared law, or the
    measurement's when it declares none. The fit is to the unregularised A^+ y, so on a blur it
    also sees amplified noise: a larger, flatter S, i.e. less trust in x0_hat (docs/notes/presets.md,
    "Spectrum", compares the sources).
    final_step: at the last level, "sample" returns a draw from p(x0 | x, y) (DAPS), "mean" its
    mean E[x0 | x, y] (the usual final denoising step; no sigma_min-sized noise in the output).
    inner_temperature: t scales the inner step's noise so that it targets the same mean with t^2
    times the covariance: 1 = the posterior sampler of the paper (DAPS's inner step); 0 = the
    conditional mean at every level (a deterministic data step, as DDNM and DiffPIR take; the
    re-noising between levels still draws fresh noise). Values below 1 trade sample diversity
    (and so a calibrated ``std`` map) for PSNR.
    start: the first x: "noise" (sigma_max times white noise, the paper) or an estimate from the
    measurement with no noise added ("pinv", "adjoint", "tikhonov", "wiener": see
    ``initial_estimate``; "wiener" uses the spectrum chosen by ``spectrum``).
    renoise: between levels, "fresh" (x_{k+1} = x0 + sigma_{k+1} eps, the paper), "none"
    (x_{k+1} = x0: the next level denoises the data step's output as it is, as plug-and-play
    methods do) or "matched": only the noise that the data step's output lacks, std
    sqrt(max(sigma_{k+1}^2 - e_k^2, 0)) with e_k^2 the inner step's expected squared error per
    pixel under its own Gaussian model (``gaussian_step.conditional_error_variance``), so that the
    next denoiser's input carries about the sigma_{k+1} it is told (the band weight and the Haar
    fuse are not in that model). Needs the eigenvalues of A^T A: the operator's
    ``approximate_gram_eigenvalues`` (exact where it declares them).
    prior_weight: lam, the inner step's prior covariance is C_k / lam: below 1 the data step
    trusts x0_hat less (DPIR's HQS weighting is lam = 0.23 on r_k = sigma_k).
    noise_floor: the last level is max(sigma_min, noise_floor * sigma_y), sigma_y in model units:
    below the measurement noise a data step cannot tell detail from noise (DPIR: 1). 0 = off.
    cg_iterations: cap on the conjugate-gradient iterations of the exact inner step where it has
    no closed form (spectral covariance with inpainting, SR, reflect-boundary blur).
    self_ensemble: DPIR's periodical geometric self-ensemble: network call j sees its input under
    the (j mod 8)-th flip/quarter turn and its output is turned back (``SelfEnsemblePrior``); no
    extra NFE. The deterministic and fast_psnr presets use it; the posterior samplers (fast, paper)
    do not.
    band / detail: NFC's two modules (see ``BandSchedule`` and ``DetailSchedule``).
    """

    num_levels: int = 200
    ode_steps: int = 5
    sigma_max: float | str = 100.0
    sigma_min: float = 0.1
    rho: float = 7.0
    ode_sigma_min: float = 0.01
    inner: str = "langevin"
    langevin_steps: int = 200
    langevin_step: float = 0.5
    langevin_decay: float = 0.01
    prior_covariance: str = "isotropic"
    spectrum: str = "auto"
    final_step: str = "mean"
    inner_temperature: float = 1.0
    start: str = "noise"
    renoise: str = "fresh"
    prior_weight: float = 1.0
    noise_floor: float = 0.0
    cg_iterations: int = 20
    self_ensemble: bool = False
    band: BandSchedule = field(default_factory=BandSchedule)
    detail: DetailSchedule = field(default_factory=DetailSchedule)

    def __post_init__(self) -> None:
        number = isinstance(self.sigma_max, numbers.Real) and not isinstance(self.sigma_max, bool)
        if self.sigma_max != "auto" and not (number and math.isfinite(self.sigma_max) and self.sigma_max > 0):
            raise ValueError(f"sigma_max must be a finite number > 0 (model units) or 'auto', got {self.sigma_max!r}")
        for name in ("sigma_min", "ode_sigma_min"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (model units), got {value!r}")
        if number and self.sigma_min >= self.sigma_max:
            raise ValueError(f"need sigma_min < sigma_max (model units), got {self.sigma_min}, {self.sigma_max}")
        for name in ("rho", "langevin_step"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.langevin_decay, numbers.Real) and 0 < self.langevin_decay <= 1):
            raise ValueError(f"langevin_decay must be in (0, 1], got {self.langevin_decay!r}")
        if self.langevin_steps < 1:
            raise ValueError(f"langevin_steps must be >= 1, got {self.langevin_steps}")
        if self.inner not in INNER_SOLVERS:
            raise ValueError(f"inner must be one of {INNER_SOLVERS}, got {self.inner!r}")
        if self.prior_covariance not in PRIOR_COVARIANCES:
            raise ValueError(f"prior_covariance must be one of {PRIOR_COVARIANCES}, got {self.prior_covariance!r}")
        if self.spectrum not in SPECTRUM_SOURCES:
            raise ValueError(f"spectrum must be one of {SPECTRUM_SOURCES}, got {self.spectrum!r}")
        if self.final_step not in FINAL_STEPS:
            raise ValueError(f"final_step must be one of {FINAL_STEPS}, got {self.final_step!r}")
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {self.start!r}")
        if self.renoise not in RENOISE:
            raise ValueError(f"renoise must be one of {RENOISE}, got {self.renoise!r}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight > 0):
            raise ValueError(f"prior_weight must be finite and > 0, got {self.prior_weight}")
        if not (math.isfinite(self.noise_floor) and self.noise_floor >= 0):
            raise ValueError(f"noise_floor must be finite and >= 0, got {self.noise_floor}")
        if not 0.0 <= self.inner_temperature <= 1.0:
            raise ValueError(f"inner_temperature must be in [0, 1], got {self.inner_temperature}")
        if self.cg_iterations < 1:
            raise ValueError(f"cg_iterations must be >= 1, got {self.cg_iterations}")
        check_flag("self_ensemble", self.self_ensemble)
        if self.num_levels < 1 or self.ode_steps < 1:
            raise ValueError(f"num_levels and ode_steps must be >= 1, got {self.num_levels}, {self.ode_steps}")
        if isinstance(self.band, dict):
            object.__setattr__(self, "band", BandSchedule(**self.band))
        if isinstance(self.detail, dict):
            object.__setattr__(self, "detail", DetailSchedule(**self.detail))

    @property
    def nfe(self) -> int:
        """Network evaluations per chain as budgeted: levels x predictor steps. A level at or below
        ``ode_sigma_min`` takes one call instead of ``ode_steps`` (possible only when ``sigma_min``
        or the noise floor is that low), so the counted NFE of a run (``RestoreResult.nfe``, what
        the benchmark records) can be lower."""
        return self.num_levels * self.ode_steps

    @property
    def steps(self) -> int:
        """Levels per chain (the callback is called once per level)."""
        return self.num_levels

    def with_nfe(self, budget: int) -> "NFCConfig":
        """This config with NFE = ``budget``: ode_steps = the largest divisor of the budget not above
        the current ode_steps, num_levels = budget / ode_steps (20 -> 4 x 5, 2 -> 1 x 2)."""
        check_budget(budget)
        steps = max(d for d in range(1, min(self.ode_steps, budget) + 1) if budget % d == 0)
        return replace(self, ode_steps=steps, num_levels=budget // steps)

    @property
    def is_deterministic(self) -> bool:
        """No random draw anywhere (a start from y, no re-noising, mean inner steps): K samples are K copies."""
        return self.start != "noise" and self.renoise == "none" and self.inner_temperature == 0

    def as_daps(self) -> "NFCConfig":
        """The same skeleton with NFC's modules off: DAPS."""
        return replace(self, band=replace(self.band, blend_start=0.0), detail=replace(self.detail, levels=0))


def top_sigma(sigma_max: float | str, operator: LinearOperator, sigma_y: float) -> float:
    """The first level in model units: ``sigma_max`` itself, or the "auto" rule for ``operator``
    and the measurement noise ``sigma_y`` (model units)."""
    if sigma_max != "auto":
        return float(sigma_max)
    return max(AUTO_SIGMA_MAX_INPAINT, sigma_y) if operator.family == "inpaint" else AUTO_SIGMA_MAX


def level_sigmas(cfg: NFCConfig, operator: LinearOperator, sigma_y: float, prior_sigma_max: float) -> list[float]:
    """The N + 1 levels sigma_0 > ... > sigma_{N-1} > sigma_N = 0 (model units): EDM's rho-schedule
    from ``top_sigma`` (capped at the prior's sigma_max) down to max(sigma_min, noise_floor sigma_y).
    Where that floor reaches the top (measurement noise above the first level, or a sigma_min above
    the inpainting top of 0.1), all N levels sit at the top: N steps at one noise level."""
    sigma_top = min(top_sigma(cfg.sigma_max, operator, sigma_y), prior_sigma_max)
    sigma_low = min(sigma_top, max(cfg.sigma_min, cfg.noise_floor * sigma_y))
    return karras_sigmas(cfg.num_levels, sigma_low, sigma_top, cfg.rho).tolist()


def band_weight(cfg: BandSchedule, k: int, n: int, measurement_shape: tuple[int, ...], cutoff: Tensor | float,
                device, dtype) -> Tensor | None:
    """W_k = (1 - lambda_k) + lambda_k M_k on the measurement's full FFT grid, (1|B, 1, h, w);
    None when it is all-pass. ``cutoff`` is a float or one per image (B,)."""
    lam = cfg.blend(k, n)
    if lam == 0.0:
        return None
    h, w = measurement_shape[-2:]
    cuts = cutoff.tolist() if isinstance(cutoff, Tensor) else [cutoff]
    mask = torch.stack([lowpass_mask(h, w, float(c), cfg.transition, device=device, dtype=dtype) for c in cuts])[:, None]
    return (1 - lam) + lam * mask


def langevin_refine(operator: LinearOperator, y: Tensor, x0_hat: Tensor, sigma_y: float, prior_var: float | Tensor,
                    band: Tensor | None, steps: int, step_fraction: float, generators: Generators,
                    temperature: float = 1.0) -> Tensor:
    """DAPS's inner loop: Langevin dynamics on -log p(x0 | x0_hat, y), started at x0_hat.

    Step size = step_fraction / L, L the gradient's Lipschitz bound (||A|| <= 1, W <= 1). The noise
    is scaled by ``temperature`` t (target ∝ p^(1/t^2): same mode, t^2 times the covariance).
    """
    spectral = isinstance(prior_var, Tensor)
    inv_var = 1.0 / prior_var  # computed once, not per step
    band2 = None if band is None else band**2
    lipschitz = 1.0 / sigma_y**2 + float(inv_var.max() if spectral else inv_var)
    eta = step_fraction / lipschitz
    x = x0_hat
    for _ in range(steps):
        residual = operator.A(x) - y
        if band2 is not None:
            residual = fourier_filter(residual, band2)  # W^T W r in one FFT pair
        diff = x - x0_hat
        grad = operator.A_adjoint(residual) / sigma_y**2 + (fourier_filter(diff, inv_var) if spectral else diff * inv_var)
        x = x - eta * grad
        if temperature > 0:
            x = x + temperature * (2 * eta) ** 0.5 * randn_per_image(x.shape, generators, x.dtype, x.device)
    return x


def sample_nfc(
    prior: Prior,
    operator: LinearOperator,
    y: Tensor,
    sigma_y: float,
    image_shape: tuple[int, ...],
    config: NFCConfig = NFCConfig(),
    generators: Generators = None,
    callback: Callback = None,
    *,
    timer: PhaseTimer | None = None,
) -> Tensor:
    """Draw one posterior sample per image. y: (B, C, h, w) in [0, 1]; sigma_y in [0, 1] units;
    image_shape: (B, C, H, W) of the unknown image. Returns (B, C, H, W) in [0, 1] units (unclipped).
    timer: optional profiling hook, entered around each building block (:data:`PHASES`).
    """
    phase = timer or _untimed
    prior = counting(prior)
    prob = to_model_units(operator, y, sigma_y, image_shape)
    cfg = config
    sigmas = level_sigmas(cfg, operator, prob.sigma, schedule_top(prior, top_sigma(cfg.sigma_max, operator, prob.sigma)))
    n = cfg.num_levels
    needs_spectrum = (cfg.prior_covariance == "spectral" or (cfg.band.active and cfg.band.cutoff == "spectral")
                      or cfg.start == "wiener")
    spectrum = None
    if needs_spectrum:
        with phase("spectrum"):
            spectrum = _spectrum(cfg.spectrum, prior, operator, prob.y, image_shape, cfg.inner_temperature == 0)
    # the band lives on the measurement grid: an image-grid radius r is r * s there (SR by s; the
    # canvas width over y's would count a padded canvas's border too)
    grid_ratio = float(operator.downsampling_factor or 1)
    # the CG preconditioner's view of the operator, which no level changes
    coverage = None
    if cfg.prior_covariance == "spectral" and (cfg.inner == "exact" or cfg.final_step == "mean"):
        coverage = pixel_coverage(operator, torch.zeros(image_shape, dtype=y.dtype, device=y.device))

    gram = None
    if cfg.renoise == "matched":
        gram = normal_eigenvalues(operator, image_shape, y.dtype, y.device)
    if cfg.start == "noise":
        with phase("renoise"):
            x = sigmas[0] * randn_per_image(image_shape, generators, y.dtype, y.device)
    else:
        x = initial_estimate(operator, prob.y, prob.sigma, image_shape, cfg.start, spectrum)
    denoiser = SelfEnsemblePrior(prior) if cfg.self_ensemble else prior
    for k in range(n):
        sigma, sigma_next = sigmas[k], sigmas[k + 1]
        with phase("predictor"):
            x0_hat = pf_ode_predict(denoiser, x, sigma, cfg.ode_sigma_min, cfg.ode_steps, cfg.rho)
        prior_var: float | Tensor = sigma**2
        if cfg.prior_covariance == "spectral":
            prior_var = spectral_prior_variance(spectrum, sigma)
        if cfg.prior_weight != 1.0:
            prior_var = prior_var / cfg.prior_weight
        if cfg.band.cutoff == "spectral" and cfg.band.active:
            cutoff = cfg.band.spectral_cutoff(spectral_crossing(spectrum, cfg.band.kappa * sigma**2) * grid_ratio, k, n)
        else:
            cutoff = cfg.band.linear_cutoff(k, n)
        with phase("band"):
            band = band_weight(cfg.band, k, n, prob.y.shape, cutoff, y.device, y.dtype)
        last_mean = k == n - 1 and cfg.final_step == "mean"
        if cfg.inner == "exact" or last_mean:
            with phase("inner_exact"):
                x0 = gaussian_conditional(operator, prob.y, x0_hat, prob.sigma, prior_var, generators, band,
                                          sample=not last_mean, cg_iters=cfg.cg_iterations,
                                          temperature=cfg.inner_temperature, coverage=coverage)
        else:
            step = cfg.langevin_step * (1 + (k / n) * (cfg.langevin_decay - 1))
            with phase("inner_langevin"):
                x0 = langevin_refine(operator, prob.y, x0_hat, prob.sigma, prior_var, band, cfg.langevin_steps, step,
                                     generators, cfg.inner_temperature)
        if cfg.detail.active:
            w_low, w_high = cfg.detail.weights(k, n)
            with phase("haar"):
                x0 = haar_fuse(x0, x0_hat, w_low, w_high, cfg.detail.levels)
        if sigma_next > 0 and cfg.renoise == "fresh":
            with phase("renoise"):
                x = x0 + sigma_next * randn_per_image(x0.shape, generators, x0.dtype, x0.device)
        elif sigma_next > 0 and cfg.renoise == "matched":
            with phase("renoise"):
                err2 = conditional_error_variance(gram, prob.sigma, prior_var, cfg.inner_temperature)
                std = (sigma_next**2 - err2).clamp(min=0).sqrt().to(x0.dtype)
                x = x0 + std.view(-1, 1, 1, 1) * randn_per_image(x0.shape, generators, x0.dtype, x0.device)
        else:
            x = x0
        if callback is not None:
            callback({"level": k, "sigma": sigma, "x": x, "x0_hat": x0_hat, "x0": x0, "nfe": prior.nfe})
    return to_image_units(x)


def _untimed(phase: str) -> contextlib.nullcontext:
    """The default ``timer``: times nothing."""
    return contextlib.nullcontext()


def _spectrum(source: str, prior: Prior, operator: LinearOperator, y_m: Tensor, image_shape,
              mean_steps: bool) -> Tensor:
    """(B|1, 1, H, W) power spectrum S for the spectral covariance and cutoff (rule of
    ``NFCConfig.spectrum``; ``mean_steps``: the inner step is a conditional mean)."""
    if source == "auto" and mean_steps and not prior.spectrum_is_exact:
        like = torch.zeros((1, *image_shape[1:]), dtype=y_m.dtype, device=y_m.device)
        gain = pixel_gain(operator, like)
        region = operator.image_region()
        if region is not None:  # the padding to the prior's size multiple is not the image
            gain = gain[..., : region[0], : region[1]]
        # a blur that does not wrap has no closed-form A^+: its A^+ y is an early-stopped solve whose
        # noise the fit would take for image power (on motion blur, a start that amplifies noise)
        if bool((gain > 0).all()) and not is_nonwrapping_blur(operator):
            source = "measurement"
    if source in ("prior", "auto"):
        try:
            spec = prior.spectrum(*image_shape[-2:]).to(y_m)
            return spec.view(1, 1, *spec.shape[-2:]) if spec.ndim == 2 else spec
        except NotImplementedError as e:
            if source == "prior":
                raise ValueError(f"spectrum='prior' needs a prior that declares its power spectrum: {e}") from e
    return fit_spectrum_from_measurement(operator, y_m, image_shape)


def sample_daps(prior: Prior, operator: LinearOperator, y: Tensor, sigma_y: float, image_shape: tuple[int, ...],
                config: NFCConfig = NFCConfig(), generators: Generators = None, callback: Callback = None, *,
                timer: PhaseTimer | None = None) -> Tensor:
    """DAPS (Zhang et al. 2025): :func:`sample_nfc` with the band and the Haar commitment off."""
    return sample_nfc(prior, operator, y, sigma_y, image_shape, config.as_daps(), generators, callback, timer=timer)

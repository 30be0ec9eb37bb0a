"""Noise-frequency continuation (NFC) posterior sampling, and DAPS as NFC with its modules off.

Algorithm (arXiv 2602.00176, on DAPS's skeleton), for levels sigma_0 > ... > sigma_{N-1}, sigma_N = 0:

    x ~ N(0, sigma_0^2 I)
    for k = 0 .. N-1:
        x0_hat = PF-ODE(x, sigma_k -> sigma_ode_min, n Euler steps)            # n NFE
        x0     = inner(x0_hat, r_k, band W_k)                                  # operator calls only
                 target ∝ exp(-||W_k (y - A x0)||^2 / 2 sigma_y^2) N(x0; x0_hat, C_k)
        x0     = HaarFuse(x0, x0_hat, w_L = 1, w_H(k))                         # commit coarse first
        x      = x0 + sigma_{k+1} * noise     (renoise "fresh"; "matched": noise of std
                 sqrt(max(sigma_{k+1}^2 - e_k^2, 0)), e_k^2 the inner step's error)
    return x

W_k = (1 - lambda_k) + lambda_k M_k, M_k a soft low-pass on the measurement grid whose cutoff
widens with k (``BandSchedule``); C_k = sigma_k^2 I (``isotropic``, DAPS) or the Gaussian-prior
posterior covariance S sigma_k^2 / (S + sigma_k^2) per frequency (``spectral``). The inner step
is DAPS's Langevin dynamics or an exact Gaussian-conditional sample (perturb-and-solve); it and
the re-noising are chosen once, before the loop. With ``self_ensemble`` the network's call j
sees its input under the (j mod 8)-th symmetry of the square (``self_ensemble.py``). With
``band.blend_start = 0`` and ``detail.levels = 0`` this is exactly DAPS. NFC's default, the
deterministic continuation, is :mod:`nfc_dps.samplers.nfc_continuation`.
Profiling: the building blocks run inside ``torch.profiler.record_function("nfc.<phase>")``
(:data:`PHASES`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar

import torch
from torch import Tensor
from torch.profiler import record_function

from ..frequency import fourier_filter, haar_fuse, lowpass_mask
from ..generators import Generators, randn_per_image
from ..operators.base import LinearOperator
from ..operators.nonlinear import is_linear
from ..priors.base import Prior
from ..schedules import BAND_TRANSITION, BandSchedule, DetailSchedule, karras_sigmas
from .common import (
    Callback,
    ModelMeasurement,
    StepConfig,
    check_budget,
    check_flag,
    data_gain,
    data_gradient,
    pf_ode_predict,
    schedule_top,
    spectrum_for,
)
from .gaussian_step import (
    conditional_error_variance,
    gaussian_conditional,
    normal_eigenvalues,
    pixel_coverage,
    spectral_crossing,
    spectral_prior_variance,
)
from .self_ensemble import SelfEnsemblePrior

INNER_SOLVERS = ("langevin", "exact")
PRIOR_COVARIANCES = ("isotropic", "spectral")
SPECTRUM_SOURCES = ("auto", "measurement", "prior")
FINAL_STEPS = ("sample", "mean")
RENOISE = ("fresh", "matched")
#: EDM's grid exponent for the levels and the predictor's steps
RHO = 7.0
#: where the predictor's ODE stops by default, model units (DAPS: 0.01)
ODE_SIGMA_MIN = 0.01
#: Langevin step size at the first level, as a fraction of 1 / Lipschitz; it decays linearly to
#: LANGEVIN_STEP * LANGEVIN_DECAY at the last level (DAPS's)
LANGEVIN_STEP, LANGEVIN_DECAY = 0.5, 0.01
#: cap on the conjugate-gradient iterations of the exact inner step where it has no closed form
#: (spectral covariance with an operator that has no Fourier decomposition: inpainting, SR, a
#: reflect-boundary blur, colorization)
CG_ITERATIONS = 20
#: the ``torch.profiler.record_function`` ranges of NFC's building blocks ("nfc.<phase>")
PHASES = ("spectrum", "predictor", "inner_exact", "inner_langevin", "band", "haar", "renoise")
#: an inner step: (x0_hat, prior variance r_k^2 (float or per frequency), band W_k or None, k) -> x0
InnerStep = Callable[[Tensor, "float | Tensor", "Tensor | None", int], Tensor]


@dataclass(frozen=True)
class NFCConfig(StepConfig):
    """NFC / DAPS posterior-sampler settings; every field is a YAML key (sigmas in [-1, 1] model units).

    num_levels: N annealing levels. ode_steps: n Euler steps of the predictor (NFE = N * n).
    sigma_max / sigma_min: annealing range (sigma_max capped at the prior's range).
    ode_sigma_min: where the predictor's ODE stops (DAPS: 0.01).
    inner: "langevin" (DAPS's, ``langevin_steps`` steps) or "exact" (a Gaussian-conditional draw).
    prior_covariance: "isotropic" (DAPS: sigma_k^2 I) or "spectral".
    spectrum: where S (for the spectral covariance and the spectral cutoff) comes from:
    "measurement" (a power law fitted to A^+ y), "prior" (``prior.spectrum(h, w)``) or "auto"
    (:func:`spectrum_for`; docs/notes/presets.md, "Spectrum", compares the sources).
    final_step: at the last level, "sample" returns a draw from p(x0 | x, y) (DAPS), "mean" its
    mean E[x0 | x, y] (no sigma_min-sized noise in the output).
    inner_temperature: t scales the inner step's noise (same mean, t^2 times the covariance):
    1 = the paper's posterior sampler; 0 = the conditional mean at every level. Below 1 the
    ``std`` maps understate the posterior spread.
    renoise: between levels, "fresh" (x_{k+1} = x0 + sigma_{k+1} eps, the paper) or "matched":
    only the noise the inner step's output lacks, std sqrt(max(sigma_{k+1}^2 - e_k^2, 0)) with
    e_k^2 its expected squared error per pixel under its own Gaussian model (the band weight and
    the Haar fuse are not in that model); needs the operator's ``approximate_gram_eigenvalues``.
    self_ensemble: network call j sees its input under the (j mod 8)-th flip/quarter turn and its
    output is turned back (``SelfEnsemblePrior``, DPIR's periodical geometric self-ensemble).
    band / detail: NFC's two modules (see ``BandSchedule`` and ``DetailSchedule``).
    """

    num_levels: int = 200
    ode_steps: int = 5
    sigma_max: float = 100.0
    sigma_min: float = 0.1
    ode_sigma_min: float = ODE_SIGMA_MIN
    inner: str = "langevin"
    langevin_steps: int = 200
    prior_covariance: str = "isotropic"
    spectrum: str = "auto"
    final_step: str = "mean"
    inner_temperature: float = 1.0
    renoise: str = "fresh"
    self_ensemble: bool = False
    band: BandSchedule = field(default_factory=BandSchedule)
    detail: DetailSchedule = field(default_factory=DetailSchedule)

    def __post_init__(self) -> None:
        for name, low in (("sigma_max", "> 0"), ("sigma_min", ">= 0"), ("ode_sigma_min", ">= 0")):
            value = getattr(self, name)
            number = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            if not (number and (value > 0 if low == "> 0" else value >= 0)):
                raise ValueError(f"{name} must be a finite number {low} (model units), got {value!r}")
        if self.sigma_min >= self.sigma_max:
            raise ValueError(f"need sigma_min < sigma_max (model units), got {self.sigma_min}, {self.sigma_max}")
        for name, allowed in (("inner", INNER_SOLVERS), ("prior_covariance", PRIOR_COVARIANCES),
                              ("spectrum", SPECTRUM_SOURCES), ("final_step", FINAL_STEPS), ("renoise", RENOISE)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.langevin_steps < 1:
            raise ValueError(f"langevin_steps must be >= 1, got {self.langevin_steps}")
        if not 0.0 <= self.inner_temperature <= 1.0:
            raise ValueError(f"inner_temperature must be in [0, 1], got {self.inner_temperature}")
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
        is that low), so the counted NFE of a run (``RestoreResult.nfe``) can be lower."""
        return self.num_levels * self.ode_steps

    steps_field: ClassVar[str] = "num_levels"  # the callback is called once per level

    def with_nfe(self, budget: int) -> "NFCConfig":
        """This config with NFE = ``budget``: ode_steps = the largest divisor of the budget not above
        the current ode_steps, num_levels = budget / ode_steps (20 -> 4 x 5, 2 -> 1 x 2)."""
        check_budget(budget)
        steps = max(d for d in range(1, min(self.ode_steps, budget) + 1) if budget % d == 0)
        return replace(self, ode_steps=steps, num_levels=budget // steps)

    def noise_levels(self, prior: Prior, measurement: ModelMeasurement) -> list[float]:
        return level_sigmas(self, schedule_top(prior, self.sigma_max))

    def as_daps(self) -> "NFCConfig":
        """The same skeleton with NFC's modules off: DAPS."""
        return replace(self, band=replace(self.band, blend_start=0.0), detail=replace(self.detail, levels=0))


def level_sigmas(cfg: NFCConfig, top: float) -> list[float]:
    """The N + 1 levels sigma_0 > ... > sigma_{N-1} > sigma_N = 0 (model units): EDM's rho-schedule
    from ``top`` (sigma_max capped at the prior's range) down to sigma_min (``top`` where it is lower)."""
    return karras_sigmas(cfg.num_levels, min(top, cfg.sigma_min), top, RHO).tolist()


def sample_nfc(prior: Prior, measurement: ModelMeasurement, config: NFCConfig = NFCConfig(),
               generators: Generators = None, callback: Callback = None) -> Tensor:
    """Draw one posterior sample per image of the measurement (Gaussian noise). Returns (B, C, H, W)
    in model units."""
    if not isinstance(config, NFCConfig):
        raise TypeError(f"sample_nfc takes an NFCConfig, got {type(config).__name__} (the deterministic preset's "
                        f"ContinuationConfig runs with sample_nfc_continuation, or as method 'nfc')")
    operator, y, image_shape = measurement.operator, measurement.y, measurement.image_shape
    cfg, n = config, config.num_levels
    if not is_linear(operator):
        why = nonlinear_problem(cfg)
        if why:
            raise ValueError(f"{why}; with the nonlinear {operator.name} use NFC's default (deterministic) preset, or DAPS")
    sigmas = cfg.noise_levels(prior, measurement)
    spectrum = None
    if cfg.prior_covariance == "spectral" or (cfg.band.active and cfg.band.cutoff == "spectral"):
        with record_function("nfc.spectrum"):
            spectrum = spectrum_for(cfg.spectrum, prior, operator, y, image_shape, cfg.inner_temperature == 0)
    if cfg.prior_covariance == "isotropic":
        def prior_variance(sigma: float) -> float | Tensor:
            return sigma**2
    else:
        def prior_variance(sigma: float) -> float | Tensor:
            return spectral_prior_variance(spectrum, sigma)
    step, last_step = inner_steps(cfg, operator, measurement, generators)
    band_at = band_schedule(cfg, operator, measurement, spectrum)
    commit = detail_commitment(cfg)
    renoise = renoise_step(cfg, operator, measurement, generators)
    with record_function("nfc.renoise"):
        x = sigmas[0] * randn_per_image(image_shape, generators, y.dtype, y.device)
    denoiser = SelfEnsemblePrior(prior) if cfg.self_ensemble else prior
    for k in range(n):
        sigma = sigmas[k]
        with record_function("nfc.predictor"):
            x0_hat = pf_ode_predict(denoiser, x, sigma, cfg.ode_sigma_min, cfg.ode_steps, RHO)
        prior_var = prior_variance(sigma)
        with record_function("nfc.band"):
            band = band_at(k, sigma)
        x0 = commit((last_step if k == n - 1 else step)(x0_hat, prior_var, band, k), x0_hat, k)
        x = x0
        if k < n - 1:
            with record_function("nfc.renoise"):
                x = renoise(x0, sigmas[k + 1], prior_var)
        if callback is not None:
            callback({"i": k, "sigma": sigma, "x": x, "denoised": x0_hat, "x0": x0})
    return x


def nonlinear_problem(cfg: NFCConfig) -> str | None:
    """Why this posterior config cannot run on a nonlinear operator (None: it can, by likelihood
    gradients: Langevin inner steps, isotropic prior covariance, no band)."""
    if cfg.prior_covariance == "spectral":
        return "the spectral prior covariance is fitted to a linear operator's pseudo-inverse"
    if cfg.band.active:
        return "the band acts on a linear operator's measurement grid"
    if cfg.inner == "exact" or cfg.final_step == "mean":
        return "the exact Gaussian-conditional inner step needs a linear operator"
    return None


def inner_steps(cfg: NFCConfig, operator: LinearOperator, prob: ModelMeasurement,
                generators: Generators) -> tuple[InnerStep, InnerStep]:
    """(the inner step of levels 0 .. N-2, the last level's): the configured ``inner`` for both,
    except that the last one is the conditional mean with ``final_step="mean"``."""
    coverage = None  # the CG preconditioner's view of the operator, which no level changes
    if cfg.prior_covariance == "spectral" and (cfg.inner == "exact" or cfg.final_step == "mean"):
        like = torch.zeros(prob.image_shape, dtype=prob.y.dtype, device=prob.y.device)
        coverage = pixel_coverage(operator, like)

    def exact(sample: bool) -> InnerStep:
        def step(x0_hat: Tensor, prior_var: float | Tensor, band: Tensor | None, k: int) -> Tensor:
            with record_function("nfc.inner_exact"):
                return gaussian_conditional(operator, prob.y, x0_hat, prob.sigma, prior_var, generators, band,
                                            sample=sample, cg_iters=CG_ITERATIONS,
                                            temperature=cfg.inner_temperature, coverage=coverage)
        return step

    gains: list[float] = []  # ||A||^2's bound, found at the first level's estimate

    def langevin(x0_hat: Tensor, prior_var: float | Tensor, band: Tensor | None, k: int) -> Tensor:
        step_fraction = LANGEVIN_STEP * (1 + (k / cfg.num_levels) * (LANGEVIN_DECAY - 1))
        if not gains:
            gains.append(data_gain(operator, x0_hat))
        with record_function("nfc.inner_langevin"):
            return langevin_refine(operator, prob.y, x0_hat, prob.sigma, prior_var, band, cfg.langevin_steps,
                                   step_fraction, generators, cfg.inner_temperature, gains[0])

    step = exact(True) if cfg.inner == "exact" else langevin
    return step, exact(False) if cfg.final_step == "mean" else step


def band_schedule(cfg: NFCConfig, operator: LinearOperator, prob: ModelMeasurement,
                  spectrum: Tensor | None) -> Callable[[int, float], Tensor | None]:
    """(k, sigma_k) -> the band weight W_k (None: all-pass) of ``cfg.band``."""
    band, n = cfg.band, cfg.num_levels
    if not band.active:
        return lambda k, sigma: None
    # the band lives on the measurement grid: an image-grid radius r is r * s there (SR by s; the
    # canvas width over y's would count a padded canvas's border too)
    grid_ratio = float(operator.downsampling_factor or 1)

    if band.cutoff == "spectral":
        def cutoff(k: int, sigma: float) -> Tensor | float:
            return band.spectral_cutoff(spectral_crossing(spectrum, sigma**2) * grid_ratio, k, n)
    else:
        def cutoff(k: int, sigma: float) -> Tensor | float:
            return band.linear_cutoff(k, n)

    def weight(k: int, sigma: float) -> Tensor | None:
        return band_weight(band, k, n, prob.y.shape, cutoff(k, sigma), prob.y.device, prob.y.dtype)

    return weight


def detail_commitment(cfg: NFCConfig) -> Callable[[Tensor, Tensor, int], Tensor]:
    """(x0, x0_hat, k) -> x0 fused with x0_hat in the Haar domain (``cfg.detail``; x0 itself when off)."""
    detail, n = cfg.detail, cfg.num_levels
    if not detail.active:
        return lambda x0, x0_hat, k: x0

    def fuse(x0: Tensor, x0_hat: Tensor, k: int) -> Tensor:
        with record_function("nfc.haar"):
            return haar_fuse(x0, x0_hat, *detail.weights(k, n), detail.levels)

    return fuse


def renoise_step(cfg: NFCConfig, operator: LinearOperator, prob: ModelMeasurement,
                 generators: Generators) -> Callable[[Tensor, float, "float | Tensor"], Tensor]:
    """(x0, sigma_{k+1}, the level's prior variance) -> the next level's x (``cfg.renoise``)."""
    def noise(x0: Tensor) -> Tensor:
        return randn_per_image(x0.shape, generators, x0.dtype, x0.device)

    if cfg.renoise == "fresh":
        return lambda x0, sigma_next, prior_var: x0 + sigma_next * noise(x0)
    missing_std = matched_noise_std(operator, prob, cfg.inner_temperature)

    def matched(x0: Tensor, sigma_next: float, prior_var: float | Tensor) -> Tensor:
        return x0 + missing_std(prior_var, sigma_next).to(x0.dtype).view(-1, 1, 1, 1) * noise(x0)

    return matched


def matched_noise_std(operator: LinearOperator, prob: ModelMeasurement,
                      temperature: float) -> Callable[["float | Tensor", float], Tensor]:
    """(prior variance, sigma_{k+1}) -> per-image std (B|1,) sqrt(max(sigma_{k+1}^2 - e_k^2, 0)) of
    the noise the inner step's output lacks, e_k^2 its expected squared error per pixel
    (``gaussian_step.conditional_error_variance`` over the eigenvalues of A^T A)."""
    gram = normal_eigenvalues(operator, prob.image_shape, prob.y.dtype, prob.y.device)

    def std(prior_var: float | Tensor, sigma_next: float) -> Tensor:
        err2 = conditional_error_variance(gram, prob.sigma, prior_var, temperature)
        return (sigma_next**2 - err2).clamp(min=0).sqrt()

    return std


def band_weight(cfg: BandSchedule, k: int, n: int, measurement_shape: tuple[int, ...], cutoff: Tensor | float,
                device, dtype) -> Tensor | None:
    """W_k = (1 - lambda_k) + lambda_k M_k on the measurement's full FFT grid, (1|B, 1, h, w);
    None when it is all-pass. ``cutoff`` is a float or one per image (B,)."""
    lam = cfg.blend(k, n)
    if lam == 0.0:
        return None
    h, w = measurement_shape[-2:]
    cuts = cutoff.tolist() if isinstance(cutoff, Tensor) else [cutoff]
    mask = torch.stack([lowpass_mask(h, w, float(c), BAND_TRANSITION, device=device, dtype=dtype) for c in cuts])[:, None]
    return (1 - lam) + lam * mask


def langevin_refine(operator: LinearOperator, y: Tensor, x0_hat: Tensor, sigma_y: float, prior_var: float | Tensor,
                    band: Tensor | None, steps: int, step_fraction: float, generators: Generators,
                    temperature: float = 1.0, gain: float | Tensor = 1.0) -> Tensor:
    """DAPS's inner loop: Langevin dynamics on -log p(x0 | x0_hat, y), started at x0_hat.

    Step size = step_fraction / L, L the gradient's Lipschitz bound (||A||^2 <= ``gain``, W <= 1). The noise
    is scaled by ``temperature`` t (target ∝ p^(1/t^2): same mode, t^2 times the covariance).
    """
    spectral = isinstance(prior_var, Tensor)
    inv_var = 1.0 / prior_var  # computed once, not per step
    band2 = None if band is None else band**2
    lipschitz = gain / sigma_y**2 + float(inv_var.max() if spectral else inv_var)
    if isinstance(lipschitz, Tensor):  # a bound per image: (B, 1, 1, 1)
        lipschitz = lipschitz.view(-1, *([1] * (x0_hat.ndim - 1)))
    eta = step_fraction / lipschitz
    x = x0_hat
    for _ in range(steps):
        diff = x - x0_hat
        if band2 is None:
            data = data_gradient(operator, x, y)
        else:
            data = operator.A_adjoint(fourier_filter(operator.A(x) - y, band2))  # W^T W r in one FFT pair
        grad = data / sigma_y**2 + (fourier_filter(diff, inv_var) if spectral else diff * inv_var)
        x = x - eta * grad
        if temperature > 0:
            x = x + temperature * (2 * eta) ** 0.5 * randn_per_image(x.shape, generators, x.dtype, x.device)
    return x


def sample_daps(prior: Prior, measurement: ModelMeasurement, config: NFCConfig = NFCConfig(), generators: Generators = None,
                callback: Callback = None) -> Tensor:
    """DAPS (Zhang et al. 2025): :func:`sample_nfc` with the band and the Haar commitment off."""
    if not isinstance(config, NFCConfig):
        raise TypeError(f"sample_daps takes an NFCConfig, got {type(config).__name__}")
    return sample_nfc(prior, measurement, config.as_daps(), generators, callback)

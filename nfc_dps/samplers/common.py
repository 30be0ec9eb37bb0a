"""Pieces every sampler shares: unit conversion, NFE counting, the initial estimates, the PF-ODE
predictor and the DDIM re-noising step. (NFC's Gaussian-conditional inner step is in
:mod:`nfc_dps.samplers.gaussian_step`; the DDPM noise grid in :mod:`nfc_dps.schedules`.)

Units. The public API takes images and measurements in [0, 1] and sigma_y in [0, 1] pixel units.
Priors work on [-1, 1]: x_m = 2 x - 1. For a linear operator A this maps the measurement to
y_m = 2 y - A(1) (A(1) is 1 for blur and SR, the mask for inpainting) and its noise to
sigma_m = 2 sigma_y. :func:`to_model_units` and :func:`to_image_units` are the only places
where this happens; the chain driver calls both, so a sampler sees a :class:`ModelMeasurement`
and returns model units.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor

from ..generators import Generators, randn_per_image
from ..operators.base import LinearOperator, pixel_gain
from ..operators.nonlinear import ModelUnitsOperator, is_linear
from ..priors.base import Prior, PriorWrapper
from ..schedules import AUTO_SIGMA_MAX_INPAINT, DDPM_SIGMA_MAX, DPIR_SIGMA_MAX, SCHEDULES, karras_sigmas, sigma_grid
from .gaussian_step import blur_wiener_estimate, fit_spectrum_from_measurement, gaussian_conditional, is_nonwrapping_blur, pixel_coverage

Callback = Callable[[dict[str, Any]], None] | None

#: floor on the likelihood's noise std (model units) so noiseless measurements stay well posed
MIN_LIKELIHOOD_SIGMA = 1e-3


class StepConfig:
    """What every sampler config tells its callers: its NFE, its number of steps (callback calls,
    the progress bar's length), whether it draws anything at random, and itself at another NFE
    budget. This base serves the configs with one network call per step, their step count the
    field ``steps_field`` names (the one ``--steps`` sets); NFC's posterior config overrides the NFE."""

    #: the field holding the number of steps (annealing levels or sampler steps)
    steps_field: ClassVar[str] = "num_steps"

    @property
    def nfe(self) -> int:
        """Network evaluations per chain."""
        return self.steps

    @property
    def steps(self) -> int:
        """Sampler steps per chain (the callback is called once per step)."""
        return getattr(self, self.steps_field)

    @property
    def is_deterministic(self) -> bool:
        """True when the sampler draws no random number: K samples would be K copies."""
        return False

    def with_nfe(self, budget: int):
        """This config with NFE = ``budget`` (>= 1) steps."""
        return replace(self, **{self.steps_field: check_budget(budget)})

    def noise_levels(self, prior: Prior, measurement: "ModelMeasurement") -> list[float]:
        """The noise levels (model units) the sampler steps through for ``prior`` (its top resolved by
        :func:`schedule_top`, which refuses a denoiser-only prior it would leave) and ``measurement``."""
        raise NotImplementedError


class DDPMStepConfig(StepConfig):
    """A config whose steps are timesteps of the DDPM grid (:func:`~nfc_dps.schedules.sigma_grid`):
    its fields ``num_steps``, ``sigma_max`` and ``schedule`` say which."""

    def ddpm_grid(self, prior: Prior) -> tuple[list[float], list[float]]:
        """(sigmas, timesteps) of :func:`~nfc_dps.schedules.sigma_grid` from the top ``prior`` allows."""
        return sigma_grid(self.num_steps, schedule_top(prior, min(self.sigma_max, DDPM_SIGMA_MAX)), self.schedule)

    def noise_levels(self, prior: Prior, measurement: "ModelMeasurement") -> list[float]:
        return self.ddpm_grid(prior)[0]


def check_budget(budget: int) -> int:
    """``budget`` if it is an int >= 1 (an NFE budget), else a ValueError naming it."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"an NFE budget must be an int >= 1, got {budget!r}")
    return budget


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is a bool, else a ValueError naming the config field ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


class CountingPrior(PriorWrapper):
    """Wraps a prior and counts its network evaluations (one batched call = 1 NFE per image).
    ``nonfinite``: None, or a 0-d bool tensor, True once the prior returned NaN/Inf for a finite
    input (kept on its device, never read during sampling: the chain driver names the prior when
    a run ends non-finite)."""

    def __init__(self, inner: Prior) -> None:
        super().__init__(inner)
        self.nfe = 0
        self.nonfinite: Tensor | None = None

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        self.nfe += 1
        out = self.inner.denoise(x, sigma)
        with torch.no_grad():
            bad = torch.isfinite(x).all() & ~torch.isfinite(out).all()
            self.nonfinite = bad if self.nonfinite is None else self.nonfinite | bad
        return out


def counting(prior: Prior) -> CountingPrior:
    return prior if isinstance(prior, CountingPrior) else CountingPrior(prior)


@dataclass(frozen=True)
class ModelMeasurement:
    """What a sampler restores, in the prior's [-1, 1] units: y = A(x) + n, n ~ N(0, sigma^2 I).

    operator: A on [-1, 1] images (a linear operator as it is, a nonlinear one wrapped by
    :func:`model_operator`); y: (B, C, h, w); sigma: the likelihood's noise std in model units
    (the stated one, at least ``MIN_LIKELIHOOD_SIGMA``); image_shape: (B, C, H, W) of the unknown
    images; noise: the stated noise std in model units (0 for a noiseless measurement, which the
    null-space projections of DDNM and DDRM treat exactly).
    """

    operator: LinearOperator
    y: Tensor
    sigma: float
    image_shape: tuple[int, ...]
    noise: float = 0.0


def to_model_units(operator: LinearOperator, y: Tensor, sigma_y: float, image_shape: Sequence[int]) -> ModelMeasurement:
    """A [0, 1] measurement with Gaussian noise std sigma_y -> the same in [-1, 1] model units (see the
    module docstring); a nonlinear operator is wrapped (:func:`model_operator`) and y_m = 2 y - 1."""
    operator, noise = model_operator(operator), 2.0 * float(sigma_y)
    sigma = max(noise, MIN_LIKELIHOOD_SIGMA)
    if not is_linear(operator):
        return ModelMeasurement(operator, 2 * y - 1, sigma, tuple(image_shape), noise)
    ones = torch.ones((1, *image_shape[1:]), dtype=y.dtype, device=y.device)
    return ModelMeasurement(operator, 2 * y - operator.A(ones), sigma, tuple(image_shape), noise)


def model_operator(operator: LinearOperator) -> LinearOperator:
    """The operator samplers apply to [-1, 1] images: a linear one itself (its model-unit
    measurement is 2 y - A(1)); a nonlinear one wrapped (once), A_m(x_m) = 2 A((x_m + 1) / 2) - 1."""
    return operator if is_linear(operator) or isinstance(operator, ModelUnitsOperator) else ModelUnitsOperator(operator)


def adjoint_at(operator: LinearOperator, x: Tensor, u: Tensor) -> Tensor:
    """J(x)^T u: A^T u for a linear operator, the vector-Jacobian product at x for a nonlinear one."""
    return operator.A_adjoint(u) if is_linear(operator) else operator.vjp(x, u)


def data_gain(operator: LinearOperator, x: Tensor, iterations: int = 10) -> float | Tensor:
    """A bound on ||A||^2 for gradient step sizes at the images x (B, C, H, W): a linear operator's
    ``norm_bound()``; for a nonlinear one, per image, 1.2 times ``iterations`` power iterations'
    estimate of ||J(x)||^2 (from one seeded start shared by every image), at least 1: (B,)."""
    if is_linear(operator):
        return operator.norm_bound()
    v = torch.randn((1, *x.shape[1:]), generator=torch.Generator(device=x.device).manual_seed(0), dtype=x.dtype,
                    device=x.device).expand_as(x)
    norm = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
    for _ in range(iterations):
        v = v / v.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (x.ndim - 1)))
        v = operator.vjp(x, operator.jvp(x, v))
        norm = v.flatten(1).norm(dim=1)
    return (1.2 * norm).clamp_min(1.0)


def data_gradient(operator: LinearOperator, x: Tensor, y: Tensor) -> Tensor:
    """J(x)^T (A(x) - y), the gradient of ||y - A(x)||^2 / 2 (A^T (A x - y) for a linear operator)."""
    if is_linear(operator):
        return operator.A_adjoint(operator.A(x) - y)
    return operator.data_gradient(x, y)


def to_image_units(x_m: Tensor) -> Tensor:
    """[-1, 1] model units -> [0, 1] image units (no clipping: callers clamp for saving/metrics)."""
    return (x_m + 1) / 2


#: initial estimates from the measurement (:func:`initial_estimate`)
START_ESTIMATES = ("pinv", "adjoint", "tikhonov", "wiener")
#: conjugate-gradient iterations of the "wiener" start (one solve per run)
START_CG_ITERATIONS = 100


def initial_estimate(operator: LinearOperator, y: Tensor, sigma_y: float, image_shape: Sequence[int],
                     kind: str, spectrum: Tensor | None = None) -> Tensor:
    """An image-shaped first estimate from a measurement, all in the same units (model units here).

    * ``pinv``: the operator's pseudo-inverse A^+ y (exact on the measured part, unregularised:
      on a blur it amplifies the noise where |H| is small; inpainting: 0 in the holes).
    * ``adjoint``: A^T y / g with g = A^T A 1 the pixel gain (the blurred image itself for a
      normalised blur, a box upsampling for SR, the observed pixels for inpainting), and the mean
      of the well-observed pixels (g > 0.05 max g) elsewhere.
    * ``tikhonov``: argmin ||y - A x||^2 / (2 sigma_y^2) + ||x - m||^2 / 2, m the ``adjoint``
      estimate's mean per image and channel: a unit-variance prior around the image's mean level.
    * ``wiener``: the linear MMSE estimate E[x | y] under x ~ N(m, C), C = F* diag(S) F with
      ``spectrum`` S (B|1, 1, H, W) (a power law: the prior's or the measurement's): a Wiener
      filter for circulant blur, a smooth interpolation of the holes for inpainting; conjugate
      gradients (``START_CG_ITERATIONS``) where there is no closed form. For a blur that does not
      wrap (reflect or valid boundary) C is stationary on the image's symmetric extension instead,
      so that it does not join opposite borders either (``gaussian_step.blur_wiener_estimate``).
      Where the operator mixes the image's channels (it declares ``image_channels``: colorization), the ``adjoint`` estimate:
      S has no correlation between channels, so its estimate would spread y's residual along the
      mixing weights (a colour cast), while the adjoint one (the gray image) fits y without one.
    Shapes: y (B, C, h, w) -> (B, C, H, W) with H, W from ``image_shape``.
    """
    if not is_linear(operator):  # a model-units nonlinear operator: its own start from y
        return operator.start(y)
    if kind == "pinv":
        return operator.A_pinv(y)
    if kind not in START_ESTIMATES:
        raise ValueError(f"initial estimate must be one of {START_ESTIMATES}, got {kind!r}")
    like = torch.zeros((y.shape[0], *image_shape[1:]), dtype=y.dtype, device=y.device)
    gain = pixel_gain(operator, like)
    back = operator.A_adjoint(y)
    observed = gain > 0.05 * gain.flatten(1).amax(1).view(-1, 1, 1, 1)  # relative: SR x s has gain 1/s^2
    count = observed.sum(dim=(-2, -1), keepdim=True).clamp_min(1)
    normalised = torch.where(observed, back / torch.where(observed, gain, torch.ones_like(gain)), torch.zeros_like(back))
    mean = normalised.sum(dim=(-2, -1), keepdim=True) / count
    if kind == "adjoint" or (kind == "wiener" and _mixes_channels(operator)):
        return torch.where(observed, normalised, mean.expand_as(normalised))
    level = mean.expand_as(normalised).contiguous()
    if kind == "tikhonov":
        return operator.prox(y, level, sigma_y, 1.0)
    if spectrum is None:
        raise ValueError("the 'wiener' initial estimate needs a power spectrum S")
    # an infinite DC (the mean left free) would make the wide-hole preconditioner NaN; the
    # largest finite power leaves the mean to the data just as well
    finite = torch.where(torch.isinf(spectrum), torch.zeros_like(spectrum), spectrum)
    spectrum = torch.where(torch.isinf(spectrum), finite.flatten(1).amax(1).view(-1, 1, 1, 1) * 1e3, spectrum)
    if is_nonwrapping_blur(operator):  # a blur that does not wrap: nor may the prior
        return blur_wiener_estimate(operator, y, level, sigma_y, spectrum, START_CG_ITERATIONS)
    return gaussian_conditional(operator, y, level, sigma_y, spectrum, None, sample=False,
                                cg_iters=START_CG_ITERATIONS, coverage=pixel_coverage(operator, like))


def _mixes_channels(operator: LinearOperator) -> bool:
    """Whether A mixes the image's channels: it declares the channels it takes (colorization: 3),
    where an operator that acts on each channel alike declares None."""
    return getattr(operator, "image_channels", None) is not None


def spectrum_for(source: str, prior: Prior, operator: LinearOperator, y_m: Tensor, image_shape,
                 mean_steps: bool) -> Tensor:
    """(B|1, 1, H, W) power spectrum S for the spectral covariance, the spectral cutoff and the
    Wiener start, from ``source`` (``NFCConfig.spectrum``): "measurement" (a power law fitted to
    A^+ y), "prior" (``prior.spectrum(h, w)``) or "auto": the prior's exact spectrum when it has
    one (the Gaussian oracle); else the measurement's when the inner step is a conditional mean
    (``mean_steps``) and the operator observes every pixel (blur, SR, denoising), except a blur
    that does not wrap (its A^+ y is an early-stopped solve); else the prior's declared law, or
    the measurement's when it declares none. The fit is to the unregularised A^+ y, so on a blur
    it also sees amplified noise: a larger, flatter S, i.e. less trust in x0_hat."""
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


def sigma_vector(sigma: float, x: Tensor) -> Tensor:
    return torch.full((x.shape[0],), float(sigma), dtype=x.dtype, device=x.device)


def pf_ode_predict(prior: Prior, x: Tensor, sigma_from: float, sigma_to: float, steps: int, rho: float = 7.0) -> Tensor:
    """x0_hat from x at noise sigma_from: ``steps`` Euler steps of the probability-flow ODE
    dx/dsigma = (x - D(x, sigma)) / sigma on an EDM poly-rho grid down to ``sigma_to``
    (DAPS's predictor). ``steps`` network evaluations; one step from sigma >> sigma_to is Tweedie.
    """

    if sigma_from <= sigma_to:
        return prior.denoise(x, sigma_vector(sigma_from, x))
    grid = karras_sigmas(steps + 1, sigma_to, sigma_from, rho, append_zero=False).tolist()
    for s, s_next in zip(grid[:-1], grid[1:]):
        d = (x - prior.denoise(x, sigma_vector(s, x))) / s
        x = x + (s_next - s) * d
    return x


def ddim_step(x0: Tensor, eps: Tensor, sigma_next: float, noise_fraction: float, generators: Generators) -> Tensor:
    """x_next = x0 + sigma_next (sqrt(1 - f) eps + sqrt(f) noise), VE units; f = noise_fraction in [0, 1].

    f = zeta is DiffPIR's step, f = eta^2 DDIM/DDRM/DDNM's (their noise weight eta, direction weight
    sqrt(1 - eta^2)). Deterministic (no draw) when sigma_next = 0 or f = 0.
    """
    if sigma_next == 0:
        return x0
    out = x0 + sigma_next * (1 - noise_fraction) ** 0.5 * eps
    if noise_fraction > 0:
        out = out + sigma_next * noise_fraction**0.5 * randn_per_image(x0.shape, generators, x0.dtype, x0.device)
    return out


class PriorRangeError(ValueError):
    """A sampler's schedule would call a denoiser-only prior above its noise range: no image of
    the run can be restored with this method and prior."""


class PriorRangeWarning(UserWarning):
    """A denoiser-only prior is called at the top of its range for a noisier measurement: the
    restoration keeps some of the noise."""


def warn_above_range(prior: Prior, level: float) -> None:
    """A :class:`PriorRangeWarning` naming both levels when ``level`` (model units: the noise a
    denoiser-only ``prior`` is asked to remove) lies above the prior's top, where it is called instead."""
    limit = float(prior.sigma_max)
    if getattr(prior, "denoiser_only", False) and level > limit * (1 + 1e-6):
        warnings.warn(f"the measurement's noise level {level / 2:.4g} ([0, 1] units) lies above this denoiser-only "
                      f"prior's range (top {limit / 2:.4g}): it is denoised at {limit / 2:.4g}, so the restoration "
                      f"keeps some of the noise; use a prior trained for noise up to {level / 2:.4g}, or a diffusion "
                      f"prior", PriorRangeWarning, stacklevel=3)


def schedule_top(prior: Prior, top: float) -> float:
    """The first noise level (model units) a sampler calls ``prior`` at, when its config asks
    for ``top``: ``top`` capped at a diffusion prior's ``sigma_max`` (where the image is already
    drowned); for a denoiser-only prior (``prior.denoiser_only``) ``top`` itself, and a
    ValueError naming the prior's range and the methods that fit when ``top`` lies above it.
    Every sampler resolves its schedule's top here, before any work."""
    limit = float(prior.sigma_max)
    if not prior.denoiser_only or top <= limit * (1 + 1e-6):
        return min(float(top), limit)

    low = float(prior.sigma_min)
    lower = (f"; this prior stops below DPIR's first level, so pass sigma_max={limit:.4g} to either"
             if limit < DPIR_SIGMA_MAX else "")
    raise PriorRangeError(
        f"this sampler's schedule would call the prior at sigma {top:.4g} (model units, [-1, 1] data; "
        f"{top / 2:.4g} in [0, 1] units), but the prior is a denoiser only, for sigma in [{low:.4g}, {limit:.4g}] "
        f"model units ([{low / 2:.4g}, {limit / 2:.4g}] in [0, 1] units), with no diffusion noise levels. "
        f"Methods that stay in a denoiser's range: 'nfc' with its default preset 'deterministic' (first level "
        f"{DPIR_SIGMA_MAX:.3g}, {AUTO_SIGMA_MAX_INPAINT:g} for inpainting, HDR and exposure) and 'dpir' (first level "
        f"{DPIR_SIGMA_MAX:.3g}){lower}; daps, dps, diffpir, ddnm, ddrm and nfc's fast, fast_psnr and paper presets "
        f"start from noise and need a diffusion prior (docs/bring_your_own.md)")


def check_step_settings(num_steps: int, eta: float, sigma_max: float, schedule: str) -> None:
    """Raise ValueError unless num_steps >= 1 (int), 0 <= eta <= 1, sigma_max > 0 (model units) and
    ``schedule`` is one of :data:`~nfc_dps.schedules.SCHEDULES` (DDNM's and DDRM's shared fields)."""

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    if not 0 <= eta <= 1:
        raise ValueError(f"eta must be in [0, 1], got {eta!r}")
    if not sigma_max > 0:
        raise ValueError(f"sigma_max must be > 0 (model units), got {sigma_max!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")

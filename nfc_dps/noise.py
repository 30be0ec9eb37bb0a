"""Measurement noise models: what a measurement's noise is, as an object.

Each model draws a seeded noisy measurement from a clean one (``A(x)``), gives its negative
log-likelihood and gradient, and the per-pixel variance the samplers' data steps weigh the
measurement by. Everything is in [0, 1] image units.

* ``GaussianNoise(sigma)``: y = A(x) + sigma n. A bare number wherever a noise model is asked
  for means this model.
* ``PoissonNoise(peak)``: y = Poisson(peak A(x)) / peak (photon counts scaled so that a clean
  value of 1 expects ``peak`` photons).
* ``PoissonGaussianNoise(peak, sigma)``: the Poisson counts plus Gaussian read noise of std sigma.

Samplers restore every model through its Gaussian approximation (:meth:`NoiseModel.weights`):
the per-pixel variance evaluated at a smoothed copy of the measurement, whitened into one
Gaussian measurement of a weighted operator (:class:`~nfc_dps.operators.weighted.WeightedOperator`),
so each data step becomes the weighted least-squares step of the Poisson likelihood's
quadratic approximation.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .generators import Generators, randn_per_image

#: half-width of the box over which the clean measurement is estimated for the variance (pixels)
VARIANCE_SMOOTHING_RADIUS = 2


def noise_sigma_problem(value: float) -> str | None:
    """Why ``value`` is not a measurement noise std in [0, 1] pixel units, as the end of an error
    message (``f"sigma_y {why}"``); None when it is one."""
    if math.isfinite(value) and 0 <= value <= 1:
        return None
    return (f"must be in [0, 1] ([0, 1] pixel units: 0.025 is 6.4/255), got {value:g}"
            + (" (in 0-255 units? divide by 255)" if math.isfinite(value) and value > 1 else ""))


def _number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value}")
    return value


class NoiseModel:
    """Base of the noise models: ``kind`` names it in CLI specs, records and ``Method.noise_kinds``."""

    kind = "noise"

    def sample(self, clean: Tensor, generators: Generators = None) -> Tensor:
        """A noisy measurement of ``clean`` (B, ...), image b drawn from ``generators[b]``."""
        raise NotImplementedError

    def variance(self, clean: Tensor) -> Tensor:
        """Per-pixel noise variance at the clean measurement ``clean``, shaped like it."""
        raise NotImplementedError

    def nll(self, y: Tensor, clean: Tensor) -> Tensor:
        """Negative log-likelihood of y given the clean measurement, per image (B,), up to a constant."""
        raise NotImplementedError

    def nll_grad(self, y: Tensor, clean: Tensor) -> Tensor:
        """d nll / d clean, shaped like ``clean``."""
        raise NotImplementedError

    def measurement_problem(self, y: Tensor) -> str | None:
        """Why ``y`` cannot be a measurement under this model (None: it can)."""
        if not bool(torch.isfinite(y).all()):
            return "measurement contains NaN or Inf"
        return None

    def reference_std(self) -> float:
        """The noise std a whitened measurement carries ([0, 1] units): the std at a clean mid-grey."""
        return float(self.variance(torch.full((1,), 0.5)).sqrt())

    def weights(self, y: Tensor) -> Tensor:
        """Per-pixel factors w (shaped like y) that whiten the measurement: w * y has noise of std
        :meth:`reference_std` everywhere, to the quadratic approximation of the likelihood at a
        smoothed copy of y (the clean measurement's estimate, at least one count)."""
        r = VARIANCE_SMOOTHING_RADIUS
        flat = y.reshape(-1, 1, *y.shape[-2:])
        size = 2 * r + 1
        if min(flat.shape[-2:]) > r:
            flat = F.avg_pool2d(F.pad(flat, (r, r, r, r), mode="reflect"), size, stride=1)
        clean = flat.reshape(y.shape)
        var = self.variance(clean.clamp_min(self.min_clean()))
        return (self.reference_std() ** 2 / var).sqrt()

    def min_clean(self) -> float:
        """The floor of the clean estimate the variance is evaluated at."""
        return 0.0

    def record(self) -> dict[str, Any]:
        """What run records and calibration files store of the model."""
        raise NotImplementedError

    @property
    def gaussian_sigma(self) -> float | None:
        """The std of Gaussian noise ([0, 1] units), or None for another law."""
        return None

    def stated_problem(self) -> str | None:
        """Why a user may not state this model (a Gaussian std outside [0, 1] pixel units), as the end
        of an error message; None when they may. The one place the range is checked."""
        sigma = self.gaussian_sigma
        why = None if sigma is None else noise_sigma_problem(sigma)
        return None if why is None else f"sigma {why}"

    def same_as(self, other: "NoiseModel") -> bool:
        """Whether ``other`` is this model: the same law with the same parameters (up to float rounding)."""
        return str(self) == str(other)

    def with_model_error(self, std: float) -> "NoiseModel":
        """This noise plus an independent Gaussian error of ``std`` ([0, 1] units): a forward model's
        own error (an estimated blur kernel's) restored as noise."""
        raise NotImplementedError


@dataclass(frozen=True)
class GaussianNoise(NoiseModel):
    """y = A(x) + sigma n, n ~ N(0, I); ``sigma`` >= 0 in [0, 1] pixel units (0.025 is 6.4/255)."""

    sigma: float

    kind = "gaussian"

    def __post_init__(self) -> None:
        value = _number("GaussianNoise", "sigma", self.sigma)
        if value < 0:
            raise ValueError(f"GaussianNoise: sigma must be >= 0, got {value:g}")
        object.__setattr__(self, "sigma", value)

    @property
    def gaussian_sigma(self) -> float:
        return self.sigma

    def same_as(self, other: NoiseModel) -> bool:
        sigma = other.gaussian_sigma
        return sigma is not None and math.isclose(self.sigma, sigma, rel_tol=1e-6, abs_tol=1e-12)

    def with_model_error(self, std: float) -> "GaussianNoise":
        return GaussianNoise(math.hypot(self.sigma, std))

    def sample(self, clean: Tensor, generators: Generators = None) -> Tensor:
        if self.sigma == 0:
            return clean.clone()
        return clean + self.sigma * randn_per_image(clean.shape, generators, clean.dtype, clean.device)

    def variance(self, clean: Tensor) -> Tensor:
        return torch.full_like(clean, self.sigma**2)

    def nll(self, y: Tensor, clean: Tensor) -> Tensor:
        return (y - clean).pow(2).flatten(1).sum(1) / (2 * max(self.sigma, 1e-12) ** 2)

    def nll_grad(self, y: Tensor, clean: Tensor) -> Tensor:
        return (clean - y) / max(self.sigma, 1e-12) ** 2

    def reference_std(self) -> float:
        return self.sigma

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "sigma": self.sigma}

    def __str__(self) -> str:
        return f"{self.kind}:{self.sigma:g}"


#: the peaks PoissonNoise takes: below, a clean white pixel expects next to no photon (and 1 / peak
#: overflows); above, no sensor counts as many, and torch's Poisson draws go negative from ~1e15
MIN_PEAK, MAX_PEAK = 1e-3, 1e9


@dataclass(frozen=True)
class PoissonNoise(NoiseModel):
    """y = Poisson(peak A(x)) / peak; ``peak`` > 0: the photon count a clean value of 1 expects."""

    peak: float

    kind = "poisson"

    def __post_init__(self) -> None:
        value = _number(type(self).__name__, "peak", self.peak)
        if value <= 0:
            raise ValueError(f"{type(self).__name__}: peak must be > 0 (photons at a clean value of 1), got {value:g}")
        if not MIN_PEAK <= value <= MAX_PEAK:
            raise ValueError(f"{type(self).__name__}: peak {value:g} is no photon count (the photons a clean value of "
                             f"1 expects): give one in [{MIN_PEAK:g}, {MAX_PEAK:g}] (a sensor pixel holds up to "
                             f"about 1e6)")
        object.__setattr__(self, "peak", value)

    def with_model_error(self, std: float) -> "PoissonGaussianNoise":
        return PoissonGaussianNoise(self.peak, std)

    def _counts(self, clean: Tensor, generators: Generators) -> Tensor:
        rate = clean.clamp_min(0) * self.peak
        if generators is None or isinstance(generators, torch.Generator):
            return torch.poisson(rate, generator=generators)
        if len(generators) != clean.shape[0]:
            raise ValueError(f"got {len(generators)} generators for a batch of {clean.shape[0]}")
        return torch.stack([torch.poisson(r, generator=g) for r, g in zip(rate, generators)])

    def sample(self, clean: Tensor, generators: Generators = None) -> Tensor:
        return self._counts(clean, generators) / self.peak

    def variance(self, clean: Tensor) -> Tensor:
        return clean.clamp_min(0) / self.peak

    def min_clean(self) -> float:
        return 1.0 / self.peak  # one photon: a dark pixel's weight stays bounded

    def nll(self, y: Tensor, clean: Tensor) -> Tensor:
        rate = clean.clamp_min(1e-6) * self.peak
        return (rate - y * self.peak * rate.log()).flatten(1).sum(1)

    def nll_grad(self, y: Tensor, clean: Tensor) -> Tensor:
        c = clean.clamp_min(1e-6)
        return self.peak * (1 - y / c)

    def measurement_problem(self, y: Tensor) -> str | None:
        why = super().measurement_problem(y)
        if why is None and bool((y < 0).any()):
            return (f"a Poisson measurement counts photons and cannot be negative (min {float(y.min()):.4g}); "
                    f"with read noise use poisson-gaussian")
        return why

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "peak": self.peak}

    def __str__(self) -> str:
        return f"{self.kind}:{self.peak:g}"


@dataclass(frozen=True)
class PoissonGaussianNoise(PoissonNoise):
    """y = Poisson(peak A(x)) / peak + sigma n: photon counts plus Gaussian read noise (sigma >= 0,
    [0, 1] units)."""

    sigma: float = 0.0

    kind = "poisson-gaussian"

    def __post_init__(self) -> None:
        super().__post_init__()
        value = _number("PoissonGaussianNoise", "sigma", self.sigma)
        if value < 0:
            raise ValueError(f"PoissonGaussianNoise: sigma must be >= 0, got {value:g}")
        object.__setattr__(self, "sigma", value)

    def with_model_error(self, std: float) -> "PoissonGaussianNoise":
        return PoissonGaussianNoise(self.peak, math.hypot(self.sigma, std))

    def sample(self, clean: Tensor, generators: Generators = None) -> Tensor:
        counts = self._counts(clean, generators) / self.peak
        return counts + self.sigma * randn_per_image(clean.shape, generators, clean.dtype, clean.device)

    def variance(self, clean: Tensor) -> Tensor:
        return clean.clamp_min(0) / self.peak + self.sigma**2

    def nll(self, y: Tensor, clean: Tensor) -> Tensor:
        """The Gaussian approximation's: N(clean, clean / peak + sigma^2) per pixel."""
        c = clean.clamp_min(1e-6)
        v = self.variance(c)
        return (0.5 * (y - c).pow(2) / v + 0.5 * v.log()).flatten(1).sum(1)

    def nll_grad(self, y: Tensor, clean: Tensor) -> Tensor:
        c = clean.clamp_min(1e-6)
        v = self.variance(c)
        r = c - y
        return r / v + (0.5 / v - 0.5 * r.pow(2) / v.pow(2)) / self.peak

    def measurement_problem(self, y: Tensor) -> str | None:
        return NoiseModel.measurement_problem(self, y)

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "peak": self.peak, "sigma": self.sigma}

    def __str__(self) -> str:
        return f"{self.kind}:{self.peak:g},{self.sigma:g}"


#: ``--noise`` spec kinds and the parameters each takes, in order
NOISE_KINDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "gaussian": (GaussianNoise, ("sigma",)),
    "poisson": (PoissonNoise, ("peak",)),
    "poisson-gaussian": (PoissonGaussianNoise, ("peak", "sigma")),
}


@dataclass(frozen=True)
class EstimatedNoise:
    """A noise kind whose parameters ``restore`` estimates from each measurement (``kind:auto``; a
    Gaussian's is ``sigma_y="auto"``), resolved per image into a model by
    :func:`nfc_dps.noise_level.estimated_models`. Not a noise model: it draws and weighs nothing, so
    only restore takes it (:func:`parse_noise` and :func:`as_noise` with ``estimated=True``)."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in NOISE_KINDS:
            raise ValueError(f"EstimatedNoise: unknown kind {self.kind!r}; choose one of {', '.join(NOISE_KINDS)}")

    def __str__(self) -> str:
        return f"{self.kind}:auto"


class NoiseSpecError(ValueError):
    """A ``kind:values`` spec :func:`parse_noise` refuses: ``spec`` and ``reason`` (what is wrong,
    without the spec), so that a flag or a config key can name the spec once."""

    def __init__(self, spec: Any, reason: str) -> None:
        self.spec, self.reason = spec, reason
        super().__init__(f"noise {spec!r}: {reason}")


def parse_noise(spec: str, estimated: bool = False) -> NoiseModel | EstimatedNoise:
    """A noise model from ``kind:values``: ``gaussian:0.025``, ``poisson:30``,
    ``poisson-gaussian:30,0.01`` (:class:`NoiseSpecError`, a ValueError naming the spec, otherwise).
    ``poisson:auto`` and ``poisson-gaussian:auto`` (the parameters estimated from each measurement)
    give an :class:`EstimatedNoise` where ``estimated`` (restore's path, which resolves it) and are
    refused in words elsewhere."""
    kind, _, values = str(spec).strip().partition(":")
    if kind not in NOISE_KINDS:
        forms = ", ".join(f"{k}:{','.join(p)}" for k, (_, p) in NOISE_KINDS.items())
        raise NoiseSpecError(spec, f"unknown kind {kind!r}; choose one of {forms}")
    cls, params = NOISE_KINDS[kind]
    parts = [v.strip() for v in values.split(",")] if values.strip() else []
    if "auto" in (v.lower() for v in parts):
        return _estimated(spec, kind, params, parts, estimated)
    if len(parts) != len(params):
        raise NoiseSpecError(spec, f"{kind} takes {len(params)} value(s) ({','.join(params)}), got {len(parts)}")
    try:
        numbers_ = [float(v) for v in parts]
    except ValueError:
        raise NoiseSpecError(spec, f"{','.join(params)} must be numbers") from None
    try:
        return cls(*numbers_)
    except (TypeError, ValueError) as e:
        raise NoiseSpecError(spec, str(e)) from None


def _estimated(spec: str, kind: str, params: tuple[str, ...], parts: list[str], estimated: bool) -> EstimatedNoise:
    """The :class:`EstimatedNoise` of a ``kind:auto`` spec where ``estimated``; else NoiseSpecError
    saying where it is read (restore) and how to state the parameters instead."""
    example = f"{kind}:{','.join({'peak': '30', 'sigma': '0.01'}[q] for q in params)}"
    if kind == "gaussian":
        raise NoiseSpecError(spec, "a Gaussian level read from each measurement is spelled --noise-sigma auto "
                                   "(sigma_y='auto' in the API)")
    if len(parts) != 1:
        raise NoiseSpecError(spec, f"auto stands for all of {kind}'s {','.join(params)}: spell it {kind}:auto, or "
                                   f"give every value, e.g. {example}")
    if not estimated:
        raise NoiseSpecError(spec, f"{kind}'s {','.join(params)} {'are' if len(params) > 1 else 'is'} read from each "
                                   f"measurement by restore only "
                                   f"(nfc-dps restore --noise {kind}:auto, nfc_dps.restore(y, op, noise='{kind}:auto')); "
                                   f"here give {'them' if len(params) > 1 else 'it'}, e.g. {example}")
    return EstimatedNoise(kind)


def noise_from_record(record: dict[str, Any]) -> NoiseModel:
    """The model a :meth:`NoiseModel.record` describes."""
    kind = record.get("kind")
    if kind not in NOISE_KINDS:
        raise ValueError(f"unknown noise kind {kind!r} in {record}")
    cls, params = NOISE_KINDS[kind]
    return cls(*(record[p] for p in params))


def as_noise(noise: Any, estimated: bool = False) -> NoiseModel | EstimatedNoise:
    """``noise`` as a noise model: a model is returned as is, a number is Gaussian of that std, a
    string a spec of :func:`parse_noise`; an :class:`EstimatedNoise` (or a ``kind:auto`` spec) only
    where ``estimated`` (restore's path; elsewhere a ValueError saying so)."""
    if isinstance(noise, NoiseModel):
        return noise
    if isinstance(noise, EstimatedNoise):
        if estimated:
            return noise
        noise = str(noise)  # its spec, refused in words as the spec is
    if isinstance(noise, str):
        return parse_noise(noise, estimated)
    if isinstance(noise, Tensor) and noise.numel() == 1:
        noise = noise.item()
    if isinstance(noise, numbers.Real) and not isinstance(noise, bool):
        return GaussianNoise(float(noise))
    raise TypeError(f"noise must be a noise model (e.g. nfc_dps.noise.GaussianNoise(0.025), PoissonNoise(30)), a "
                    f"spec such as 'poisson:30', or a Gaussian std in [0, 1] pixel units, got {type(noise).__name__}")


__all__ = ["NoiseModel", "GaussianNoise", "PoissonNoise", "PoissonGaussianNoise", "EstimatedNoise", "parse_noise",
           "as_noise", "noise_from_record", "NOISE_KINDS", "NoiseSpecError"]

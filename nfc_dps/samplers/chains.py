"""The one chain driver: a measurement object and the function that runs a method's chains on it.

Every caller that samples (``restore``, the benchmark protocols) goes through
:func:`sample_chains` / :func:`iter_chains`, which own counting network calls, one seeded
generator per chain, chunking by ``max_batch``, the checks before a run, whitening a non-Gaussian
noise model, the conversion to the prior's units and back, the NaN/Inf check and the callback.
Samplers are ``sample(prior, measurement, config, generators, callback) -> x`` with a
:class:`~nfc_dps.samplers.common.ModelMeasurement` and x in model units.

Chain order is image-major: chain ``i`` restores image ``i // num_samples`` and is its sample
``i % num_samples``; its generator is seeded by ``(seeds[i // num_samples], i % num_samples)``,
so a chain's draw depends neither on the batch nor on ``max_batch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..noise import GaussianNoise, NoiseModel, as_noise
from ..operators.base import LinearOperator, noise_sigma_problem
from ..operators.nonlinear import WeightedNonlinearOperator, is_linear
from ..operators.weighted import WeightedOperator
from .common import ModelMeasurement, counting, to_image_units, to_model_units
from .registry import get_method

#: called after every sampler step with ``{"i", "sigma", "x", "denoised", "nfe", "chains"}``
#: (model units; ``chains`` is the (start, stop) range of the chunk); NFC adds ``x0``, its
#: committed estimate
ChainCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Measurement:
    """What a sampler restores: ``y = operator(x) + noise``.

    operator: the forward map; y: (B, C, h, w), in [0, 1] up to the noise (Poisson counts / peak
    and unbounded operators such as phase retrieval may leave it); noise: a noise model
    (:mod:`nfc_dps.noise`; a number is a Gaussian std in [0, 1] pixel units); image_shape:
    (B, C, H, W) of the unknown images (default: what the operator gives for y).
    """

    operator: LinearOperator
    y: Tensor
    noise: NoiseModel | float = 0.0
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        y = self.y
        if not isinstance(y, Tensor):
            raise TypeError(f"Measurement: y must be a torch.Tensor (B, C, h, w), got {type(y).__name__} (a numpy "
                            f"array: torch.from_numpy; nfc_dps.restore takes numpy images)")
        if y.ndim != 4 or not y.is_floating_point():
            raise ValueError(f"Measurement: y must be a float tensor (B, C, h, w), got dtype "
                             f"{str(y.dtype).removeprefix('torch.')} and shape {tuple(y.shape)}")
        if isinstance(self.noise, (int, float, np.integer, np.floating)) and not isinstance(self.noise, bool):
            # a number is a Gaussian std in [0, 1] pixel units (GaussianNoise refuses a negative one)
            why = noise_sigma_problem(float(self.noise)) if float(self.noise) > 1 else None
            if why:
                raise ValueError(f"Measurement: noise (a Gaussian std) {why}")
        object.__setattr__(self, "noise", as_noise(self.noise))
        why = self.noise.measurement_problem(y)  # NaN / Inf; a Poisson measurement's negative values
        if why:
            raise ValueError(f"Measurement: {why} (noise {self.noise})")
        shape = self.operator.image_shape(y.shape) if self.image_shape is None else self.image_shape
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or any(
                isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) for s in shape):
            raise ValueError(f"Measurement: image_shape must be four integers (B, C, H, W), got {shape!r}")
        shape = tuple(int(s) for s in shape)
        if len(shape) != 4 or shape[0] != y.shape[0]:
            raise ValueError(f"Measurement: image_shape must be (B, C, H, W) with B = {y.shape[0]} "
                             f"(the measurement's batch), got {shape}")
        try:
            expected: tuple[int, ...] | None = tuple(int(s) for s in self.operator.measurement_shape(shape))
        except NotImplementedError:  # an operator that declares no shapes: its A says
            expected = None
        except (ValueError, TypeError) as e:
            raise ValueError(f"Measurement: the operator takes no image of shape {shape} ({e})") from e
        name = getattr(self.operator, "name", type(self.operator).__name__)
        if expected is None or expected[1:] == tuple(y.shape[1:]):
            try:  # an operator of fixed size (a mask, a kernel bank) answers for any shape: it is applied once
                with torch.no_grad():
                    out = self.operator.A(torch.zeros(shape, dtype=y.dtype, device=y.device))
                expected = tuple(out.shape)
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                raise ValueError(f"Measurement: the operator {name} cannot measure images of shape {shape} "
                                 f"(the unknown images of y's shape {tuple(y.shape)}): {type(e).__name__}: {e}") from e
        if expected != tuple(y.shape):
            raise ValueError(f"Measurement: y has shape {tuple(y.shape)}, but the operator {name} measures images "
                             f"of shape {shape} as {expected}")
        object.__setattr__(self, "image_shape", shape)

    @property
    def sigma_y(self) -> float:
        """The Gaussian noise std ([0, 1] pixel units) of a Gaussian measurement."""
        if self.noise.gaussian_sigma is None:
            raise ValueError(f"this sampler needs Gaussian noise, got {self.noise}")
        return self.noise.gaussian_sigma

    def in_model_units(self) -> ModelMeasurement:
        """This measurement (its noise Gaussian: :meth:`gaussian`) in the prior's [-1, 1] units, what a
        sampler takes (:func:`~nfc_dps.samplers.common.to_model_units`)."""
        return to_model_units(self.operator, self.y, self.sigma_y, self.image_shape)

    def chains(self, index: Tensor) -> "Measurement":
        """The measurement of the chains whose images are ``index`` (a (n,) long tensor): y indexed,
        never copied per sample."""
        return Measurement(self.operator.select_images(index), self.y[index], self.noise,
                           (int(index.numel()), *self.image_shape[1:]))

    def gaussian(self) -> "Measurement":
        """This measurement with Gaussian noise: itself when its noise is Gaussian, else whitened
        to the noise model's quadratic approximation (per-pixel weights from y, one std
        everywhere: :meth:`~nfc_dps.noise.NoiseModel.weights`) through a
        :class:`~nfc_dps.operators.weighted.WeightedOperator`."""
        if self.noise.gaussian_sigma is not None:
            return self
        w = self.noise.weights(self.y)
        weighted = (WeightedOperator(self.operator, w) if is_linear(self.operator)
                    else WeightedNonlinearOperator(self.operator, w))
        return Measurement(weighted, w * self.y, GaussianNoise(self.noise.reference_std()), self.image_shape)


def image_generators(seeds: Sequence[int], num_samples: int, device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per (image, sample), seeded from (seed_b, j): independent of batch layout.

    Order: image-major, i.e. index b * num_samples + j.
    """
    return chain_generators(seeds, num_samples, 0, len(seeds) * num_samples, device)


def chain_generators(seeds: Sequence[int], num_samples: int, lo: int, hi: int,
                     device: torch.device | str = "cpu") -> list[torch.Generator]:
    """The generators of chains ``lo .. hi - 1`` of :func:`image_generators` (chain i: image
    i // num_samples, sample i % num_samples), made without the others'."""
    gens = []
    for i in range(lo, hi):
        state = np.random.SeedSequence([int(seeds[i // num_samples]), i % num_samples]).generate_state(1, dtype=np.uint64)[0]
        gens.append(torch.Generator(device=device).manual_seed(int(state)))
    return gens


@dataclass
class ChainChunk:
    """Chains ``start .. stop - 1``: x (stop - start, C, H, W) in [0, 1] units (unclipped), and the
    network calls each chain made."""

    start: int
    stop: int
    x: Tensor
    nfe: int


def iter_chains(method: str, prior: Any, measurement: Measurement, config: Any, seeds: Sequence[int],
                num_samples: int = 1, max_batch: int | None = None,
                callback: ChainCallback | None = None) -> Iterator[ChainChunk]:
    """Run ``len(seeds) * num_samples`` chains of ``method``, ``max_batch`` at a time (None: all at
    once), yielding each chunk as it finishes. ``seeds``: one int per image of the measurement.
    The network runs without gradients (a method that differentiates through it turns them on for
    its own step): results never carry a graph. A chunk with NaN or Inf is a FloatingPointError
    naming the method."""
    if not isinstance(measurement, Measurement):
        raise TypeError(f"measurement must be a nfc_dps.samplers.Measurement, got {type(measurement).__name__}")
    for name, value, least in (("num_samples", num_samples, 1), ("max_batch", max_batch, 1)):
        if value is None and name == "max_batch":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be an int >= {least}{' or None' if name == 'max_batch' else ''}, "
                             f"got {value!r}")
    m = get_method(method)
    why = m.problem(method, measurement.operator, measurement.noise, config)
    if why:
        raise ValueError(why)
    sample = m.sample
    b = measurement.y.shape[0]
    if len(seeds) != b:
        raise ValueError(f"got {len(seeds)} seeds for a measurement of {b} images")
    chains = b * num_samples
    chunk = chains if max_batch is None else min(int(max_batch), chains)
    counted = counting(prior)
    device = measurement.y.device
    for lo in range(0, chains, chunk):
        hi = min(lo + chunk, chains)

        def step(info: dict[str, Any], span: tuple[int, int] = (lo, hi)) -> None:
            callback({**info, "nfe": counted.nfe, "chains": span})

        before = counted.nfe
        counted.nonfinite = None
        part = measurement.chains(torch.arange(lo, hi, device=device) // num_samples).gaussian().in_model_units()
        try:
            with torch.no_grad():  # a method that differentiates (DPS) turns gradients on for its own step
                x = to_image_units(sample(counted, part, config, chain_generators(seeds, num_samples, lo, hi, device=device),
                                          None if callback is None else step))
        except ValueError as e:  # a step's check of a non-finite image: name the prior or operator that made it
            reason = nonfinite_reason(method, counted, measurement) if "NaN" in str(e) else None
            if reason is None or reason.endswith(STEP_ADVICE):
                raise
            raise FloatingPointError(reason) from e
        if not torch.isfinite(x).all():
            raise FloatingPointError(nonfinite_reason(method, counted, measurement))
        yield ChainChunk(lo, hi, x, counted.nfe - before)


#: where the operator is probed when a run ends non-finite: images in [0, 1], then beyond it (a
#: sampler's iterates leave [0, 1] on the way)
PROBE_RANGES = ((0.0, 1.0), (-0.5, 1.5))
#: the advice when neither the prior nor the operator made the NaN/Inf
STEP_ADVICE = "try a smaller step size or another preset"


def nonfinite_reason(method: str, prior: Any, measurement: Measurement) -> str:
    """Why a run of ``method`` ended with NaN/Inf: the prior (a :class:`CountingPrior` that saw it
    return NaN/Inf for a finite input), else the operator (A, or its adjoint / vector-Jacobian
    product, non-finite on seeded images in :data:`PROBE_RANGES`), else the sampler's steps."""
    inner = getattr(prior, "inner", prior)
    if getattr(prior, "nonfinite", None) is not None and bool(prior.nonfinite):
        return (f"{method} produced NaN/Inf: the prior's denoiser ({type(inner).__name__}) returned NaN/Inf for a "
                f"finite input, at a noise level in its range (model units [{float(inner.sigma_min):g}, "
                f"{float(inner.sigma_max):g}]); the prior's own network or function is the cause, not the step size")
    op = measurement.operator
    name = getattr(op, "name", type(op).__name__)
    shape = tuple(measurement.image_shape)
    gen = torch.Generator().manual_seed(0)
    for lo, hi in PROBE_RANGES:
        x = (lo + (hi - lo) * torch.rand(shape, generator=gen)).to(measurement.y)
        try:
            with torch.no_grad():
                y = op.A(x)
            what = "A"
            if torch.isfinite(y).all():
                u = torch.randn(y.shape, generator=gen).to(y)
                what = "its adjoint" if is_linear(op) else "its gradient (vector-Jacobian product)"
                with torch.enable_grad():
                    g = op.A_adjoint(u) if is_linear(op) else op.vjp(x, u)
                y = g
        except Exception:  # noqa: BLE001 - a probe of the user's code: its failure is not this run's reason
            continue
        if not torch.isfinite(y).all():
            inside = "images in [0, 1]" if (lo, hi) == (0.0, 1.0) else \
                f"images in [{lo:g}, {hi:g}] (a sampler's iterates leave [0, 1]: make it finite there, e.g. clamp)"
            return (f"{method} produced NaN/Inf: the operator {name} ({type(op).__name__}): {what} gives NaN/Inf on "
                    f"{inside}; the operator's own function is the cause, not the step size")
    return f"{method} produced NaN/Inf; {STEP_ADVICE}"


def sample_chains(method: str, prior: Any, measurement: Measurement, config: Any, seeds: Sequence[int],
                  num_samples: int = 1, max_batch: int | None = None,
                  callback: ChainCallback | None = None) -> tuple[Tensor, int]:
    """All chains of :func:`iter_chains` at once: (x (B * num_samples, C, H, W) in [0, 1] units,
    unclipped, image-major; network calls per chain)."""
    parts = list(iter_chains(method, prior, measurement, config, seeds, num_samples, max_batch, callback))
    x = parts[0].x if len(parts) == 1 else torch.cat([p.x for p in parts])
    return x, parts[0].nfe

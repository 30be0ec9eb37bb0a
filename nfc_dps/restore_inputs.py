"""What ``restore`` accepts, checked with errors that name the value: measurements (tensors or
numpy arrays in [0, 1], uint8 / uint16 scaled), the noise (``sigma_y`` or a noise model), one seed
per image (:func:`stable_seed` for seeds derived from names), and the prior (an object, a folder
or the embedded default)."""

from __future__ import annotations

import os
import zlib
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from .config import DEFAULT_NOISE_SIGMA as DEFAULT_SIGMA_Y
from .io import INTEGER_SCALES
from .noise import EstimatedNoise, GaussianNoise, NoiseModel, as_noise
from .operators.base import LinearOperator, noise_sigma_problem
from .priors.base import Prior, prior_device
from .priors.default import load_prior


def _unit_float(y: Tensor) -> Tensor:
    """A float32 copy of ``y`` in [0, 1] units: uint8 / 255, uint16 / 65535, floats as they are."""
    name = str(y.dtype).removeprefix("torch.")
    if y.is_floating_point():
        return y.to(torch.float32)
    if name in INTEGER_SCALES:
        return y.to(torch.float32) / INTEGER_SCALES[name]
    raise TypeError(f"measurement of dtype {name} is not supported: pass floats in [0, 1], or uint8 "
                    f"(divided by 255) / uint16 (divided by 65535) images")


def as_batch(y: Tensor | np.ndarray) -> tuple[Tensor, Callable[[Tensor], Any]]:
    """Accept (B,C,h,w)/(C,h,w) tensors or (h,w)/(h,w,C) numpy arrays; return a float32 [0, 1]
    batch (B, C, h, w) and the inverse layout map (float32 results in the input's container)."""
    if isinstance(y, np.ndarray):
        if y.ndim not in (2, 3):
            raise ValueError(f"numpy measurement must be (h, w) or (h, w, C), got shape {y.shape}")
        if y.dtype.kind not in "fiub" or (y.dtype.kind in "iub" and y.dtype.name not in INTEGER_SCALES):
            raise TypeError(f"measurement of dtype {y.dtype.name} is not supported: pass floats in [0, 1], "
                            f"or uint8 (divided by 255) / uint16 (divided by 65535) images")
        gray = y.ndim == 2
        # native byte order (a big-endian 16-bit TIFF or FITS array), and a writable copy for torch
        t = torch.from_numpy(np.array(y, dtype=y.dtype.newbyteorder("="), copy=True))
        t = t[None, None] if gray else t.permute(2, 0, 1)[None]

        def back(x: Tensor) -> np.ndarray:
            a = x[0].permute(1, 2, 0).cpu().numpy()
            return a[..., 0] if gray and a.shape[-1] == 1 else a  # a gray measurement may restore to colour

        return _unit_float(t), back
    if not isinstance(y, Tensor):
        raise TypeError(f"measurement must be a torch.Tensor or numpy array, got {type(y).__name__}")
    if y.ndim == 3:
        return _unit_float(y[None]), lambda x: x[0]
    if y.ndim == 4:
        return _unit_float(y), lambda x: x
    raise ValueError(f"measurement tensor must be (B, C, h, w) or (C, h, w), got shape {tuple(y.shape)}")


def range_tolerance(sigma_y: float) -> float:
    """How far outside [0, 1] a measurement may reach: 6 noise stds plus 0.05 (room for the
    overshoot of bicubic downsampling at sharp edges)."""
    return 6.0 * sigma_y + 0.05


class MeasurementRangeError(ValueError):
    """A measurement outside [0, 1] by more than its Gaussian noise explains: ``lo``, ``hi`` its
    values' range, ``sigma_y`` and ``tol`` the noise and tolerance; :meth:`cli_reason` says it in
    the command line's words (its flags, not the API's arguments)."""

    def __init__(self, lo: float, hi: float, sigma_y: float, tol: float) -> None:
        self.lo, self.hi, self.sigma_y, self.tol = lo, hi, sigma_y, tol
        super().__init__(f"{self._values('sigma_y=')}; restore takes images in [0, 1] (divide 8-bit data by 255, or "
                         f"pass the uint8 array itself){self._poisson('noise=PoissonNoise(peak)')}")

    def _values(self, sigma: str) -> str:
        return (f"measurement values lie in [{self.lo:.4g}, {self.hi:.4g}], outside the [0, 1] range by more than "
                f"noise of {sigma}{self.sigma_y:g} explains (tolerance {self.tol:.3g})")

    def _poisson(self, how: str) -> str:
        """A measurement of no negative values above 1: how a Poisson measurement (counts / peak) is restored."""
        if self.lo < -self.tol:
            return ""
        return f"; a Poisson measurement (photon counts / peak, above 1 where the peak is low) is restored with {how}"

    def cli_reason(self) -> str:
        """The reason in the command line's words: --noise poisson:PEAK for a Poisson simulation's
        float TIFF, and --noise-sigma for the Gaussian level."""
        poisson = self._poisson("--noise poisson:PEAK, the peak simulate used (restore --config "
                                "SIM/simulation.json reads it)")
        return f"{self._values('--noise-sigma ')}{poisson or '; scale the data to [0, 1]'}"


def check_range(batch: Tensor, sigma_y: float) -> None:
    """ValueError unless ``batch`` is finite and within [0, 1] up to :func:`range_tolerance`
    (:class:`MeasurementRangeError` when it is finite)."""
    if not torch.isfinite(batch).all():
        raise ValueError("measurement contains NaN or Inf")
    lo, hi, tol = float(batch.min()), float(batch.max()), range_tolerance(sigma_y)
    if lo < -tol or hi > 1 + tol:
        raise MeasurementRangeError(lo, hi, sigma_y, tol)


def seed_list(seed: Any, b: int) -> list[int]:
    """One int seed >= 0 per image from an int (seed + i) or a sequence of b ints; a 0-d integer
    tensor or array is an int, a 1-D integer tensor a sequence."""
    def one(s: Any, where: str) -> int:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{where} must be an int, got {type(s).__name__} {s!r}")
        if s < 0:
            raise ValueError(f"{where} must be >= 0, got {s}")
        return int(s)

    if isinstance(seed, Tensor):
        kind = f"a {'meta ' if seed.is_meta else ''}tensor of dtype {str(seed.dtype).removeprefix('torch.')} and " \
               f"shape {tuple(seed.shape)}"
        if seed.is_meta or seed.dtype == torch.bool or seed.is_floating_point() or seed.is_complex() or seed.ndim > 1:
            raise TypeError(f"seed must be an int, or integers one per image (a 1-D integer tensor), got {kind}")
        seed = seed.item() if seed.ndim == 0 else seed.tolist()
    if isinstance(seed, np.ndarray) and seed.ndim == 0:  # np.array(5): a scalar
        seed = seed.item()
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return [one(seed, "seed") + i for i in range(b)]
    if isinstance(seed, (str, bytes)) or not hasattr(seed, "__iter__"):
        raise TypeError(f"seed must be an int or a sequence of ints (one per image), got {type(seed).__name__}")
    seeds = [one(s, f"seed[{i}]") for i, s in enumerate(seed)]
    if len(seeds) != b:
        raise ValueError(f"got {len(seeds)} seeds for {b} images")
    return seeds


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed from any mix of ints and strings, stable across processes and platforms.
    A string is hashed as its UTF-8 bytes; a file name that is not valid UTF-8 (Python keeps its
    bytes as surrogate escapes) as the file system's own bytes."""
    words = [int(p) if isinstance(p, (int, np.integer)) else zlib.crc32(str(p).encode("utf-8", "surrogateescape"))
             for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint32)[0]) & 0x7FFFFFFF


def checked_measurement(y, operator, sigma_y, noise, seed, num_samples, max_batch):
    """restore()'s checks of its inputs: (batch (B, C, h, w) float32, the function that returns a
    result in y's kind, the noise model, one seed per image, num_samples as an int)."""
    if not isinstance(operator, LinearOperator):
        raise TypeError(f"operator must be a nfc_dps LinearOperator (e.g. nfc_dps.build_operator(...)), "
                        f"got {type(operator).__name__}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer))
                                  or max_batch < 1):
        raise ValueError(f"max_batch must be an int >= 1 or None, got {max_batch!r}")
    noise = checked_noise(sigma_y, noise)
    batch, back = as_batch(y)
    if batch.numel() == 0:
        raise ValueError(f"measurement has no pixels (batch of shape {tuple(batch.shape)}); pass at least one "
                         f"image of at least one pixel")
    if noise.gaussian_sigma is None:
        why = noise.measurement_problem(batch)
        if why:
            raise ValueError(f"{why} (noise {noise})")
    elif operator.family == "other" or getattr(operator, "measurement_range", (0, 1)) is None:
        # a map of unknown range (FunctionOperator, phase retrieval): its measurement may lie anywhere
        if not torch.isfinite(batch).all():
            raise ValueError("measurement contains NaN or Inf")
        check_magnitude(batch, operator)
    else:
        check_range(batch, noise.sigma)
    return batch, back, noise, seed_list(seed, batch.shape[0]), int(num_samples)


#: the largest measurement value a nonlinear map of unknown range may give: the data step works
#: in [0, 1] pixel units (sigma_y too), and float32 loses a measurement ~1e5 times larger
MAX_MEASUREMENT = 1e4


def check_magnitude(batch: Tensor, operator: LinearOperator) -> None:
    """ValueError when a nonlinear map of unknown range (``FunctionOperator(linear=False)``) gives a
    measurement far beyond [0, 1] units (raw sensor counts): its restoration would be flat grey."""
    if getattr(operator, "is_linear", True) or getattr(operator, "measurement_range", (0, 1)) is not None:
        return
    peak = float(batch.abs().max())
    if peak > MAX_MEASUREMENT:
        raise ValueError(f"the measurement reaches {peak:.3g}: restore works in [0, 1] pixel units (sigma_y too), "
                         f"and a nonlinear {getattr(operator, 'name', 'operator')} measurement above "
                         f"{MAX_MEASUREMENT:g} is restored as flat grey; rescale it to about [0, 1] (divide the "
                         f"measurement and A's output by the same factor, e.g. {peak:.3g}, and the noise level with "
                         f"them)")


def estimated_noise(sigma_y: Any, noise: Any) -> EstimatedNoise | None:
    """The noise whose parameters :func:`~nfc_dps.api.restore` estimates per image: ``sigma_y="auto"``
    (Gaussian), ``noise="poisson:auto"`` or ``"poisson-gaussian:auto"`` (or their
    :class:`~nfc_dps.noise.EstimatedNoise`); None where the noise is stated. ValueError for another
    string as sigma_y, TypeError for an estimated noise beside another."""
    if isinstance(sigma_y, str):
        if sigma_y != "auto":
            raise ValueError(f"sigma_y must be a number ([0, 1] pixel units) or 'auto', got {sigma_y!r}")
        if noise is not None:
            raise TypeError(f"pass one of sigma_y and noise, got sigma_y='auto' and noise={noise!r}")
        return EstimatedNoise("gaussian")
    if not isinstance(noise, (str, EstimatedNoise)):
        return None
    model = as_noise(noise, estimated=True)
    if not isinstance(model, EstimatedNoise):
        return None
    if sigma_y is not None:
        raise TypeError(f"pass one of sigma_y and noise, got sigma_y={sigma_y!r} and noise={noise!r}")
    return model


def checked_noise(sigma_y: Any, noise: Any) -> NoiseModel:
    """The noise model of ``sigma_y`` (Gaussian std in [0, 1], the default) or of ``noise``."""
    if noise is not None:
        if sigma_y is not None:
            raise TypeError(f"pass one of sigma_y and noise, got sigma_y={sigma_y!r} and noise={noise!r}")
        noise = as_noise(noise)
        if noise.stated_problem():
            raise ValueError(f"noise {noise}: {noise.stated_problem()}")
        return noise
    if sigma_y is None:
        sigma_y = DEFAULT_SIGMA_Y
    if isinstance(sigma_y, Tensor) and sigma_y.numel() == 1:
        sigma_y = sigma_y.item()
    try:
        sigma = float(sigma_y)
    except (TypeError, ValueError) as e:
        raise TypeError(f"sigma_y must be a number ([0, 1] pixel units), got {type(sigma_y).__name__}") from e
    why = noise_sigma_problem(sigma)
    if why:
        raise ValueError(f"sigma_y {why}")
    return GaussianNoise(sigma)


def checked_prior(prior, batch):
    """(the prior, loaded when given as a folder or None; the batch on the prior's device; the
    device results return to)."""
    input_device = batch.device
    if prior is None or isinstance(prior, (str, os.PathLike)):  # a prior folder: loaded here
        prior = load_prior(prior, device=input_device)
    elif not (isinstance(prior, Prior) or (hasattr(prior, "denoise") and hasattr(prior, "channels"))):
        raise TypeError(f"prior must be a nfc_dps Prior (e.g. nfc_dps.load_prior(folder)), a prior folder's path or "
                        f"None (the embedded default), got {type(prior).__name__}")
    device = prior_device(prior)  # numpy input is on the CPU; the results return to the input's device
    return prior, (batch.to(device) if device is not None else batch), input_device


def declared_noise(operator: Any, sigma_y: Any, noise: Any) -> tuple[Any, Any]:
    """(sigma_y, noise) for :func:`restore`: the operator's own noise model
    (:meth:`~nfc_dps.operators.base.LinearOperator.measurement_noise`) when neither is given; a
    stated one that contradicts it (another model or level, ``"auto"``) is a ValueError saying so."""
    declared = operator.measurement_noise() if isinstance(operator, LinearOperator) else None
    if declared is None:
        return sigma_y, noise
    if sigma_y is None and noise is None:
        return None, declared
    given = f"noise={noise!r}" if noise is not None else f"sigma_y={sigma_y!r}"
    why = (f"the {operator.name} measurement's noise is its own ({declared}: read from the measurement's "
           f"construction, e.g. a JPEG file's quantisation steps); {given} contradicts it: leave sigma_y and noise out")
    if noise is not None and sigma_y is not None:
        raise TypeError(f"pass one of sigma_y and noise, got sigma_y={sigma_y!r} and noise={noise!r}")
    stated = noise if noise is not None else sigma_y
    if isinstance(stated, str) and stated == "auto":
        raise ValueError(why)
    try:
        model = as_noise(stated)
    except (TypeError, ValueError):
        raise ValueError(why) from None
    if not model.same_as(declared):
        raise ValueError(why)
    return None, declared

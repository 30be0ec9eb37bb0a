"""The Python API: ``restore`` a measurement with a diffusion prior.

    >>> import torch, nfc_dps
    >>> x = torch.rand(2, 3, 64, 64)                          # images in [0, 1]
    >>> op = nfc_dps.build_operator("deblur_gaussian", image_size=(64, 64), kernel_size=25, kernel_std=2.0)
    >>> y = op.measure(x, sigma_y=0.025, generator=torch.Generator().manual_seed(0))
    >>> out = nfc_dps.restore(y, op, sigma_y=0.025)          # embedded default prior
    >>> out.image                          # (B, C, 64, 64) in [0, 1]; y is 40 x 40 (boundary valid)

Units: images and measurements in [0, 1] (uint8 / uint16 input is divided by 255 / 65535);
``sigma_y`` is the measurement noise std in [0, 1] pixel units (DPS/DAPS/NFC's "0.05" in
[-1, 1] units is 0.025 here).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import validate_overrides
from .conformal import UnfamiliarImageWarning, load_calibration
from .noise import EstimatedNoise, NoiseModel
from .noise_level import estimated_models
from .operators.base import LinearOperator
from .operators.nonlinear import is_linear
from .operators.padding import CroppedOperator, padded_size
from .priors.base import Prior
from .restore_inputs import as_batch, checked_measurement, checked_prior, declared_noise, estimated_noise, seed_list
from .samplers import Measurement, get_config, get_method, iter_chains, override_config


@dataclass
class Restoration:
    """Result of :func:`restore`, in the input's container type (numpy or torch), [0, 1] units.

    All arrays are float32, laid out like the input: numpy (h, w[, C]), tensors (C, h, w) or
    (B, C, h, w).

    image: the restoration, clipped to [0, 1]; when num_samples > 1, the mean of the unclipped
        samples, then clipped (so it can differ from the mean of ``samples`` where a sample
        left [0, 1]).
    std: per-pixel standard deviation of the unclipped samples (None for one sample): the spread
        of the sampler's posterior under the prior it is given. It is not a calibrated error bar:
        it leaves out the network's own error and the sampler's bias, and mean ± c·std covers the
        truth at no stated rate (docs/uncertainty.md); pass ``calibration`` for intervals that do.
    samples: the K individual samples, each clipped, stacked on a new first axis (None for one
        sample, or with ``keep_samples=False``): numpy (K, h, w[, C]), tensors (K, C, h, w) or
        (K, B, C, h, w).
    nfe: network evaluations per sample trajectory (a blind blur's: those of all its restorations).
        seconds: wall time (a blind blur's with the kernel's estimation). config: the sampler config.
    lower, upper: with ``calibration``, the calibrated interval image ∓ q (std + c·edge(image) + eps), clipped to
        [0, 1] (:mod:`nfc_dps.conformal`); None otherwise.
    noise_sigma: the measurement's Gaussian noise std, [0, 1] units: ``sigma_y``, or with
        ``sigma_y="auto"`` the estimate (a float for one image, a list of one per image for a batch
        (B, C, h, w)); None under a non-Gaussian noise model. A blind blur restores assuming more
        (its kernel's error: ``LinearOperator.model_error``).
    noise: the measurement's noise model (:mod:`nfc_dps.noise`), or with an estimated noise
        (``sigma_y="auto"``, ``noise="poisson-gaussian:auto"``, ``"poisson:auto"``) the model
        estimated from the measurement, laid out as ``noise_sigma``.
    frame: for a photograph's blur (boundary "valid") the restoration is the whole scene, larger
        than the photo by the kernel less one; ``frame`` = (top, left, height, width) of the photo's
        own frame in it (:meth:`photo` crops ``image``; crop ``std``, ``samples``, ``lower`` and
        ``upper`` alike); None where the restoration is not larger than the region the
        measurement lies over.
    kernel: for a blind blur (task ``deblur_blind``) the kernel estimated from the photo, (s, s)
        float32, sum 1, centred ((B, s, s) for a batch tensor), numpy for a numpy input; else None.
    """

    image: Any
    std: Any | None
    samples: Any | None
    nfe: int
    seconds: float
    config: Any
    lower: Any | None = None
    upper: Any | None = None
    noise_sigma: float | list[float] | None = None
    frame: tuple[int, int, int, int] | None = None
    kernel: Any | None = None
    noise: NoiseModel | list[NoiseModel] | None = None

    def photo(self) -> Any:
        """``image`` cropped to the photo's own frame (``frame``; ``image`` itself where it is None),
        laid out like ``image``."""
        if self.frame is None:
            return self.image
        top, left, h, w = self.frame
        if isinstance(self.image, np.ndarray):  # (h, w[, C])
            return self.image[top:top + h, left:left + w]
        return self.image[..., top:top + h, left:left + w]



class _SampleStats:
    """Running per-pixel mean and variance of each image's K chains, merged a chunk at a time
    (Chan et al.'s parallel form of Welford's update, in float64; float32 on MPS, which has no
    float64): memory of two images per image, whatever K."""

    def __init__(self, b: int, num_samples: int) -> None:
        self.k, self.n = num_samples, [0] * b
        self.mean: Tensor | None = None
        self.m2: Tensor | None = None

    def add(self, x: Tensor, lo: int) -> None:
        """Chains ``lo .. lo + len(x) - 1`` (image-major order), unclipped."""
        wide = torch.float32 if x.device.type == "mps" else torch.float64  # MPS has no float64
        if self.mean is None:
            self.mean = x.new_zeros((len(self.n), *x.shape[1:]), dtype=wide)
            self.m2 = torch.zeros_like(self.mean)
        image = torch.arange(lo, lo + len(x)) // self.k
        for i in image.unique().tolist():
            xs = x[image == i].to(wide)
            nb, na = len(xs), self.n[i]
            mb = xs.mean(0)
            m2b = (xs - mb).square().sum(0)
            delta = mb - self.mean[i]
            n = na + nb
            self.mean[i] += delta * (nb / n)
            self.m2[i] += m2b + delta.square() * (na * nb / n)
            self.n[i] = n

    def std(self) -> Tensor:
        """The unbiased per-pixel standard deviation (as ``Tensor.std``)."""
        return (self.m2 / (self.k - 1)).sqrt()


def restore(
    y: Tensor | np.ndarray, operator: LinearOperator, prior: Prior | None = None, method: str = "nfc",
    preset: str | None = None, sigma_y: float | None = None, noise: Any = None, seed: int | Sequence[int] = 0,
    num_samples: int = 1, callback: Callable[[dict[str, Any]], None] | None = None, progress: bool = True,
    config: Any | None = None, max_batch: int | None = None, calibration: Any | None = None,
    keep_samples: bool = True, restarts: int = 1, **overrides: Any,
) -> Restoration:
    """Restore measurement(s) ``y`` of ``operator`` with a diffusion ``prior``.

    Args:
        y: measurement in [0, 1]: tensor (B, C, h, w) or (C, h, w), or numpy (h, w[, C]). Floats
            must lie in [0, 1] up to the noise (at most ``6 * sigma_y + 0.05`` outside, else
            ValueError; any finite values for an operator of family "other" or of unbounded range such as
            phase retrieval; >= 0 under Poisson noise); uint8 is divided by
            255 and uint16 by 65535; other integer or bool dtypes are a TypeError. Computed in float32.
        operator: the forward operator (see :mod:`nfc_dps.operators`).
        prior: a :class:`~nfc_dps.priors.base.Prior`, a prior folder's path (loaded with
            :func:`~nfc_dps.priors.default.load_prior`), or None: the embedded default prior.
        method: "nfc", "daps", "dps", "diffpir", "ddnm", "ddrm" or "dpir".
        preset: a named preset of the method; None = its default: for NFC "deterministic" (the
            best estimate per network call: 16 NFE, no random draw), for the others "fast".
            Posterior samples with a ``std``: NFC's "fast" (100 NFE) or "paper" (as published).
        sigma_y: measurement noise std in [0, 1] pixel units, in [0, 1]: the shorthand for
            ``noise=GaussianNoise(sigma_y)``; 0.025 when neither is given, or the operator's own
            noise where it declares one (``operator.measurement_noise()``: a JPEG file's
            quantisation), which a stated level or ``"auto"`` must not contradict; ``"auto"``: estimated
            per image from the measurement (:mod:`nfc_dps.noise_level`), as ``noise_sigma`` says.
        noise: the measurement's noise model (:mod:`nfc_dps.noise`): ``GaussianNoise(s)``,
            ``PoissonNoise(peak)``, ``PoissonGaussianNoise(peak, s)`` or a spec such as
            ``"poisson:30"``; a non-Gaussian one is restored through its Gaussian approximation
            (per-pixel weights: ``Measurement.gaussian``). Poisson measurements are counts / peak,
            >= 0 and may exceed 1. ``"poisson-gaussian:auto"`` / ``"poisson:auto"``: the peak (and
            read std) estimated per image from the measurement, the models used in ``noise``.
        seed: an int (image b uses seed + b) or one int >= 0 per image. Chain j of image b draws from
            its own generator, seeded by (seed_b, j): results do not depend on the batch or on
            ``max_batch`` (in float32 up to the rounding of batched layers: docs/scale.md).
        num_samples: posterior samples per image; >1 returns their mean and per-pixel std.
        callback: called after every sampler step with a dict of intermediates (model units), once
            per chunk of chains; ``info["chains"]`` is the chunk's (start, stop) range in
            image-major order (b * num_samples + j).
        progress: show a tqdm bar over the sampler's steps.
        config: a full sampler config of ``method`` (replaces ``preset``); ``**overrides`` replace
            its fields either way.
        max_batch: at most this many chains (images x samples) per sampler call (bounds memory);
            None runs all B * num_samples chains at once.
        calibration: a :class:`~nfc_dps.conformal.Calibration` or the path of the JSON file
            ``nfc-dps calibrate`` wrote: adds the calibrated interval (``lower``, ``upper``); it must
            have been fitted for this method, config, ``num_samples`` (K >= 2), prior, noise level
            and operator family, else :class:`~nfc_dps.conformal.CalibrationError`.
        keep_samples: return the K samples; False keeps only their running mean and variance
            (``samples=None``), so memory does not grow with ``num_samples``.
        restarts: run this many chains per image and keep the one the measurement fits best (the
            noise model's likelihood of y given A(x), never the truth), as DPS and DAPS report
            phase retrieval; needs a stochastic config and ``num_samples=1``; NFE is per chain.
    Every sample (and so the mean) is made consistent with the measurement before clipping, where
    the operator defines how (``operator.consistent``: a JPEG's projection onto its quantisation
    cells; the other operators leave it as it is).
    Gray measurements with an RGB prior are replicated to RGB, with noise std sigma_y * sqrt(3)
    per copy, and averaged back. Images whose size is not a multiple of ``prior.size_multiple``
    are restored on a padded canvas (the border is unmeasured, filled by the prior) and cropped.
    Profiling: samplers mark their building blocks with ``torch.profiler.record_function``.
    """
    sigma_y, noise = declared_noise(operator, sigma_y, noise)
    options = dict(prior=prior, method=method, preset=preset, num_samples=num_samples, callback=callback,
                   progress=progress, config=config, max_batch=max_batch, calibration=calibration,
                   keep_samples=keep_samples, restarts=restarts, **overrides)
    estimated = estimated_noise(sigma_y, noise)
    if estimated is not None:
        return _restore_estimated_noise(y, operator, estimated, seed, options)
    batch, back, noise, seeds, num_samples = checked_measurement(y, operator, sigma_y, noise, seed, num_samples, max_batch)
    restarts = _checked_restarts(restarts, num_samples)
    prior, batch, input_device = checked_prior(prior, batch)
    cfg = _resolved_config(method, preset, config, overrides, num_samples)
    calibration = _checked_run(method, cfg, operator, noise, prior, num_samples, restarts, calibration)
    if operator.fitted_per_image:  # checked above as the blur it will be; fitted per image before restoring
        options.update(prior=prior, num_samples=num_samples, restarts=restarts, calibration=calibration)
        return _restore_fitted(y, operator, batch.to(input_device), back, noise, seeds, options)
    return _sampled(method, cfg, prior, operator, batch, noise, seeds, num_samples, restarts, calibration, back,
                    max_batch=max_batch, keep_samples=keep_samples, input_device=input_device, callback=callback,
                    progress=progress)


def _checked_run(method: str, cfg: Any, operator: LinearOperator, noise: NoiseModel, prior: Prior, num_samples: int,
                 restarts: int, calibration: Any | None) -> Any | None:
    """The checks of the arguments against one another, in this order: restarts need a stochastic
    config; a calibration needs an operator known before the measurement, Gaussian noise, and to
    have been fitted for this run; the method must take this operator and noise. Returns the
    calibration, loaded (None without one)."""
    if restarts > 1 and cfg.is_deterministic:
        raise ValueError(f"restarts={restarts}: this {method} config is deterministic (every restart would be the "
                         f"same); restart a stochastic one, e.g. method='daps' or preset='fast'")
    if calibration is not None:
        if operator.fitted_per_image:
            raise ValueError(f"calibrated intervals hold for the operator they were fitted with; {operator.name}'s is "
                             f"estimated from each measurement, whose error no calibration holds")
        if noise.gaussian_sigma is None:
            raise ValueError(f"calibrated intervals are fitted under Gaussian noise; this measurement's noise is {noise}")
        calibration = load_calibration(calibration)
        calibration.check_run(method, cfg, num_samples, prior, family=operator.family, noise=noise,
                              factor=operator.downsampling_factor)
    why = get_method(method).problem(method, operator, noise, cfg)
    if why:
        raise ValueError(why)
    return calibration


def _sampled(method: str, cfg: Any, prior: Prior, operator: LinearOperator, batch: Tensor, noise: NoiseModel,
             seeds: list[int], num_samples: int, restarts: int, calibration: Any | None, back: Callable[[Tensor], Any],
             *, max_batch: int | None, keep_samples: bool, input_device: torch.device,
             callback: Callable[[dict[str, Any]], None] | None, progress: bool) -> Restoration:
    """The chains run on the checked ``batch`` (B, C, h, w) and their :class:`Restoration`: of
    ``restarts`` > 1 chains per image the one the measurement fits best, else the mean of
    ``num_samples`` (with their std, the samples and the calibrated interval). Seconds count the
    chains and the choice of the best one."""
    problem = _Problem.set_up(operator, batch, noise, prior)
    t0 = time.perf_counter()
    if restarts > 1:
        samples, _, nfe = _run_chains(method, cfg, prior, problem, seeds, restarts, max_batch, True, input_device,
                                      callback, progress, (operator, batch))
        samples = _best_fit(samples.to(batch.device), restarts, operator, batch, noise).to(input_device)
        out = _assembled(samples, None, nfe, time.perf_counter() - t0, cfg, back, 1, None)
    else:
        samples, stats, nfe = _run_chains(method, cfg, prior, problem, seeds, num_samples, max_batch,
                                          keep_samples, input_device, callback, progress, (operator, batch))
        out = _assembled(samples, stats, nfe, time.perf_counter() - t0, cfg, back, num_samples, calibration)
    out.noise_sigma, out.noise = noise.gaussian_sigma, noise
    out.frame = operator.measured_frame(tuple(batch.shape[:2]) + tuple(operator.image_shape(batch.shape)[-2:]))
    return out


def _restore_estimated_noise(y: Any, operator: LinearOperator, estimated: EstimatedNoise, seed: Any,
                             kwargs: dict[str, Any]) -> Restoration:
    """:func:`restore` with an estimated noise (``sigma_y="auto"``, ``noise="poisson-gaussian:auto"``):
    each image restored with the model estimated from it (:func:`~nfc_dps.noise_level.estimated_models`)."""
    if not isinstance(operator, LinearOperator):
        raise TypeError(f"operator must be a nfc_dps LinearOperator (e.g. nfc_dps.build_operator(...)), "
                        f"got {type(operator).__name__}")
    batch, back = as_batch(y)
    if batch.numel() == 0:
        raise ValueError(f"measurement has no pixels (batch of shape {tuple(batch.shape)})")
    if kwargs.get("calibration") is not None:
        given = "sigma_y='auto'" if estimated.kind == "gaussian" else f"noise='{estimated}'"
        raise ValueError(f"{given} with a calibration: a calibration holds at the noise level it was fitted "
                         "at; give that level as sigma_y")
    models = estimated_models(batch, operator, estimated)
    seeds = seed_list(seed, batch.shape[0])
    one_image = not (isinstance(y, Tensor) and y.ndim == 4)
    if batch.shape[0] == 1:
        out = restore(y, operator, noise=models[0], seed=seeds, **kwargs)
    else:
        kwargs["prior"] = checked_prior(kwargs["prior"], batch)[0]  # a folder is loaded once for every image
        out = _joined([restore(batch[b:b + 1], operator.select_images(torch.tensor([b])), noise=models[b],
                               seed=[seeds[b]], **kwargs) for b in range(batch.shape[0])], back)
    sigmas = [m.gaussian_sigma for m in models]
    out.noise_sigma = None if sigmas[0] is None else sigmas[0] if one_image else sigmas
    out.noise = models[0] if one_image else models
    return out


def _joined(parts: list[Restoration], back: Callable[[Tensor], Any]) -> Restoration:
    """One image's restorations (tensors, (1, C, h, w) each) as the batch's, in the input's container."""
    def joined(field: str) -> Any:
        values = [getattr(r, field) for r in parts]
        return None if values[0] is None else back(torch.cat(values))

    samples = None
    if parts[0].samples is not None:  # (K, 1, C, h, w) each: image-major per sample
        per_sample = [back(torch.cat([r.samples[j] for r in parts])) for j in range(parts[0].samples.shape[0])]
        samples = np.stack(per_sample) if isinstance(per_sample[0], np.ndarray) else torch.stack(per_sample)
    image, kernel = joined("image"), None
    if parts[0].kernel is not None:
        kernel = torch.cat([torch.as_tensor(r.kernel).reshape(-1, *r.kernel.shape[-2:]) for r in parts])
        kernel = kernel.numpy() if isinstance(image, np.ndarray) else kernel
    return Restoration(image, joined("std"), samples, parts[0].nfe, sum(r.seconds for r in parts),
                       parts[0].config, joined("lower"), joined("upper"), None, parts[0].frame, kernel)


def _restore_fitted(y: Any, operator: LinearOperator, batch: Tensor, back: Callable[[Tensor], Any], noise: NoiseModel,
                    seeds: list[int], kwargs: dict[str, Any]) -> Restoration:
    """:func:`restore` with an operator that estimates something of each measurement (a blind blur's
    kernel: :meth:`~nfc_dps.operators.base.LinearOperator.fitted`): each image fitted, then restored."""
    one_image = not (isinstance(y, Tensor) and y.ndim == 4)
    # the fitted operator's own error restored as noise (an estimated kernel is never exact)
    restored_noise = noise.with_model_error(operator.model_error * noise.reference_std()) if operator.model_error else noise
    parts = []
    for b in range(batch.shape[0]):
        t0 = time.perf_counter()
        with tqdm(total=None, desc="kernel", unit="scale", disable=not kwargs["progress"], leave=False) as bar:
            def advance(step: int, steps: int) -> None:
                bar.total = steps
                bar.update(step - bar.n)
            fitted = operator.fitted(batch[b:b + 1], advance)
        part = restore(batch[b:b + 1], fitted, noise=restored_noise, seed=[seeds[b]], **kwargs)
        nfe = part.nfe
        for _ in range(fitted.refinements):  # the kernel again from the restoration, and the restoration again
            fitted = fitted.refined(batch[b:b + 1], part.image)
            part = restore(batch[b:b + 1], fitted, noise=restored_noise, seed=[seeds[b]], **kwargs)
            nfe += part.nfe
        part.nfe, part.seconds = nfe, time.perf_counter() - t0
        part.kernel = fitted.blur_kernel().detach().cpu()
        parts.append(part)
    out = _joined(parts, back)
    if one_image:
        out.kernel = out.kernel[0]
    out.noise_sigma, out.noise = noise.gaussian_sigma, noise
    return out


def _checked_restarts(restarts: Any, num_samples: int) -> int:
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 1:
        raise ValueError(f"restarts must be an int >= 1, got {restarts!r}")
    if restarts > 1 and num_samples > 1:
        raise ValueError(f"restarts={restarts} keeps one chain per image; it does not combine with "
                         f"num_samples={num_samples}")
    return int(restarts)


def _best_fit(samples: Tensor, restarts: int, operator: LinearOperator, y: Tensor, noise: NoiseModel) -> Tensor:
    """Of ``restarts`` chains per image (image-major, clipped to [0, 1]), the one whose A(x) the
    measurement y fits best under the noise model (B, C, H, W)."""
    b = y.shape[0]
    with torch.no_grad():
        fit = torch.stack([noise.nll(y, operator.A(samples[j::restarts].to(y.dtype))) for j in range(restarts)], 1)
    best = fit.argmin(1)
    return samples.view(b, restarts, *samples.shape[1:])[torch.arange(b), best]


def _resolved_config(method: str, preset: str | None, config: Any | None, overrides: dict[str, Any],
                     num_samples: int) -> Any:
    """The sampler config of a run: ``config`` or the named preset, with ``overrides`` checked as
    config files and --set are (num_levels=2.5 is refused naming the key); a deterministic config
    with num_samples > 1 is a ValueError."""
    m = get_method(method)
    if overrides:  # checked against the fields of the preset (or of a preset of config's class)
        named = preset if config is None else next((p for p, c in m.presets.items() if type(c) is type(config)), None)
        overrides = validate_overrides(method, named, overrides, {k: f"restore({k}=...)" for k in overrides})
    cfg = get_config(method, preset, **overrides) if config is None else override_config(method, config, **overrides)
    if num_samples > 1 and cfg.is_deterministic:
        raise ValueError(f"num_samples={num_samples}: this {method} config is deterministic (every sample would be "
                         f"the same); for posterior samples and a std map use preset='fast'")
    return cfg


def _assembled(samples: Tensor | None, stats: "_SampleStats | None", nfe: int, seconds: float, cfg: Any,
               back: Callable[[Tensor], Any], num_samples: int, calibration: Any | None) -> Restoration:
    """The :class:`Restoration` of :func:`_run_chains`' results, in the input's container type."""
    if stats is None:
        return Restoration(back(samples), None, None, nfe, seconds, cfg)
    mean, std = stats.mean.float().clamp(0, 1), stats.std().float()
    stacked = None
    if samples is not None:
        samples = samples.reshape(-1, num_samples, *samples.shape[1:])
        per_sample = [back(samples[:, j]) for j in range(num_samples)]
        stacked = np.stack(per_sample) if isinstance(per_sample[0], np.ndarray) else torch.stack(per_sample)
    lower = upper = None
    if calibration is not None:
        lower, upper = (back(t) for t in calibration.interval(mean, std))
        for b, note in calibration.unfamiliar(mean, std):
            warnings.warn(f"image {b}: {note}", UnfamiliarImageWarning, stacklevel=3)
    return Restoration(back(mean), back(std), stacked, nfe, seconds, cfg, lower, upper)


@dataclass
class _Problem:
    """What every chain restores: the measurement (gray ones replicated to the prior's channels,
    with their noise std scaled), the operator (on a padded canvas where the image size is not a
    multiple of the prior's), the image shape on it and the (h, w) cropped back."""

    batch: Tensor
    operator: LinearOperator
    sigma_y: float
    image_shape: tuple[int, ...]
    hw: tuple[int, int]
    gray: bool

    @classmethod
    def set_up(cls, operator: LinearOperator, batch: Tensor, noise: NoiseModel, prior: Any) -> "_Problem":
        c, pc = batch.shape[1], prior.channels
        # a non-Gaussian noise is restored through its Gaussian approximation: weighted by pixel
        whitened = Measurement(operator, batch, noise, tuple(operator.image_shape(batch.shape))).gaussian()
        operator, batch, sigma_y = whitened.operator, whitened.y, whitened.sigma_y
        # an operator that maps channel to channel gives images of the measurement's channels; one with
        # fixed shapes (FunctionOperator) may measure any number of channels of a pc-channel image
        gray = c != pc and operator.image_shape(batch.shape)[1] != pc
        if gray:
            if c == 1:
                # pc copies of one noisy channel carry its information once: as independent channels
                # each has noise sigma_y * sqrt(pc), which keeps the likelihood of their mean exact
                batch = batch.expand(-1, pc, -1, -1)
                sigma_y = sigma_y * math.sqrt(pc)
            else:
                raise ValueError(f"measurement has {c} channels but the prior models {pc}")
        image_shape = tuple(operator.image_shape(batch.shape))
        if image_shape[1] != pc:
            raise ValueError(f"the operator restores {image_shape[1]}-channel images from this measurement, "
                             f"but the prior models {pc}")
        h, w = image_shape[-2:]
        mult = prior.size_multiple
        if (h % mult or w % mult) and not is_linear(operator):
            raise ValueError(f"the prior restores images whose sides are multiples of {mult}; this {operator.name} "
                             f"measurement is of a {h}x{w} image: crop it to a multiple of {mult}")
        if h % mult or w % mult:  # restore on a padded canvas; the border is filled by the prior
            operator = CroppedOperator(operator, (h, w), (padded_size(h, mult), padded_size(w, mult)))
            image_shape = tuple(operator.image_shape(batch.shape))
        return cls(batch, operator, sigma_y, image_shape, (h, w), gray)


def _run_chains(method, cfg, prior, problem: _Problem, seeds, num_samples, max_batch, keep_samples, input_device,
                callback, progress, measured: tuple[LinearOperator, Tensor]):
    """Run the B * num_samples chains, ``max_batch`` at a time (:func:`~nfc_dps.samplers.iter_chains`):
    (the samples, made consistent with the measurement (``measured``: the operator and the
    measurement as given, :meth:`~nfc_dps.operators.base.LinearOperator.consistent`) and clipped to
    [0, 1], (B * K, C, H, W) on the input's device, or None when only statistics are kept; their
    running statistics (None for one sample); network calls per chain)."""
    b = problem.batch.shape[0]
    chains = b * num_samples
    chunks = 1 if max_batch is None else -(-chains // min(int(max_batch), chains))
    h, w = problem.hw
    bar = None
    if progress:
        bar = tqdm(total=cfg.steps * chunks if cfg.steps else None, desc=method, unit="step", leave=False)

    def step_callback(info: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(1)
        if callback is not None:
            callback(info)

    measurement = Measurement(problem.operator, problem.batch, problem.sigma_y, (b, *problem.image_shape[1:]))
    parts, nfe = [], None
    stats = _SampleStats(b, num_samples) if num_samples > 1 else None
    try:
        for part in iter_chains(method, prior, measurement, cfg, seeds, num_samples, max_batch,
                                step_callback if (bar is not None or callback is not None) else None):
            nfe = part.nfe if nfe is None else nfe
            x = part.x.mean(1, keepdim=True) if problem.gray else part.x
            x = x[..., :h, :w]
            operator, y = measured
            x = operator.consistent(x, y[torch.arange(part.start, part.start + len(x), device=y.device) // num_samples])
            x = x.to(input_device)
            if stats is not None:
                stats.add(x, part.start)
            if stats is None or keep_samples:
                parts.append(x.clamp(0, 1))
            del x, part
    finally:
        if bar is not None:
            bar.close()
    samples = (parts[0] if len(parts) == 1 else torch.cat(parts)) if parts else None
    return samples, stats, nfe

"""The Python API: ``restore`` a measurement with a diffusion prior.

    >>> import nfc_dps
    >>> op = nfc_dps.build_operator("deblur_gaussian", image_size=(64, 64))
    >>> y = op.measure(x, sigma_y=0.025, generator=torch.Generator().manual_seed(0))
    >>> out = nfc_dps.restore(y, op, sigma_y=0.025)          # embedded default prior
    >>> out.image                                             # (B, C, 64, 64) in [0, 1]

Units: images and measurements in [0, 1]; ``sigma_y`` is the measurement noise std in [0, 1]
pixel units (DPS/DAPS/NFC's "0.05" in [-1, 1] units is 0.025 here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .operators.base import LinearOperator
from .operators.padding import CroppedOperator, padded_size
from .priors.base import Prior
from .samplers import counting, get_config, get_method


@dataclass
class Restoration:
    """Result of :func:`restore`, in the input's container type (numpy or torch), [0, 1] units.

    image: the restoration (the mean of the samples when num_samples > 1), clipped to [0, 1].
    std: per-pixel standard deviation over the samples (None for one sample): an uncertainty map.
    samples: (K, ...) the individual samples, clipped (None for one sample).
    nfe: network evaluations per sample trajectory. seconds: wall time. config: the sampler config.
    """

    image: Any
    std: Any | None
    samples: Any | None
    nfe: int
    seconds: float
    config: Any


def _as_batch(y: Tensor | np.ndarray) -> tuple[Tensor, Callable[[Tensor], Any]]:
    """Accept (B,C,h,w)/(C,h,w) tensors or (h,w)/(h,w,C) numpy arrays; return a batch and an inverse."""
    if isinstance(y, np.ndarray):
        if y.ndim not in (2, 3):
            raise ValueError(f"numpy measurement must be (h, w) or (h, w, C), got shape {y.shape}")
        gray = y.ndim == 2
        t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
        t = t[None, None] if gray else t.permute(2, 0, 1)[None]

        def back(x: Tensor) -> np.ndarray:
            a = x[0].permute(1, 2, 0).cpu().numpy()
            return a[..., 0] if gray else a

        return t, back
    if not isinstance(y, Tensor):
        raise TypeError(f"measurement must be a torch.Tensor or numpy array, got {type(y).__name__}")
    if y.ndim == 3:
        return y[None], lambda x: x[0]
    if y.ndim == 4:
        return y, lambda x: x
    raise ValueError(f"measurement tensor must be (B, C, h, w) or (C, h, w), got shape {tuple(y.shape)}")


def image_generators(seeds: Sequence[int], num_samples: int, device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per (image, sample), seeded from (seed_b, j): independent of batch layout.

    Order: image-major, i.e. index b * num_samples + j.
    """
    gens = []
    for s in seeds:
        for j in range(num_samples):
            state = np.random.SeedSequence([int(s), j]).generate_state(1, dtype=np.uint64)[0]
            gens.append(torch.Generator(device=device).manual_seed(int(state)))
    return gens


def restore(
    y: Tensor | np.ndarray,
    operator: LinearOperator,
    prior: Prior | None = None,
    method: str = "nfc",
    preset: str | None = None,
    sigma_y: float = 0.025,
    seed: int | Sequence[int] = 0,
    num_samples: int = 1,
    callback: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    config: Any | None = None,
    **overrides: Any,
) -> Restoration:
    """Restore measurement(s) ``y`` of ``operator`` with a diffusion ``prior``.

    Args:
        y: measurement in [0, 1]: tensor (B, C, h, w) or (C, h, w), or numpy (h, w[, C]).
        operator: the forward operator (see :mod:`nfc_dps.operators`).
        prior: a :class:`~nfc_dps.priors.base.Prior`; None loads the embedded default prior.
        method: "nfc", "daps", "dps", "diffpir", "ddnm", "ddrm" or "dpir".
        preset: a named preset of the method; None = its default: for NFC "deterministic" (the
            best estimate per network call: 8 NFE, no random draw), for the others "fast".
            Posterior samples with a calibrated ``std``: NFC's "fast" (100 NFE) or "paper" (as published).
        sigma_y: measurement noise std in [0, 1] pixel units.
        seed: an int (image b uses seed + b) or one seed per image: results do not depend on
            batch size or on which other images share the batch.
        num_samples: posterior samples per image; >1 returns their mean and per-pixel std.
        callback: called after every sampler step with a dict of intermediates (model units).
        progress: show a tqdm bar over the sampler's steps.
        config: a full sampler config (overrides ``preset``); ``**overrides`` replace fields.
    Gray measurements with an RGB prior are replicated to RGB and averaged back. Images whose
    size is not a multiple of ``prior.size_multiple`` are restored on a padded canvas (the border
    is unmeasured, filled by the prior) and cropped back.
    """
    from .priors.default import load_prior

    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if not sigma_y >= 0:
        raise ValueError(f"sigma_y must be >= 0 ([0, 1] pixel units), got {sigma_y}")
    batch, back = _as_batch(y)
    if not torch.isfinite(batch).all():
        raise ValueError("measurement contains NaN or Inf")
    if prior is None:
        prior = load_prior(device=batch.device)
    m = get_method(method)
    cfg = config if config is not None else get_config(method, preset, **overrides)
    if num_samples > 1 and getattr(cfg, "is_deterministic", False):
        raise ValueError(f"num_samples={num_samples}: this {method} config is deterministic (every sample would be "
                         f"the same); for posterior samples and a std map use preset='fast'")

    b, c = batch.shape[:2]
    if isinstance(seed, int):
        seeds = [seed + i for i in range(b)]
    else:
        seeds = list(seed)
        if len(seeds) != b:
            raise ValueError(f"got {len(seeds)} seeds for {b} images")
    pc = prior.channels
    if c != pc:
        if c == 1:
            batch = batch.expand(-1, pc, -1, -1)
        else:
            raise ValueError(f"measurement has {c} channels but the prior models {pc}")
    image_shape = tuple(operator.image_shape(batch.shape))
    h, w = image_shape[-2:]
    mult = prior.size_multiple
    if h % mult or w % mult:  # restore on a padded canvas; the border is filled by the prior
        operator = CroppedOperator(operator, (h, w), (padded_size(h, mult), padded_size(w, mult)))
        image_shape = tuple(operator.image_shape(batch.shape))
    full_shape = (b * num_samples, *image_shape[1:])
    y_rep = batch.repeat_interleave(num_samples, dim=0)
    gens = image_generators(seeds, num_samples, device=batch.device)

    counted = counting(prior)
    bar = None
    total = getattr(cfg, "num_levels", None) or getattr(cfg, "num_steps", None)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=method, unit="step", leave=False)

    def step_callback(info: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(1)
        if callback is not None:
            callback(info)

    t0 = time.perf_counter()
    try:
        x = m.sample(counted, operator, y_rep, sigma_y, full_shape, cfg, gens, step_callback)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    if c != pc:
        x = x.mean(1, keepdim=True)
    if not torch.isfinite(x).all():
        raise FloatingPointError(f"{method} produced NaN/Inf; try a smaller step size or another preset")
    x = x[..., :h, :w].reshape(b, num_samples, x.shape[1], h, w)
    samples = x.clamp(0, 1)
    if num_samples == 1:
        return Restoration(back(samples[:, 0]), None, None, counted.nfe, seconds, cfg)
    mean = x.mean(1).clamp(0, 1)
    std = x.std(1)
    return Restoration(back(mean), back(std), [back(samples[:, j]) for j in range(num_samples)],
                       counted.nfe, seconds, cfg)

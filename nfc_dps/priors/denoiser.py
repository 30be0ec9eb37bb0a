"""Any Gaussian denoiser as a prior: :class:`DenoiserPrior`.

Denoisers such as DRUNet, FFDNet, SCUNet or DnCNN (and deepinv's denoisers) take images in
[0, 1] and a noise std in the same [0, 1] units. Priors work on [-1, 1] data with VE/EDM sigma
(:mod:`nfc_dps.priors.base`): x_m = 2 x - 1, so sigma_m = 2 sigma. The wrapper converts once,
here, and declares itself a denoiser only (``Prior.denoiser_only``): samplers whose schedule
would call it above its ``sigma_max`` refuse it before they start (docs/bring_your_own.md).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

from torch import Tensor

from .base import Prior, network_grad

#: the largest ``sigma_max`` ([0, 1] units) of a denoiser-only prior: a noise std beyond the image
#: range is a diffusion model's (``denoiser_only=False``) or a value in 0-255 units
DENOISER_SIGMA_LIMIT = 1.0


def _as_number(value: object) -> object:
    """A one-value tensor (a 0-d ``sigma_max``) as a Python float; anything else as given."""
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point():
        return float(value.detach().reshape(()))
    return value


class DenoiserPrior(Prior):
    """A Gaussian denoiser ``fn(x, sigma) -> x_hat`` as a prior.

    Args:
        fn: (B, C, H, W) noisy image in [0, 1] units (it may leave [0, 1] by the noise), (B,)
            noise std in [0, 1] units -> (B, C, H, W) estimate of the clean image in [0, 1]
            units. An ``nn.Module`` becomes a submodule (``.to(device)`` moves it).
        sigma_max: the largest noise std ``fn`` handles, [0, 1] units (DRUNet: 50/255; DPIR's
            first level is 49/255): a number or a one-value tensor, at most 1 for a denoiser
            (``denoiser_only``).
        channels: image channels of ``fn``.
        sigma_min: ``fn`` is never called below this std ([0, 1] units; lower levels are
            raised to it); 0 = no floor.
        size_multiple: H and W must be multiples of this (DRUNet: 8); ``restore`` pads to it.
        denoiser_only: True (the default): ``fn`` has no diffusion noise levels; False when it
            is a diffusion model's denoiser whose ``sigma_max`` drowns the image.

    ``sigma_min`` / ``sigma_max`` are stored in model units (twice the arguments), as every prior's.
    ``fn`` runs under ``torch.no_grad()`` unless autograd is on and its input requires grad (DPS
    differentiates through it): a sampler's call builds no graph.
    """

    def __init__(self, fn: Callable[[Tensor, Tensor], Tensor], sigma_max: float, channels: int = 3,
                 sigma_min: float = 0.0, size_multiple: int = 1, denoiser_only: bool = True) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"fn must be callable as fn(x, sigma), got {type(fn).__name__}")
        sigma_max, sigma_min = _as_number(sigma_max), _as_number(sigma_min)
        for name, value in (("sigma_max", sigma_max), ("sigma_min", sigma_min)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number ([0, 1] units: 49/255 = 0.192), got {value!r}")
        if not 0 <= sigma_min < sigma_max:
            raise ValueError(f"need 0 <= sigma_min < sigma_max ([0, 1] units), got sigma_min={sigma_min!r}, "
                             f"sigma_max={sigma_max!r}")
        if denoiser_only is True and sigma_max > DENOISER_SIGMA_LIMIT:
            raise ValueError(f"sigma_max must be in (0, {DENOISER_SIGMA_LIMIT:g}] for a denoiser ([0, 1] units: "
                             f"50/255 = 0.196), got {sigma_max:g} (in 0-255 units? divide by 255; a diffusion "
                             f"model's denoiser, whose noise drowns the image, passes denoiser_only=False)")
        for name, value in (("channels", channels), ("size_multiple", size_multiple)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(denoiser_only, bool):
            raise ValueError(f"denoiser_only must be True or False, got {denoiser_only!r}")
        self.fn = fn
        self.channels, self.size_multiple, self.denoiser_only = channels, size_multiple, denoiser_only
        self.sigma_min, self.sigma_max = 2.0 * float(sigma_min), 2.0 * float(sigma_max)
        self._floor = float(sigma_min)  # [0, 1] units

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        """(B, C, H, W) noisy x in [-1, 1] units, (B,) sigma in model units -> (B, C, H, W)
        estimate in [-1, 1] units: ``2 fn((x + 1) / 2, sigma / 2) - 1``."""
        s = sigma.to(x.dtype) / 2
        if self._floor > 0:
            s = s.clamp_min(self._floor)
        with network_grad(x):  # no graph unless the caller differentiates with respect to x (DPS)
            out = self.fn((x + 1) / 2, s)
        if tuple(out.shape) != tuple(x.shape):
            raise ValueError(f"the denoiser returned shape {tuple(out.shape)} for an input of shape {tuple(x.shape)}")
        return 2 * out - 1

    def extra_repr(self) -> str:
        return (f"sigma in [{self.sigma_min / 2:g}, {self.sigma_max / 2:g}] ([0, 1] units), channels={self.channels}, "
                f"size_multiple={self.size_multiple}, denoiser_only={self.denoiser_only}")

"""Measurement noise models: what a measurement's noise is, as an object.

A noise model draws a seeded noisy measurement from a clean one and gives what the samplers'
data steps need. Everything is in [0, 1] image units. ``GaussianNoise(sigma)`` is the model every
sampler takes; a bare float wherever a noise model is asked for means ``GaussianNoise(float)``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .operators.base import Generators, noise_sigma_problem, randn_per_image


@dataclass(frozen=True)
class GaussianNoise:
    """y = A(x) + sigma n, n ~ N(0, I); ``sigma`` in [0, 1] pixel units (0.025 is 6.4/255)."""

    sigma: float

    def __post_init__(self) -> None:
        try:
            value = float(self.sigma)
        except (TypeError, ValueError) as e:
            raise TypeError(f"GaussianNoise: sigma must be a number ([0, 1] pixel units), got "
                            f"{type(self.sigma).__name__}") from e
        why = noise_sigma_problem(value)
        if why:
            raise ValueError(f"GaussianNoise: sigma {why}")
        object.__setattr__(self, "sigma", value)

    #: the name CLI specs and run records use (``gaussian:0.025``)
    kind = "gaussian"

    def sample(self, clean: Tensor, generators: Generators = None) -> Tensor:
        """clean (B, ...) plus seeded noise (image b from ``generators[b]``, as ``randn_per_image``)."""
        if self.sigma == 0:
            return clean.clone()
        return clean + self.sigma * randn_per_image(clean.shape, generators, clean.dtype, clean.device)

    def variance(self, clean: Tensor) -> Tensor:
        """Per-pixel noise variance, shaped like ``clean``."""
        return torch.full_like(clean, self.sigma**2)

    def nll(self, y: Tensor, clean: Tensor) -> Tensor:
        """Negative log-likelihood of y given the clean measurement, per image (B,), up to a constant."""
        s2 = max(self.sigma, 1e-12) ** 2
        return (y - clean).pow(2).flatten(1).sum(1) / (2 * s2)

    def nll_grad(self, y: Tensor, clean: Tensor) -> Tensor:
        """d nll / d clean, shaped like ``clean``."""
        return (clean - y) / max(self.sigma, 1e-12) ** 2

    def record(self) -> dict[str, Any]:
        """What run records and calibration files store."""
        return {"kind": self.kind, "sigma": self.sigma}

    def __str__(self) -> str:
        return f"{self.kind}:{self.sigma:g}"


def as_noise(noise: Any) -> GaussianNoise:
    """``noise`` as a noise model: a model is returned as is, a number is Gaussian of that std."""
    if isinstance(noise, GaussianNoise):
        return noise
    if isinstance(noise, Tensor) and noise.numel() == 1:
        noise = noise.item()
    if isinstance(noise, numbers.Real) and not isinstance(noise, bool):
        return GaussianNoise(float(noise))
    raise TypeError(f"noise must be a noise model (e.g. nfc_dps.noise.GaussianNoise(0.025)) or a Gaussian std in "
                    f"[0, 1] pixel units, got {type(noise).__name__}")


__all__ = ["GaussianNoise", "as_noise"]

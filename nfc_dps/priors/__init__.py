"""Priors: denoisers D(x, sigma) -> x0_hat on [-1, 1] data."""

from .base import EDMDenoiser, EpsilonDenoiser, Prior, TiledPrior
from .diffusers_prior import load_diffusers_prior

__all__ = ["Prior", "EDMDenoiser", "EpsilonDenoiser", "TiledPrior", "load_diffusers_prior"]
from .default import default_prior_path, load_prior  # noqa: E402

__all__ += ["default_prior_path", "load_prior"]

"""Priors: denoisers D(x, sigma) -> x0_hat on [-1, 1] data."""

from .adm import ADM_PRESETS, adm_unet_config
from .adm_convert import convert_adm_checkpoint, convert_adm_state_dict
from .base import EDMDenoiser, EpsilonDenoiser, Prior, PriorWrapper, TiledPrior
from .denoiser import DenoiserPrior
from .diffusers_prior import load_diffusers_prior
from .gaussian import GaussianSpectralPrior, circulant_transfer
from .mixture import GaussianMixturePrior, MixturePosterior

__all__ = [
    "Prior",
    "PriorWrapper",
    "EDMDenoiser",
    "EpsilonDenoiser",
    "TiledPrior",
    "DenoiserPrior",
    "load_diffusers_prior",
    "GaussianSpectralPrior",
    "GaussianMixturePrior",
    "MixturePosterior",
    "circulant_transfer",
    "ADM_PRESETS",
    "adm_unet_config",
    "convert_adm_state_dict",
    "convert_adm_checkpoint",
]

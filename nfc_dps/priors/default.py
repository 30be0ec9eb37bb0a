"""The embedded default prior (trained by scripts/train_prior.py, shipped in assets/default_prior)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .base import Prior
from .diffusers_prior import load_diffusers_prior

#: environment variable that points at another default prior folder
ENV_VAR = "NFC_DPS_DEFAULT_PRIOR"


def default_prior_path() -> Path:
    """Folder of the embedded prior: $NFC_DPS_DEFAULT_PRIOR, else <repo>/assets/default_prior."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "assets" / "default_prior"


def load_prior(path: str | Path | None = None, device: str | torch.device = "cpu", precision: str = "auto") -> Prior:
    """Load a prior from a local diffusers folder, or the embedded default prior when ``path`` is None.

    precision: the network's compute precision, "auto" | "float32" | "bfloat16" (see
    :func:`~nfc_dps.priors.diffusers_prior.load_diffusers_prior`)."""
    if path is None:
        path = default_prior_path()
        if not path.is_dir():
            raise FileNotFoundError(
                f"embedded default prior not found at {path}; install nfc_dps from a source checkout "
                f"(pip install -e .) or set {ENV_VAR} to a prior folder"
            )
    return load_diffusers_prior(path, device=device, precision=precision)

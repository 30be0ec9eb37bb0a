"""The embedded default prior (trained by ``nfc-dps train-prior``, kept in the repository's
assets/default_prior and installed with the package as nfc_dps/_assets/default_prior)."""

from __future__ import annotations

import datetime
import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .base import Prior
from .diffusers_prior import load_diffusers_prior

#: environment variable that points at another default prior folder
ENV_VAR = "NFC_DPS_DEFAULT_PRIOR"
#: the package that carries the embedded prior as package data (the repository's assets/ folder)
ASSETS_PACKAGE = "nfc_dps._assets"
#: the embedded prior's folder inside ASSETS_PACKAGE
PRIOR_FOLDER = "default_prior"


def default_prior_path() -> Path:
    """Folder of the embedded prior: $NFC_DPS_DEFAULT_PRIOR, else the ``default_prior`` folder of the
    package data ``nfc_dps._assets``, found through :mod:`importlib.resources` (in an editable install
    the repository's assets/default_prior, in a wheel install site-packages/nfc_dps/_assets/default_prior).

    Raises FileNotFoundError when the package data is not installed (an editable install made
    before nfc_dps._assets existed: rerun ``pip install -e .``) or is not a folder on disk (a zipped
    install); the folder itself may be missing, which :func:`load_prior` reports."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    try:
        folder = resources.files(ASSETS_PACKAGE) / PRIOR_FOLDER
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            f"the embedded default prior's package {ASSETS_PACKAGE} is not installed ({e}); reinstall nfc_dps "
            f"(pip install -e . in a checkout, or pip install the wheel) or set {ENV_VAR} to a prior folder"
        ) from e
    if not isinstance(folder, Path):
        raise FileNotFoundError(
            f"the embedded default prior ({folder}) is not a folder on disk (nfc_dps installed as a zip?); "
            f"install nfc_dps unzipped or set {ENV_VAR} to a prior folder"
        )
    return folder


def load_prior(path: str | Path | None = None, device: str | torch.device = "cpu", precision: str = "auto") -> Prior:
    """Load a prior from a local diffusers folder, or the embedded default prior when ``path`` is None
    or "" (as :func:`prior_identity` reads them).

    precision: the network's compute precision, "auto" | "float32" | "bfloat16" (see
    :func:`~nfc_dps.priors.diffusers_prior.load_diffusers_prior`)."""
    if not path:
        path = default_prior_path()
        if not path.is_dir() and os.environ.get(ENV_VAR):
            raise FileNotFoundError(f"${ENV_VAR}={os.environ[ENV_VAR]}: no such prior folder (unset it for the "
                                    f"embedded default prior)")
        if not path.is_dir():
            raise FileNotFoundError(
                f"embedded default prior not found at {path}; reinstall nfc_dps (its wheel carries the prior "
                f"as package data) or set {ENV_VAR} to a prior folder"
            )
    return load_diffusers_prior(path, device=device, precision=precision)


def prior_identity(path: str | Path | None, contents: bool = False) -> dict[str, Any]:
    """What identifies the prior folder ``path`` (None or "": the embedded default), without loading it.

    Keys: "path" (the folder as given, or the default's), "resolved" (absolute), "embedded_default"
    (no path given and $NFC_DPS_DEFAULT_PRIOR unset: the shipped weights), "files" ({path relative to the folder:
    [size in bytes, mtime in ns]},
    sorted; empty when the folder is missing). With ``contents`` and at least one file, also
    "sha256" (16 hex digits over the names and bytes of its .safetensors / .bin / .json files,
    which reads them all) and "modified" (the newest file's local time, ISO 8601 to the second).
    """
    folder = Path(path) if path else default_prior_path()
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    stats = [p.stat() for p in files]
    embedded = not path and not os.environ.get(ENV_VAR)  # the shipped weights, not a folder the variable names
    info: dict[str, Any] = {"path": str(folder), "resolved": str(folder.resolve()), "embedded_default": embedded,
                            "files": {str(p.relative_to(folder)): [st.st_size, st.st_mtime_ns]
                                      for p, st in zip(files, stats)}}
    if contents and files:
        h = hashlib.sha256()
        for p in files:
            if p.suffix in (".safetensors", ".bin", ".json"):
                h.update(p.name.encode())
                h.update(p.read_bytes())
        info["sha256"] = h.hexdigest()[:16]
        newest = max(st.st_mtime for st in stats)
        info["modified"] = datetime.datetime.fromtimestamp(newest).isoformat(timespec="seconds")
    return info

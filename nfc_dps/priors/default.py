"""The embedded default prior (trained by scripts/train_prior.py, shipped in assets/default_prior)."""

from __future__ import annotations

import datetime
import hashlib
import os
from pathlib import Path
from typing import Any

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


def prior_identity(path: str | Path | None, contents: bool = False) -> dict[str, Any]:
    """What identifies the prior folder ``path`` (None or "": the embedded default), without loading it.

    Keys: "path" (the folder as given, or the default's), "resolved" (absolute), "embedded_default"
    (no path given and $NFC_DPS_DEFAULT_PRIOR unset: the shipped weights), "files" ({path relative to the folder: [size in bytes, mtime in ns]},
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

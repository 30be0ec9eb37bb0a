"""nfc_dps: image restoration with diffusion priors and noise-frequency continuation (NFC).

Public API (images in [0, 1], sigma_y in [0, 1] pixel units):

* :func:`restore` - restore measurement(s) with a sampler ("nfc", "daps", "dps", "diffpir", "ddnm",
  "ddrm", "dpir");
* :func:`load_prior` - a local diffusers folder, or the embedded default prior;
* :func:`build_operator` - a forward operator by task name.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"  # the one source: pyproject.toml reads it (dynamic version), `nfc-dps --version` prints it

_LAZY = {
    "restore": ("nfc_dps.api", "restore"),
    "Restoration": ("nfc_dps.api", "Restoration"),
    "load_prior": ("nfc_dps.priors.default", "load_prior"),
    "build_operator": ("nfc_dps.operators", "build_operator"),
}


def __getattr__(name: str) -> Any:  # lazy imports keep `import nfc_dps` light
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'nfc_dps' has no attribute {name!r}")


__all__ = ["restore", "Restoration", "load_prior", "build_operator", "__version__"]

"""The record a run writes next to its outputs: :func:`resolved_config` (every setting, reloadable
with ``--config``) and :func:`package_versions`."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path
from typing import Any, Mapping

from .config import KIND_RUN, PER_IMAGE_SEED, UNITS_NOTE, ResolvedSampler, TaskConfig


def package_versions() -> dict[str, str]:
    """Versions of the packages a result depends on (torch, diffusers, numpy, nfc_dps, ...)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("nfc_dps", "torch", "diffusers", "numpy", "scipy", "scikit-image", "pillow"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        import nfc_dps

        out["nfc_dps"] = getattr(nfc_dps, "__version__", out["nfc_dps"])
    except ImportError:  # pragma: no cover
        pass
    return out


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def resolved_config(task: TaskConfig | None, sampler: ResolvedSampler, seed: int, num_samples: int = 1,
                    prior: str | None = None, **extra: Any) -> dict[str, Any]:
    """The complete, reloadable record of a run: every task parameter, every sampler field (the
    preset expanded), seeds, units and package versions. ``--config`` accepts it back.
    ``per_image_seed`` (in ``extra``) replaces the text of :data:`PER_IMAGE_SEED`."""
    record: dict[str, Any] = {"kind": KIND_RUN}
    if task is not None:
        record["task"] = task.as_dict()
    record["sampler"] = _plain(sampler.as_dict())
    record["seed"] = int(seed)
    record["per_image_seed"] = PER_IMAGE_SEED
    record["num_samples"] = int(num_samples)
    if prior is not None:
        record["prior"] = prior
    record["units"] = UNITS_NOTE
    record.update(_plain(extra))
    record["versions"] = package_versions()
    return record

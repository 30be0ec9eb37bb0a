"""The resumable state of a ``train-prior`` work folder: reading, writing, and the config check.

``WORKDIR/state.pt`` (a torch pickle, written atomically: a temporary file, fsync, ``os.replace``)
holds ``model``, ``ema``, ``opt`` (Adam), ``step``, ``rng`` (the training ``torch.Generator``'s
state: crops, sigmas, noise; rank 0's under torchrun), ``rng_ranks`` (every rank's) and ``world``
(the number of processes), ``torch_rng`` (torch's global CPU RNG), ``args`` (the settings),
``config`` (the fingerprint below), ``seconds`` and ``crops`` (totals so far) and ``format``.
A state written by the earlier ``scripts/train_prior.py`` (no ``config``; ``rng`` a numpy
bit-generator state) is converted on load: its network is the default prior's design, its data
the built-in set, and its crop stream is reseeded from (seed, step).

The fingerprint is what must not change within a work folder: the network design (arch,
widths, layers, channels), the crop size and the data (source, procedural fraction and generator,
scales, held-out fraction). A mismatch is a :class:`~nfc_dps.training.data.TrainingError` naming the
differing keys; learning rate, batch, EMA decay and budgets may change between runs.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from .. import io as nio
from ..io.files import weights_only_refusal
from ..overrides import flatten
from ..priors.archs import DEFAULT_ARCH, DEFAULT_LAYERS, DEFAULT_WIDTHS
from .data import BUILTIN, BUILTIN_DEAD_LEAVES, DEFAULT_SCALES, TrainingError
from .leaves import DEFAULT_SYNTHETIC

if TYPE_CHECKING:
    from .config import TrainConfig

STATE_NAME = "state.pt"
STATE_FORMAT = 2
REQUIRED_KEYS = ("model", "ema", "opt", "step")
#: The only classes a state may hold beyond tensors and plain values: the Path objects of the earlier
#: format's settings (rebuilt from strings; nothing else is ever unpickled).
SAFE_STATE_GLOBALS = (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)


def fingerprint(arch: str, widths, layers: int, channels: int, crop: int, source: str, dead_leaves: float,
                scales, holdout: float | None, synthetic: str = DEFAULT_SYNTHETIC) -> dict:
    """The settings a work folder is bound to (JSON-able; see the module docstring). ``synthetic``
    is recorded only when it is not the flat dead leaves, so the work folders written before it
    existed keep their fingerprint."""
    data: dict[str, Any] = {"source": source, "dead_leaves": float(dead_leaves), "scales": [float(s) for s in scales]}
    if synthetic != DEFAULT_SYNTHETIC:
        data["synthetic"] = synthetic
    if source != BUILTIN:
        data["holdout"] = float(holdout or 0.0)
    return {"arch": arch, "widths": [int(w) for w in widths], "layers": int(layers), "channels": int(channels),
            "crop": int(crop), "data": data}


def legacy_fingerprint(args: Any) -> dict:
    """The fingerprint of a state written by the earlier scripts/train_prior.py (fixed design, built-in data)."""
    args = vars(args) if hasattr(args, "__dict__") else dict(args or {})
    return fingerprint(DEFAULT_ARCH, DEFAULT_WIDTHS, DEFAULT_LAYERS, 3, int(args.get("crop", 48)), BUILTIN,
                       BUILTIN_DEAD_LEAVES, DEFAULT_SCALES, None)


def differences(saved: dict, wanted: dict) -> list[str]:
    """'key: X in the work folder, Y now' for every differing (dotted) fingerprint key."""
    a, b = flatten(saved), flatten(wanted)
    return [f"{k}: {a.get(k, '(absent)')!r} in the work folder, {b.get(k, '(absent)')!r} now"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_fingerprint(workdir: Path, saved: dict, wanted: dict) -> None:
    """A TrainingError naming every differing key when ``wanted`` is not the work folder's config."""
    diff = differences(saved, wanted)
    if diff:
        raise TrainingError(f"--workdir {workdir} was written by another configuration (" + "; ".join(diff)
                            + "); use the same settings to resume, or another --workdir")


def read_state(path: Path, device: torch.device | str = "cpu") -> dict:
    """The state at ``path``, converted to the current format (``config`` always present).

    Only torch's weights-only unpickler reads it, with :data:`SAFE_STATE_GLOBALS` (the Path objects
    of the earlier format's settings) allowed: a file that needs any other Python object is refused,
    naming it, and nothing in it runs.
    """
    try:
        with torch.serialization.safe_globals(list(SAFE_STATE_GLOBALS)):
            st = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise TrainingError(f"{path}: refused: reading it needs Python objects beyond tensors, numbers and "
                            f"strings ({weights_only_refusal(e)}); "
                            f"nfc-dps never unpickles more than weights. Delete it to start over") from e
    except Exception as e:  # noqa: BLE001 - a torn or foreign file fails in many ways; re-raised naming it
        raise TrainingError(f"{path}: cannot read the training state ({type(e).__name__}: {e}); "
                            f"delete it to start over") from e
    if not isinstance(st, dict) or any(k not in st for k in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(st, dict) or k not in st]
        raise TrainingError(f"{path}: not a train-prior state (missing keys {missing})")
    if "config" not in st:
        st["config"] = legacy_fingerprint(st.get("args"))
        st["legacy"] = True
    if not isinstance(st.get("rng"), torch.Tensor):
        st["rng"] = None  # numpy's state of the earlier script: the crop stream is reseeded
    return st


def write_state(path: Path, state: dict) -> None:
    """Atomically write ``state`` (tensors, numbers, strings, lists and dicts only) to ``path``."""
    buf = io.BytesIO()
    torch.save({**state, "format": STATE_FORMAT}, buf)
    try:
        nio.atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        raise TrainingError(f"cannot write the training state {path}: {e.strerror or e}") from e


def resume_seed(cfg: TrainConfig, state: dict, workdir: Path, warn: Callable[[str], None]) -> int:
    """The seed of a resumed run: the work folder's own (it fixes the dead-leaves images, while the
    crop stream continues from the saved generator); another value given is refused. ``init_from``
    only starts a new work folder, so it is ignored with a warning."""
    args = state.get("args")
    if state.get("legacy") or not isinstance(args, dict):  # the earlier script's state: its crops are reseeded
        return 0 if cfg.seed is None else cfg.seed
    saved = 0 if args.get("seed") is None else int(args["seed"])
    if cfg.seed is not None and cfg.seed != saved:
        raise TrainingError(f"--workdir {workdir} was trained with --seed {saved}, this run asks for {cfg.seed}; "
                            f"leave --seed out (or give {saved}) to resume, or use another --workdir")
    if cfg.init_from:
        warn(f"--init-from {cfg.init_from} is ignored: {workdir} resumes its own weights at step {int(state['step'])}")
    return saved


def stream_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s crop stream from ``step`` on, in a group of several processes."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0] >> 1)


def resume_stream(gen: torch.Generator, state: dict, step: int, seed: int, device_type: str, dist: Any,
                  warn: Callable[[str], None]) -> None:
    """This rank's crop stream from a saved state: its own saved stream when the state was written by
    as many processes on the same device type, else reseeded from (seed, step, rank)."""
    world, rank = dist.world, dist.rank
    saved_world = int(state.get("world", 1))
    streams = state.get("rng_ranks") if saved_world > 1 else [state["rng"]]
    same_device = state.get("rng_device", device_type) == device_type
    if saved_world == world and same_device and isinstance(streams, list) and len(streams) == world \
            and all(isinstance(t, torch.Tensor) for t in streams):
        gen.set_state(streams[rank].cpu())
        return
    if not same_device and state["rng"] is not None:
        warn(f"the work folder was trained on {state['rng_device']}, this run is on {device_type}: "
             f"the crop streams are reseeded from (seed, step{', rank' if world > 1 else ''}), so the run "
             f"will not equal one on a single device")
    elif saved_world != world:
        warn(f"the work folder was trained by {saved_world} process(es), this run has {world}: the crop "
             f"streams are reseeded from (seed, step, rank), so the run will not equal one of {saved_world}")
    gen.manual_seed(seed * 1_000_003 + step if world == 1 else stream_seed(seed, step, rank))

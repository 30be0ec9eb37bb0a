"""The settings of a training run (:class:`TrainConfig`), their checks (values, the folders apart),
the network fields a resumed or warm-started run takes from its state or its initial prior, the
compute precision ``auto`` stands for, the learning-rate schedule and what a run returns
(:class:`TrainResult`)."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..locking import FolderBusy, file_lock, folder_lock
from ..priors.archs import ARCHS, DEFAULT_ARCH, DEFAULT_LAYERS, DEFAULT_WIDTHS
from ..priors.diffusers_prior import native_bfloat16
from .data import DEFAULT_SCALES, TrainingError
from .export import EVAL_SIGMAS
from .leaves import SYNTHETIC


@dataclass
class TrainConfig:
    """Settings of :func:`train_prior`. None = taken from the work folder's state when resuming,
    else from ``init_from``, else the default (arch "unet", widths (48, 96, 192), 1 layer, crop 48,
    channels from the data: 1 when every image is gray, else 3)."""

    workdir: Path
    images: Path | None = None  # a folder (recursive); None: the built-in package photos
    export: Path | None = None  # prior folder written (and evaluated) at every save
    steps: int | None = None  # stop at this total step count
    minutes: float | None = None  # stop after this much time in this run (see clock)
    clock: str = "wall"  # "wall", or "cpu": minutes of this process's CPU time (fair on a shared machine)
    arch: str | None = None
    widths: tuple[int, ...] | None = None
    layers: int | None = None
    channels: int | None = None
    crop: int | None = None
    batch: int = 32
    lr: float = 2e-4
    warmup: int = 0  # steps of linear learning-rate warm-up
    cooldown: int = 0  # the last N steps before `steps` decay the learning rate linearly to 0
    ema: float = 0.999
    p_mean: float = -1.2
    p_std: float = 1.2
    save_every: int = 200
    log_every: int = 50
    seed: int | None = None  # None: 0 for a new work folder, the work folder's own when resuming
    device: str = "cpu"
    precision: str = "auto"  # auto: bfloat16 autocast on a CUDA GPU that has it, else float32
    init_from: Path | None = None  # warm start a new work folder from a prior folder
    holdout: float = 0.1  # fraction of a user folder held out (by a hash of each file's path)
    dead_leaves: float | None = None  # fraction of procedural crops; None: 0.25 built-in, 0 for a folder
    synthetic: str | None = None  # the procedural generator (SYNTHETIC); None: the work folder's, else dead_leaves
    scales: tuple[float, ...] = DEFAULT_SCALES
    eval_crop: int = 128  # centre crop of the held-out images for the PSNR at each export
    eval_sigmas: tuple[float, ...] = EVAL_SIGMAS
    progress: bool = True


@dataclass
class TrainResult:
    step: int
    loss: float | None  # mean of the last logged interval
    seconds: float  # this run
    parameters: int
    heldout: dict | None  # evaluate_heldout() of the last export
    workdir: Path
    export: Path | None
    skipped: list = field(default_factory=list)


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Adam's learning rate for the update at ``step`` (0-based, the total count so far).

    Linear warm-up over the first ``warmup`` steps, constant ``lr``, then a linear decay to 0 over the
    last ``cooldown`` steps before ``steps``. It depends on the absolute step only, so a resumed run
    with the same ``steps`` and ``cooldown`` continues the same schedule (a larger ``steps`` moves
    the decay later, and the rate back up).
    """
    scale = 1.0
    if cfg.warmup:
        scale = min(scale, (step + 1) / cfg.warmup)
    if cfg.cooldown:
        scale = min(scale, max(0.0, (cfg.steps - step) / cfg.cooldown))
    return cfg.lr * scale


def check_config(cfg: TrainConfig) -> None:
    """TrainingError naming every setting of ``cfg`` out of its range (all at once)."""
    bad = []
    if cfg.steps is None and cfg.minutes is None:
        bad.append("give a budget: steps (--steps N) and/or minutes (--minutes M)")
    if cfg.steps is not None and cfg.steps < 0:
        bad.append(f"--steps must be >= 1 (or 0 with --export: export without training), got {cfg.steps}")
    elif cfg.steps == 0 and cfg.export is None:
        bad.append("--steps 0 trains nothing: it only exports the current weights (the saved state's, or "
                   "--init-from's) and needs --export DIR; give --steps N >= 1 to train")
    if cfg.minutes is not None and not cfg.minutes > 0:
        bad.append(f"--minutes must be > 0, got {cfg.minutes}")
    checks = [(cfg.clock in ("wall", "cpu"), f"--clock must be wall or cpu, got {cfg.clock!r}"),
              (cfg.arch in (None, *ARCHS), f"--arch must be one of {', '.join(ARCHS)}, got {cfg.arch!r}"),
              (cfg.channels in (None, 1, 3), f"--channels must be 1 or 3, got {cfg.channels}"),
              (cfg.crop is None or cfg.crop >= 8, f"--crop must be >= 8, got {cfg.crop}"),
              (cfg.batch >= 1, f"--batch must be >= 1, got {cfg.batch}"),
              (cfg.lr > 0 and math.isfinite(cfg.lr), f"--lr must be > 0, got {cfg.lr}"),
              (cfg.warmup >= 0, f"--warmup must be >= 0, got {cfg.warmup}"),
              (cfg.cooldown >= 0, f"--cooldown must be >= 0, got {cfg.cooldown}"),
              (cfg.cooldown == 0 or cfg.steps is not None, "--cooldown N needs --steps (it ends there)"),
              (cfg.steps is None or cfg.steps < 0 or cfg.cooldown <= cfg.steps,  # a negative --steps: said above
               f"--cooldown {cfg.cooldown} is longer than --steps {cfg.steps}"),
              (0 <= cfg.ema < 1, f"--ema must be in [0, 1), got {cfg.ema}"),
              (cfg.save_every >= 1 and cfg.log_every >= 1, "--save-every and --log-every must be >= 1"),
              (0 <= cfg.holdout < 1, f"--holdout must be in [0, 1), got {cfg.holdout}"),
              (cfg.dead_leaves is None or 0 <= cfg.dead_leaves < 1, f"--dead-leaves must be in [0, 1), got {cfg.dead_leaves}"),
              (cfg.synthetic in (None, *SYNTHETIC), f"--synthetic must be one of {', '.join(SYNTHETIC)}, got {cfg.synthetic!r}"),
              (len(cfg.scales) > 0 and all(0 < s <= 1 for s in cfg.scales), f"--scales must be in (0, 1], got {cfg.scales}"),
              (cfg.precision in ("auto", "float32", "bfloat16"), f"--precision: auto, float32 or bfloat16, got {cfg.precision!r}"),
              (cfg.widths is None or (len(cfg.widths) >= 2 and min(cfg.widths) >= 1), f"--widths needs >= 2 levels, got {cfg.widths}"),
              (cfg.layers is None or cfg.layers >= 1, f"--layers must be >= 1, got {cfg.layers}")]
    bad += [msg for ok, msg in checks if not ok]
    if bad:
        raise TrainingError("; ".join(bad))


def resolve_network(cfg: TrainConfig, saved: dict | None, init: dict | None) -> TrainConfig:
    """Fill the None network fields from the saved state, else the warm-start prior, else defaults.

    An explicit value that differs from the warm-start prior's network is a TrainingError (the
    crop may differ: the network is fully convolutional); the saved state is checked later,
    against the whole fingerprint."""
    defaults = {"arch": DEFAULT_ARCH, "widths": DEFAULT_WIDTHS, "layers": DEFAULT_LAYERS, "crop": 48, "channels": None}
    out = {}
    for key, default in defaults.items():
        value = getattr(cfg, key)
        for src in (saved, init):
            if value is None and src is not None:
                value = src.get(key)
        if value is None:
            value = default
        if key == "widths":
            value = tuple(int(w) for w in value)
        if init is not None and key != "crop" and value is not None and init.get(key) is not None:
            theirs = tuple(init[key]) if key == "widths" else init[key]
            if theirs != value:
                raise TrainingError(f"--init-from {cfg.init_from}: its network has {key} {theirs!r}, "
                                    f"this run asks for {value!r}")
        out[key] = value
    return replace(cfg, **out)


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto``: bfloat16 autocast on a CUDA GPU that multiplies bfloat16 in hardware, else float32
    (a CPU keeps float32 under ``auto``: bfloat16 is faster only where the CPU has it natively,
    scripts/train_throughput.py measures it, and its effect per step against float32 is not measured;
    ``--precision bfloat16`` asks for it)."""
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" and native_bfloat16(device) else "float32"


def check_export(export: str | Path | None) -> None:
    """TrainingError when the prior folder ``--export`` names cannot be written, before any
    training (an export is written at every save, the first one minutes in): a path that is a
    file, or lies under one, or a folder (the export's, or the nearest one above it that exists,
    where the export is staged) in which a file cannot be created."""
    if export is None:
        return
    out = Path(export)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--export {out} is a file, not a folder: give a folder for the prior (it is written "
                            f"at every save)")
    above = next((p for p in out.parents if p.exists()), Path("."))
    if not above.is_dir():
        raise TrainingError(f"--export {out}: {above} is a file, not a folder, so the prior folder cannot be created "
                            f"there")
    for folder in ([out] if out.is_dir() else []) + [above]:
        try:
            fd, name = tempfile.mkstemp(dir=folder, prefix=".nfc_dps-write-check-")
            os.close(fd)
            os.unlink(name)
        except OSError as e:
            raise TrainingError(f"--export {out}: cannot write in {folder} ({e.strerror or e}); give a folder you "
                                f"can write (checked before training: the prior is written at every save)") from e


def check_folders(cfg: TrainConfig) -> None:
    """The work, export and image folders are apart: a work or export folder that is the image
    folder, or holds it, would leave no image to train on (both are left out of the scan); the
    export folder can be written (:func:`check_export`)."""
    check_export(cfg.export)
    if cfg.images is None:
        return
    images = Path(cfg.images)
    try:
        real = images.resolve()
        others = [(flag, Path(f), Path(f).resolve()) for flag, f in (("--workdir", cfg.workdir), ("--export", cfg.export))
                  if f is not None]
    except (OSError, RuntimeError) as e:
        raise TrainingError(f"cannot follow the symbolic links of a folder: {e}") from e
    for flag, given, folder in others:
        if folder == real:
            raise TrainingError(f"{flag} {given} is the --images folder {images}; choose another folder (its files "
                                f"would mix with the training images, which it is left out of)")
        if folder in real.parents:
            raise TrainingError(f"--images {images} lies inside {flag} {given}, which the image scan leaves out; "
                                f"choose a {flag} folder outside it")


def lock_run_folders(workdir: Path, export: str | None, stack: contextlib.ExitStack) -> str | None:
    """Create ``workdir`` and lock it, and lock ``export`` (one run exports to a folder at a time),
    the locks held by ``stack``; the refusal in words, or None."""
    for flag, folder, lock in (("--workdir", workdir, folder_lock), ("--export", export and Path(export), file_lock)):
        if not folder:
            continue
        try:
            (folder if flag == "--workdir" else folder.parent).mkdir(parents=True, exist_ok=True)
            stack.enter_context(lock(folder))
        except FolderBusy as e:
            return f"{flag} {folder}: {e}"
        except OSError as e:
            return f"{flag} {folder}: cannot create {'it' if flag == '--workdir' else 'its folder'} ({e.strerror or e})"
    return None

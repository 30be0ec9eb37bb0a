"""What a training run starts from, read from its work folder's state: the settings resolved
against the saved ones (:func:`settled_config`), the network, its EMA, Adam and the random stream,
the state's or fresh ones (:func:`load_networks`), the ranks' agreement that every one can start,
at one step (:func:`agree_to_start`), and the denoiser that trains (:func:`trained_denoiser`: under
DistributedDataParallel in a torchrun group)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from ..distributed import Dist
from ..priors.archs import build_unet, size_independent
from ..priors.base import EDMDenoiser
from ..priors.diffusers_prior import _UNetCall
from .config import TrainConfig, resolve_network, resolve_precision
from .data import BUILTIN_DEAD_LEAVES, TrainingData, TrainingError, load_builtin, load_folder
from .export import init_network_keys, load_init_weights
from .leaves import DEFAULT_SYNTHETIC
from .state import check_fingerprint, fingerprint, resume_seed, resume_stream, stream_seed

SIGMA_DATA = 0.5


def settled_config(cfg: TrainConfig, state: dict | None, workdir: Path,
                   warn: Callable[[str], None]) -> tuple[TrainConfig, TrainingData, dict]:
    """The run's settings (the folder's seed and network, the data, the procedural generator), its
    data and its fingerprint; every mismatch with the folder's ``state`` a TrainingError before the
    data loads."""
    saved = state["config"] if state else None
    if cfg.steps == 0 and state is None and not cfg.init_from:
        raise TrainingError(f"--steps 0 exports the saved state's weights (or --init-from's), and --workdir "
                            f"{workdir} holds no saved state: it would export untrained, random weights as a "
                            f"prior; give --steps N >= 1 to train, --init-from PRIOR to export a warm start, or "
                            f"the --workdir of an earlier run")
    cfg = replace(cfg, seed=resume_seed(cfg, state, workdir, warn) if state is not None
                  else (0 if cfg.seed is None else cfg.seed))
    init = init_network_keys(cfg.init_from) if state is None and cfg.init_from else None
    cfg = resolve_network(cfg, saved, init)
    if saved is not None:  # the network's keys first: before minutes of data loading
        net_keys = ("arch", "widths", "layers", "crop")
        check_fingerprint(workdir, {k: saved.get(k) for k in net_keys},
                          {k: list(v) if k == "widths" else v for k, v in asdict(cfg).items() if k in net_keys})
    exclude = [workdir] + ([Path(cfg.export)] if cfg.export else [])
    previous_split = state.get("split") if state else None
    data = (load_folder(cfg.images, cfg.channels, cfg.crop, cfg.holdout, exclude, warn, previous_split)
            if cfg.images else load_builtin(cfg.channels))
    leaves_frac = cfg.dead_leaves if cfg.dead_leaves is not None else (0.0 if cfg.images else BUILTIN_DEAD_LEAVES)
    trained_with = (saved or {}).get("data", {}).get("synthetic", DEFAULT_SYNTHETIC)
    synthetic = cfg.synthetic or trained_with
    if saved is not None and synthetic != trained_with:
        raise TrainingError(f"--workdir {workdir} was trained with --synthetic {trained_with}, this run asks for "
                            f"{synthetic}; leave --synthetic out (or give {trained_with}) to resume, or use another "
                            f"--workdir")
    if cfg.synthetic and cfg.synthetic != DEFAULT_SYNTHETIC and leaves_frac == 0:
        warn(f"--synthetic {cfg.synthetic} has no effect: no procedural crops (--dead-leaves 0); "
             f"give --dead-leaves F to mix them in")
    cfg = replace(cfg, channels=data.channels, dead_leaves=leaves_frac, synthetic=synthetic)
    fp = fingerprint(cfg.arch, cfg.widths, cfg.layers, cfg.channels, cfg.crop, data.source, leaves_frac, cfg.scales,
                     cfg.holdout if cfg.images else None, synthetic)
    if saved is not None:
        check_fingerprint(workdir, saved, fp)
    levels = 2 ** (len(cfg.widths) - 1)
    if cfg.crop % levels:
        raise TrainingError(f"--crop {cfg.crop} must be a multiple of {levels} for {len(cfg.widths)} resolution levels")
    return cfg, data, fp


@dataclass
class Networks:
    """What a run trains: the network, its EMA (what is exported), Adam and the generator of every
    random draw of training, at ``step`` after ``seconds`` of training on ``crops`` crops (0 for a
    fresh run); the precision they run in, and their memory layout (channels_last or contiguous)."""

    net: torch.nn.Module
    ema: torch.nn.Module
    opt: torch.optim.Adam
    gen: torch.Generator
    step: int
    seconds: float
    crops: int
    precision: str
    channels_last: bool
    memory_format: torch.memory_format


def load_networks(cfg: TrainConfig, device: torch.device, state: dict | None, state_path: Path, dist: Dist,
                  log: Callable[[str], None], warn: Callable[[str], None]) -> Networks:
    """The networks, Adam and the random stream of ``state`` (read from ``state_path``), else fresh
    ones (``cfg.init_from``'s weights where given); the learning rate ``cfg.lr`` either way."""
    precision = resolve_precision(cfg.precision, device)
    channels_last = device.type == "cuda" or size_independent(cfg.arch)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(cfg.seed)
    net = build_unet(cfg.arch, cfg.channels, cfg.widths, cfg.layers, cfg.crop).to(device, memory_format=memory_format)
    ema = build_unet(cfg.arch, cfg.channels, cfg.widths, cfg.layers, cfg.crop).to(device, memory_format=memory_format)
    ema.requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=device.type == "cuda")
    gen = torch.Generator(device=device)
    step, seconds, crops = 0, 0.0, 0
    if state is not None:
        net.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        step, seconds, crops = int(state["step"]), float(state.get("seconds", 0.0)), int(state.get("crops", 0))
        resume_stream(gen, state, step, cfg.seed, device.type, dist, warn)
        if isinstance(state.get("torch_rng"), torch.Tensor):
            torch.set_rng_state(state["torch_rng"].cpu())
        log(f"resumed from {state_path} at step {step}"
            + (" (a state of the earlier train_prior.py)" if state.get("legacy") else ""))
    else:
        gen.manual_seed(cfg.seed if dist.world == 1 else stream_seed(cfg.seed, 0, dist.rank))
        if cfg.init_from:
            load_init_weights(net, cfg.init_from, cfg.arch)
            log(f"warm start from {cfg.init_from}")
        ema.load_state_dict(net.state_dict())
    for g in opt.param_groups:
        g["lr"] = cfg.lr
    return Networks(net, ema, opt, gen, step, seconds, crops, precision, channels_last, memory_format)


def trained_denoiser(net: torch.nn.Module, precision: str, channels_last: bool, channels: int,
                     device: torch.device, dist: Dist) -> EDMDenoiser:
    """The EDM denoiser of ``net`` that trains: in a group, the network under DistributedDataParallel
    (which averages the gradients over the ranks and copies rank 0's initial weights to every rank)."""
    trained = net
    if dist.world > 1:
        trained = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    return EDMDenoiser(_UNetCall(trained, precision, channels_last), channels=channels, sigma_data=SIGMA_DATA)


def agree_to_start(dist: Dist, workdir: Path, problem: str | None, step: int | None) -> None:
    """In a group, a TrainingError on every rank when any rank could not set up (``problem``: its
    message, naming the rank; rank 0 says it) or when the ranks resume from different steps (``step``:
    this rank's, None with a problem; a work folder that is not on a file system every rank sees).
    A no-op in a single process."""
    world = dist.world
    box = dist.gather((problem, step))
    for rank, (why, _) in enumerate(box):
        if why is not None:
            raise TrainingError(why if rank == 0 else f"process {rank} of {world}: {why}")
    steps = [s for _, s in box]
    if len(set(steps)) > 1:
        raise TrainingError(f"--workdir {workdir}: the processes resume from different steps "
                            f"({', '.join(f'process {r}: {s}' for r, s in enumerate(steps))}); across "
                            f"machines the work folder must be on a file system every process sees")

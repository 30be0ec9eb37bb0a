"""The training loop behind ``nfc-dps train-prior``: EDM's denoising loss, an EMA, resumable state.

Objective (Karras et al. 2022, "Elucidating the design space of diffusion-based generative
models"): crops x0 in [-1, 1], ln sigma ~ N(p_mean, p_std^2), x = x0 + sigma n, loss
``(sigma^2 + sigma_d^2) / (sigma sigma_d)^2 * |D(x, sigma) - x0|^2`` with D the EDM-preconditioned
network (:class:`~nfc_dps.priors.base.EDMDenoiser`, sigma_d = 0.5). Adam, gradient norm clipped
to 1, optional linear warm-up, an EMA of the weights (what is exported).

On CUDA the network runs under bfloat16 autocast in channels_last layout with a fused Adam;
crops are cut on the device (:class:`~nfc_dps.training.data.CropSampler`). Everything random
comes from one ``torch.Generator`` whose state is saved, and the dead-leaves images are a
function of (seed, step), so a run stopped at a save and resumed equals an uninterrupted one.

The work folder holds ``state.pt`` (see :mod:`nfc_dps.training.state`), ``loss.csv`` (step,
loss, seconds, crops_per_s every ``log_every`` steps), ``loss.png``, ``heldout.csv`` (held-out
denoising PSNR at every export) and ``train_config.json``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from .. import io as nio
from ..locking import FolderBusy, folder_lock
from ..priors.archs import build_unet, size_independent
from ..priors.base import EDMDenoiser
from ..priors.default import load_prior
from ..priors.diffusers_prior import _UNetCall, native_bfloat16
from ..priors.training_data import images_power_law
from .config import TrainConfig, TrainResult, check_config, learning_rate, resolve_network
from .data import BUILTIN_DEAD_LEAVES, CropSampler, DeadLeaves, TrainingError, load_builtin, load_folder, multiscale
from .export import INFO_NAME, evaluate_heldout, export_prior, init_network_keys, load_init_weights
from .leaves import DEFAULT_SYNTHETIC
from .plot import read_loss_csv, render_loss_png
from .state import STATE_NAME, check_fingerprint, fingerprint, read_state, write_state

LOSS_CSV, LOSS_PNG, HELDOUT_CSV, CONFIG_JSON = "loss.csv", "loss.png", "heldout.csv", "train_config.json"
LOSS_FIELDS = ["step", "loss", "seconds", "crops_per_s"]
SIGMA_DATA = 0.5


def _precision(name: str, device: torch.device) -> str:
    """``auto``: bfloat16 autocast on a CUDA GPU that multiplies bfloat16 in hardware, else float32
    (a CPU keeps float32 under ``auto``: bfloat16 is faster only where the CPU has it natively,
    docs/prior.md "Throughput on CPU", and its effect per step against float32 is not measured;
    ``--precision bfloat16`` asks for it)."""
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" and native_bfloat16(device) else "float32"


def _keep_rows(path: Path, upto: int) -> None:
    """Drop rows logged after step ``upto`` (a run killed after its last save logged them)."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    kept = [rows[0]] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= upto]
    if len(kept) != len(rows):
        nio.atomic_write_text(path, "".join(",".join(r) + "\n" for r in kept))


def _append(path: Path, header: list[str], row: list) -> None:
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(header)
        w.writerow(row)


def _resume_seed(cfg: TrainConfig, state: dict, workdir: Path, warn: Callable[[str], None]) -> int:
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


def _default_log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def train_prior(cfg: TrainConfig, log: Callable[[str], None] | None = None,
                warn: Callable[[str], None] | None = None) -> TrainResult:
    """Train (or resume) an EDM prior in ``cfg.workdir``; see the module docstring and TrainConfig.

    log: progress messages; warn: skipped files and other warnings (default: log).
    Raises :class:`TrainingError` for bad settings or data, and KeyboardInterrupt (also on
    SIGTERM) after saving the state. CPU threads are the caller's choice (``torch.set_num_threads``).
    """
    log = log or _default_log
    warn = warn or log
    check_config(cfg)
    _check_folders(cfg)
    workdir = Path(cfg.workdir)
    created = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"--workdir {workdir}: cannot create it ({e.strerror or e})") from e
    try:
        with contextlib.ExitStack() as stack:
            try:  # one run per work folder (the lock restore takes on its output folder)
                stack.enter_context(folder_lock(workdir))
            except FolderBusy as e:
                raise TrainingError(f"--workdir {workdir}: {e}") from None
            return _train_locked(cfg, workdir, log, warn)
    except TrainingError:
        if created:  # a refused run leaves no empty work folder behind
            with contextlib.suppress(OSError):
                workdir.rmdir()
        raise


def _check_folders(cfg: TrainConfig) -> None:
    """The work, export and image folders are apart: a work or export folder that is the image
    folder, or holds it, would leave no image to train on (both are left out of the scan)."""
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


def _train_locked(cfg: TrainConfig, workdir: Path, log: Callable[[str], None], warn: Callable[[str], None]) -> TrainResult:
    """:func:`train_prior` once the work folder is locked."""
    device = torch.device(cfg.device)
    state_path = workdir / STATE_NAME
    state = read_state(state_path, device) if state_path.exists() else None
    saved = state["config"] if state else None
    cfg = replace(cfg, seed=_resume_seed(cfg, state, workdir, warn) if state is not None
                  else (0 if cfg.seed is None else cfg.seed))
    init = init_network_keys(cfg.init_from) if state is None and cfg.init_from else None
    cfg = resolve_network(cfg, saved, init)
    if saved is not None:  # the network's keys first: before minutes of data loading
        net_keys = ("arch", "widths", "layers", "crop")
        check_fingerprint(workdir, {k: saved.get(k) for k in net_keys},
                          {k: list(v) if k == "widths" else v for k, v in asdict(cfg).items() if k in net_keys})
    exclude = [workdir] + ([Path(cfg.export)] if cfg.export else [])
    previous_split = state.get("split") if state else None
    data = (load_folder(cfg.images, cfg.channels, cfg.crop, cfg.holdout, exclude, warn, previous_split) if cfg.images
            else load_builtin(cfg.channels))
    leaves_frac = cfg.dead_leaves if cfg.dead_leaves is not None else (0.0 if cfg.images else BUILTIN_DEAD_LEAVES)
    trained_with = (saved or {}).get("data", {}).get("synthetic", DEFAULT_SYNTHETIC)
    synthetic = cfg.synthetic or trained_with
    if saved is not None and synthetic != trained_with:
        raise TrainingError(f"--workdir {workdir} was trained with --synthetic {trained_with}, this run asks for "
                            f"{synthetic}; leave --synthetic out (or give {trained_with}) to resume, or use another --workdir")
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

    precision = _precision(cfg.precision, device)
    channels_last = device.type == "cuda" or size_independent(cfg.arch)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(cfg.seed)
    net = build_unet(cfg.arch, cfg.channels, cfg.widths, cfg.layers, cfg.crop).to(device, memory_format=fmt)
    ema = build_unet(cfg.arch, cfg.channels, cfg.widths, cfg.layers, cfg.crop).to(device, memory_format=fmt)
    ema.requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=device.type == "cuda")
    gen = torch.Generator(device=device)
    step, seconds0, crops0 = 0, 0.0, 0
    if state is not None:
        net.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        step, seconds0, crops0 = int(state["step"]), float(state.get("seconds", 0.0)), int(state.get("crops", 0))
        if state["rng"] is not None and state.get("rng_device", device.type) == device.type:
            gen.set_state(state["rng"].cpu())
        else:
            if state["rng"] is not None:
                warn(f"the work folder was trained on {state['rng_device']}, this run is on {device.type}: "
                     f"the crop stream is reseeded from (seed, step), so the run will not equal one on a single device")
            gen.manual_seed(cfg.seed * 1_000_003 + step)
        if isinstance(state.get("torch_rng"), torch.Tensor):
            torch.set_rng_state(state["torch_rng"].cpu())
        log(f"resumed from {state_path} at step {step}" + (" (a state of the earlier train_prior.py)" if state.get("legacy") else ""))
    else:
        gen.manual_seed(cfg.seed)
        if cfg.init_from:
            load_init_weights(net, cfg.init_from, cfg.arch)
            log(f"warm start from {cfg.init_from}")
        ema.load_state_dict(net.state_dict())
    del state
    start_step = step
    for g in opt.param_groups:
        g["lr"] = cfg.lr
    n_params = sum(p.numel() for p in net.parameters())

    pool = multiscale([im for _, im in data.train], cfg.scales, cfg.crop)
    sampler = CropSampler(pool, cfg.crop, device, DeadLeaves(cfg.seed, cfg.channels, kind=synthetic), leaves_frac)
    sampler.sync_leaves(step)
    log(f"data: {data.source}: {len(data.train)} training image(s) ({len(pool)} with scales), "
        f"{len(data.heldout)} held out, {len(data.skipped)} skipped; procedural {synthetic} {leaves_frac:g}; "
        f"network {cfg.arch} {list(cfg.widths)} x{cfg.layers}, {n_params:,} parameters, {cfg.channels} channel(s), "
        f"crop {cfg.crop}, batch {cfg.batch}, {device} {precision}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    split = {"train": [n for n, _ in data.train], "heldout": [n for n, _ in data.heldout]}
    nio.write_json(workdir / CONFIG_JSON, {"config": fp, "settings": settings, "precision": precision,
                                           "parameters": n_params, "train_images": split["train"],
                                           "heldout_images": split["heldout"],
                                           "skipped": [{"file": f, "reason": r} for f, r in data.skipped]})
    for name in (LOSS_CSV, HELDOUT_CSV):
        _keep_rows(workdir / name, step)

    denoiser = EDMDenoiser(_UNetCall(net, precision, channels_last), channels=cfg.channels, sigma_data=SIGMA_DATA)
    net_params, ema_params = list(net.parameters()), list(ema.parameters())
    power_law: list = []
    clock = time.process_time if cfg.clock == "cpu" else time.time
    t_start, t_wall = clock(), time.time()
    last = {"saved": step, "exported": -1, "loss": None, "heldout": None, "saving": False}
    run_sum = torch.zeros((), device=device)
    run_n, t_log, crops_log = 0, time.time(), 0

    def save() -> None:
        last["saving"] = True
        write_state(state_path, {
            "model": net.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
            "rng": gen.get_state(), "rng_device": device.type, "torch_rng": torch.get_rng_state(),
            "args": settings, "config": fp, "split": split,
            "seconds": seconds0 + time.time() - t_wall, "crops": crops0 + (step - start_step) * cfg.batch})
        last["saved"] = step
        rows = read_loss_csv(workdir / LOSS_CSV) if (workdir / LOSS_CSV).is_file() else []
        if rows:
            render_loss_png(rows, workdir / LOSS_PNG, f"EDM training loss ({workdir}, {rows[-1]['step']} steps)")
        if cfg.export:
            do_export()
        last["saving"] = False

    def do_export() -> None:
        if not power_law:
            power_law.extend(images_power_law([im for _, im in data.train]))
        info = {"step": step, "data": data.source, "train_images": len(data.train),
                "heldout_images": [n for n, _ in data.heldout], "config": fp, "settings": settings}
        export_prior(ema, cfg.export, cfg.arch, cfg.crop, tuple(power_law), info)
        last["exported"] = step
        if data.heldout:
            res = evaluate_heldout(load_prior(cfg.export, device=device), data.heldout, cfg.eval_sigmas, cfg.eval_crop)
            last["heldout"] = res
            nio.write_json(Path(cfg.export) / INFO_NAME, {**info, "heldout_psnr": res})
            _append(workdir / HELDOUT_CSV, ["step"] + [f"psnr_{s:g}" for s in cfg.eval_sigmas] + ["images", "crop"],
                    [step] + [f"{res['mean'][s]:.3f}" for s in cfg.eval_sigmas] + [res["images"], res["crop"]])
            log(f"step {step}: exported {cfg.export}; held-out PSNR ({res['images']} image(s), crop {cfg.eval_crop}): "
                + ", ".join(f"sigma {s:g} {res['mean'][s]:.2f} dB" for s in cfg.eval_sigmas))
        else:
            log(f"step {step}: exported {cfg.export} (no held-out images: no PSNR)")

    def budget_left() -> bool:
        return (stop["signal"] is None and (cfg.steps is None or step < cfg.steps)
                and (cfg.minutes is None or clock() - t_start < cfg.minutes * 60))

    def export_is_current() -> bool:
        """Whether cfg.export already holds this work folder's weights of this step."""
        try:
            info = json.loads((Path(cfg.export) / INFO_NAME).read_text())
        except (OSError, ValueError):
            return False
        return (isinstance(info, dict) and info.get("step") == step and info.get("config") == fp
                and info.get("settings", {}).get("workdir") == settings["workdir"])

    # SIGTERM and Ctrl-C finish the step in progress (and a save or export under way, the last
    # one included), then save and stop: a state saved in the middle of a step (its random draws
    # made, Adam stepped, the step not counted) would resume into another run than the
    # uninterrupted one. A second signal stops at once, keeping the last save. The handler only
    # sets a flag and writes one line straight to stderr (no logging inside a signal handler).
    stop: dict = {"signal": None}

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stop["signal"] is not None:
            raise KeyboardInterrupt(name)
        stop["signal"] = name
        os.write(2, f"\n{name}: stopping after this step (send it again to stop at once)\n".encode())

    in_step = False
    old_handlers: dict = {}
    bar = tqdm(total=cfg.steps, initial=step, unit="step", disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, on_signal)
        if cfg.steps is not None and step >= cfg.steps:
            log(f"the work folder is at step {step} >= --steps {cfg.steps}: nothing to train")
        while budget_left():
            in_step = True
            if cfg.warmup or cfg.cooldown:
                for g in opt.param_groups:
                    g["lr"] = learning_rate(cfg, step)
            x0 = sampler.batch(cfg.batch, gen).contiguous(memory_format=fmt)
            sigma = (torch.randn(cfg.batch, generator=gen, device=device) * cfg.p_std + cfg.p_mean).exp()
            noise = torch.randn(x0.shape, generator=gen, device=device).contiguous(memory_format=fmt)
            noisy = x0 + sigma.view(-1, 1, 1, 1) * noise
            weight = (sigma**2 + SIGMA_DATA**2) / (sigma * SIGMA_DATA) ** 2
            err = (denoiser.denoise(noisy, sigma) - x0).square().mean(dim=(1, 2, 3))
            loss = (weight * err).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net_params, 1.0)
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, net_params, 1.0 - cfg.ema)
            step += 1
            run_sum += loss.detach()
            run_n += 1
            crops_log += cfg.batch
            bar.update(1)
            sampler.sync_leaves(step)
            in_step = False
            if step % cfg.log_every == 0 or step % cfg.save_every == 0 or not budget_left():
                mean = float(run_sum) / run_n
                if not math.isfinite(mean):
                    raise TrainingError(f"the loss is {mean} at step {step}; the state saved at step {last['saved']} "
                                        f"is kept: lower --lr and resume")
                now = time.time()
                rate = crops_log / max(now - t_log, 1e-9)
                _append(workdir / LOSS_CSV, LOSS_FIELDS, [step, f"{mean:.5f}", f"{seconds0 + now - t_wall:.1f}", f"{rate:.1f}"])
                bar.set_postfix(loss=f"{mean:.4f}", crops_s=f"{rate:.0f}")
                last["loss"] = mean
                run_sum.zero_()
                run_n, t_log, crops_log = 0, now, 0
            if step % cfg.save_every == 0:
                save()
                t_log = time.time()  # crops/s counts training, not saving and evaluating
        if step > last["saved"]:  # the last save and export, still under the signal handlers
            save()
        elif cfg.export and last["exported"] != step and not export_is_current():
            do_export()
        if stop["signal"] is not None:
            raise KeyboardInterrupt(stop["signal"])
    except KeyboardInterrupt:
        if in_step:  # stopped inside a step: its half-made changes are not saved
            log(f"interrupted during step {step + 1}: the state of step {last['saved']} in {state_path} is kept")
        elif last["saving"]:  # a second signal during a save: stop at once (the state file is written atomically)
            log(f"interrupted during a save: {state_path} holds step {last['saved']}")
        else:
            if step > last["saved"]:
                save()
            log(f"interrupted: saved step {step} to {state_path}")
        raise
    finally:
        bar.close()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    if state_path.is_file():
        log(f"step {step}: state in {state_path}" + (f", prior in {cfg.export}" if cfg.export else ""))
    else:  # --steps 0 on a new work folder
        log(f"step {step}: nothing trained, no state written to {workdir}"
            + (f"; prior of the initial weights in {cfg.export}" if cfg.export else ""))
    return TrainResult(step, last["loss"], time.time() - t_wall, n_params, last["heldout"], workdir,
                       Path(cfg.export) if cfg.export else None, data.skipped)

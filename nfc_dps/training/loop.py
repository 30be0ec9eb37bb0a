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

Under ``torchrun`` (a :class:`~nfc_dps.distributed.Dist` with world size N > 1) one model trains
with DistributedDataParallel: ``batch`` is the global batch, each rank draws batch / N crops from
its own seeded stream, the gradients are averaged over the ranks, and rank 0 alone writes the
state (with every rank's stream), logs, plots and exports. The ranks stop together (any rank's
budget or signal stops all, within ``GROUP_CHECK_EVERY`` steps); a run resumed with the same N
continues every rank's stream, with another N each stream is reseeded from (seed, step, rank).

The work folder holds ``state.pt`` (see :mod:`nfc_dps.training.state`), ``loss.csv`` (step,
loss, seconds, crops_per_s every ``log_every`` steps), ``loss.png``, ``heldout.csv`` (held-out
denoising PSNR at every export) and ``train_config.json``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .. import io as nio
from ..distributed import Dist
from ..priors.default import load_prior
from ..priors.training_data import images_power_law
from .config import TrainConfig, TrainResult, check_config, check_folders, learning_rate, lock_run_folders
from .data import CropSampler, DeadLeaves, TrainingError, multiscale
from .export import INFO_NAME, evaluate_heldout, export_holds, export_prior
from .logs import append_row, keep_rows, logged
from .plot import read_loss_csv, render_loss_png
from .start import SIGMA_DATA, agree_to_start, load_networks, settled_config, trained_denoiser
from .state import STATE_NAME, read_state, write_state

LOSS_CSV, LOSS_PNG, HELDOUT_CSV, CONFIG_JSON = "loss.csv", "loss.png", "heldout.csv", "train_config.json"
LOSS_FIELDS = ["step", "loss", "seconds", "crops_per_s"]
#: in a torchrun group the ranks agree whether to go on every this many steps (a signal or the
#: --minutes budget on any rank stops them all at the next such step; --steps needs no agreement)
GROUP_CHECK_EVERY = 10


def _default_log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def train_prior(cfg: TrainConfig, log: Callable[[str], None] | None = None,
                warn: Callable[[str], None] | None = None, dist: Dist | None = None) -> TrainResult:
    """Train (or resume) an EDM prior in ``cfg.workdir``; see the module docstring and TrainConfig.

    log: progress messages; warn: skipped files and other warnings (default: log); dist: this
    process's place in a torchrun group (None: a single process).
    Raises :class:`TrainingError` for bad settings or data, and KeyboardInterrupt (also on
    SIGTERM) after saving the state. CPU threads are the caller's choice (``torch.set_num_threads``).
    """
    log = log or _default_log
    warn = warn or log
    dist = dist or Dist()
    check_config(cfg)
    if cfg.batch % dist.world:
        raise TrainingError(f"--batch {cfg.batch} is the global batch, shared by {dist.world} processes: "
                            f"give a multiple of {dist.world}")
    check_folders(cfg)
    workdir = Path(cfg.workdir)
    created = False
    try:
        with contextlib.ExitStack() as stack:
            refused = None
            if dist.rank == 0:  # rank 0 alone creates and writes the folder, one run at a time in it
                created = not workdir.exists()
                refused = lock_run_folders(workdir, cfg.export, stack)
            refused = dist.broadcast(refused)  # every rank of a group refuses alike
            if refused is not None:
                raise TrainingError(refused)
            return _Run(cfg, workdir, log, warn, dist).train()
    except TrainingError:
        if created and dist.rank == 0:  # a refused run leaves no empty work folder behind
            with contextlib.suppress(OSError):
                workdir.rmdir()
        raise


class _Stopping:
    """When a run stops: at ``--steps``, after ``--minutes`` on the run's clock (wall time, or this
    process's CPU time), or at a signal (SIGTERM, Ctrl-C); in a torchrun group the ranks agree, so
    that any rank that stops stops them all, at the same step."""

    def __init__(self, cfg: TrainConfig, dist: Dist, device: torch.device) -> None:
        self.cfg, self.dist, self.device = cfg, dist, device
        self.signal: str | None = None  # the name of the signal that stops the run

    def start_clock(self) -> None:
        """Start the ``--minutes`` budget's clock."""
        self.clock = time.process_time if self.cfg.clock == "cpu" else time.time
        self.t_start = self.clock()

    def go_on(self, step: int) -> bool:
        """Whether to take another step after ``step``: this process's budget and signals, and in a
        group every rank's (a collective every ``GROUP_CHECK_EVERY`` steps)."""
        cfg = self.cfg
        if cfg.steps is not None and step >= cfg.steps:
            return False  # every rank counts the same steps
        go = self.signal is None and (cfg.minutes is None or self.clock() - self.t_start < cfg.minutes * 60)
        if self.dist.world > 1 and step % GROUP_CHECK_EVERY:
            return True  # a group agrees every few steps: each agreement waits for the slowest rank
        return self.agree(go)

    def agree(self, go: bool) -> bool:
        """``go`` on every rank of a group, and a signal any rank got every rank's (a collective;
        ``go`` itself in a single process)."""
        stop = self.dist.max(0.0 if go else 2.0 if self.signal is not None else 1.0, self.device)
        if stop == 2 and self.signal is None:  # a signal on another rank stops this one alike
            self.signal = "a signal to another process of the group"
        return stop == 0

    def on_signal(self, signum: int, frame: object) -> None:
        """SIGTERM and Ctrl-C finish the step in progress (and a save or export under way, the last
        one included), then save and stop: a state saved in the middle of a step (its random draws
        made, Adam stepped, the step not counted) would resume into another run than the
        uninterrupted one. A second signal stops at once, keeping the last save. The handler only
        sets a flag and writes one line straight to stderr (no logging inside a signal handler)."""
        name = signal.Signals(signum).name
        if self.signal is not None:
            raise KeyboardInterrupt(name)
        self.signal = name
        when = "this step" if self.dist.world == 1 else f"at most {GROUP_CHECK_EVERY} steps, with the group"
        os.write(2, f"\n{name}: stopping after {when} (send it again to stop at once)\n".encode())


class _Run:
    """One training run in a locked work folder: its settings (resolved against the folder's
    state), data, networks, optimiser and random stream; :meth:`train` steps until the budget or
    a signal, logging, saving and exporting as it goes."""

    def __init__(self, cfg: TrainConfig, workdir: Path, log: Callable[[str], None],
                 warn: Callable[[str], None], dist: Dist) -> None:
        self.workdir, self.log, self.warn, self.dist = workdir, log, warn, dist
        self.writer = dist.rank == 0  # rank 0 alone writes the state, logs, plots and exports
        self.local_batch = cfg.batch // dist.world
        self.device = torch.device(cfg.device)
        self.state_path = workdir / STATE_NAME
        problem = None
        try:
            state = read_state(self.state_path, self.device) if self.state_path.exists() else None
            self.cfg, self.data, self.fp = settled_config(cfg, state, workdir, warn)
            self._networks(state)
            del state
            self._pool()
        except (TrainingError, OSError) as e:
            if dist.world == 1:
                raise
            problem = str(e) if isinstance(e, TrainingError) else f"{e.filename or ''}: {e.strerror or e}"
        # in a group: every rank refuses alike, before the first collective of training
        agree_to_start(dist, workdir, problem, None if problem else self.step)
        self.denoiser = trained_denoiser(self.net, self.precision, self.channels_last, self.cfg.channels,
                                         self.device, dist)
        self._records()
        self.saved, self.exported, self.saving = self.step, -1, False
        self.loss: float | None = None
        self.heldout: dict | None = None
        self.power_law: list = []
        self.stopping = _Stopping(self.cfg, dist, self.device)

    # -- set-up

    def _networks(self, state: dict | None) -> None:
        """The network, its EMA, Adam and the random stream: the state's, else fresh (or warm-started)."""
        nets = load_networks(self.cfg, self.device, state, self.state_path, self.dist, self.log, self.warn)
        self.net, self.ema, self.opt, self.gen = nets.net, nets.ema, nets.opt, nets.gen
        self.precision, self.channels_last, self.fmt = nets.precision, nets.channels_last, nets.memory_format
        self.step, self.start_step, self.seconds0, self.crops0 = nets.step, nets.step, nets.seconds, nets.crops
        self.n_params = sum(p.numel() for p in nets.net.parameters())
        self.net_params, self.ema_params = list(nets.net.parameters()), list(nets.ema.parameters())

    def _pool(self) -> None:
        """The crop sampler over the training images and the procedural ones."""
        cfg, data = self.cfg, self.data
        pool = multiscale([im for _, im in data.train], cfg.scales, cfg.crop)
        self.sampler = CropSampler(pool, cfg.crop, self.device, DeadLeaves(cfg.seed, cfg.channels, kind=cfg.synthetic),
                                   cfg.dead_leaves)
        self.sampler.sync_leaves(self.step)
        self.log(f"data: {data.source}: {len(data.train)} training image(s) ({len(pool)} with scales), "
                 f"{len(data.heldout)} held out, {len(data.skipped)} skipped; procedural {cfg.synthetic} "
                 f"{cfg.dead_leaves:g}; network {cfg.arch} {list(cfg.widths)} x{cfg.layers}, {self.n_params:,} "
                 f"parameters, {cfg.channels} channel(s), crop {cfg.crop}, batch {cfg.batch}"
                 + (f" ({self.local_batch} on each of {self.dist.world} processes)" if self.dist.world > 1 else "")
                 + f", {self.device} {self.precision}")
        self.settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
        self.split = {"train": [n for n, _ in data.train], "heldout": [n for n, _ in data.heldout]}

    def _records(self) -> None:
        """train_config.json and the logs cut back to the resumed step (rank 0)."""
        if not self.writer:
            return
        data = self.data
        nio.write_json(self.workdir / CONFIG_JSON, {
            "config": self.fp, "settings": self.settings, "precision": self.precision, "parameters": self.n_params,
            "world_size": self.dist.world, "batch_per_process": self.local_batch,
            "train_images": self.split["train"], "heldout_images": self.split["heldout"],
            "skipped": [{"file": f, "reason": r} for f, r in data.skipped]})
        for name in (LOSS_CSV, HELDOUT_CSV):
            keep_rows(self.workdir / name, self.step)

    # -- saving

    def _streams(self) -> list[Tensor]:
        """Every rank's crop-stream state, on rank 0 (a collective: every rank calls it)."""
        return self.dist.gather(self.gen.get_state())

    def save(self) -> None:
        """state.pt (atomically), the loss plot, and the export when there is one (rank 0; every
        rank calls it, for the streams)."""
        self.saving = True
        streams = self._streams()
        self.saved = self.step
        if not self.writer:
            self.saving = False
            return
        write_state(self.state_path, {
            "model": self.net.state_dict(), "ema": self.ema.state_dict(), "opt": self.opt.state_dict(),
            "step": self.step, "rng": streams[0], "rng_ranks": streams, "world": self.dist.world,
            "rng_device": self.device.type, "torch_rng": torch.get_rng_state(), "args": self.settings,
            "config": self.fp, "split": self.split, "seconds": self.seconds0 + time.time() - self.t_wall,
            "crops": self.crops0 + (self.step - self.start_step) * self.cfg.batch})
        rows = read_loss_csv(self.workdir / LOSS_CSV) if (self.workdir / LOSS_CSV).is_file() else []
        if rows:
            render_loss_png(rows, self.workdir / LOSS_PNG, f"EDM training loss ({self.workdir}, {rows[-1]['step']} steps)")
        if self.cfg.export:
            self.export()
        self.saving = False

    def export(self) -> None:
        """The EMA weights as a prior folder, and their held-out denoising PSNR."""
        cfg, data, step = self.cfg, self.data, self.step
        if not self.power_law:
            self.power_law.extend(images_power_law([im for _, im in data.train]))
        info = {"step": step, "data": data.source, "train_images": len(data.train),
                "heldout_images": [n for n, _ in data.heldout], "config": self.fp, "settings": self.settings,
                "workdir": str(self.workdir.resolve()), "seed": cfg.seed}
        export_prior(self.ema, cfg.export, cfg.arch, cfg.crop, tuple(self.power_law), info)
        self.exported = step
        if not data.heldout:
            self.log(f"step {step}: exported {cfg.export} (no held-out images: no PSNR)")
            return
        res = evaluate_heldout(load_prior(cfg.export, device=self.device), data.heldout, cfg.eval_sigmas, cfg.eval_crop)
        self.heldout = res
        nio.write_json(Path(cfg.export) / INFO_NAME, {**info, "heldout_psnr": res})
        append_row(self.workdir / HELDOUT_CSV, ["step"] + [f"psnr_{s:g}" for s in cfg.eval_sigmas] + ["images", "crop"],
                [step] + [f"{res['mean'][s]:.3f}" for s in cfg.eval_sigmas] + [res["images"], res["crop"]])
        self.log(f"step {step}: exported {cfg.export}; held-out PSNR ({res['images']} image(s), crop {cfg.eval_crop}): "
                 + ", ".join(f"sigma {s:g} {res['mean'][s]:.2f} dB" for s in cfg.eval_sigmas))

    def export_missing(self) -> bool:
        """Whether the saved step's export, or its held-out row, is missing (a run killed between
        its state's save and them: resumed, the state's EMA weights are exported and evaluated again)."""
        return self.exported != self.step and not (
            self.export_is_current() and (not self.data.heldout or logged(self.workdir / HELDOUT_CSV, self.step)))

    def export_is_current(self) -> bool:
        """Whether cfg.export already holds this work folder's weights of this step."""
        return export_holds(self.cfg.export, self.step, self.fp, self.settings["workdir"])

    # -- the loop

    def mean_loss(self, run_sum: Tensor, run_n: int) -> float:
        """The mean loss of the steps since the last log, over every rank."""
        return float(self.dist.mean(run_sum)) / run_n

    def one_step(self) -> Tensor:
        """One EDM step on a batch of crops; the (detached) loss."""
        cfg = self.cfg
        if cfg.warmup or cfg.cooldown:
            for g in self.opt.param_groups:
                g["lr"] = learning_rate(cfg, self.step)
        x0 = self.sampler.batch(self.local_batch, self.gen).contiguous(memory_format=self.fmt)
        sigma = (torch.randn(self.local_batch, generator=self.gen, device=self.device) * cfg.p_std + cfg.p_mean).exp()
        noise = torch.randn(x0.shape, generator=self.gen, device=self.device).contiguous(memory_format=self.fmt)
        noisy = x0 + sigma.view(-1, 1, 1, 1) * noise
        weight = (sigma**2 + SIGMA_DATA**2) / (sigma * SIGMA_DATA) ** 2
        err = (self.denoiser.denoise(noisy, sigma) - x0).square().mean(dim=(1, 2, 3))
        loss = (weight * err).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net_params, 1.0)
        self.opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.ema_params, self.net_params, 1.0 - cfg.ema)
        self.step += 1
        self.sampler.sync_leaves(self.step)
        return loss.detach()

    def train(self) -> TrainResult:
        """Step until the budget or a signal; the last save and export; the run's result."""
        cfg, workdir = self.cfg, self.workdir
        self.stopping.start_clock()
        self.t_wall = time.time()
        run_sum = torch.zeros((), device=self.device)
        run_n, t_log, crops_log = 0, time.time(), 0
        in_step = False
        old_handlers: dict = {}
        bar = tqdm(total=cfg.steps, initial=self.step, unit="step", disable=not (cfg.progress and self.writer),
                   file=sys.stderr, dynamic_ncols=True)
        try:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    old_handlers[sig] = signal.signal(sig, self.stopping.on_signal)
            if self.writer and cfg.export and self.step > 0 and self.step == self.saved and self.export_missing():
                self.export()  # a run killed between its state's save and its export or held-out row: both again
            if cfg.steps is not None and self.step >= cfg.steps:
                self.log(f"the work folder is at step {self.step} >= --steps {cfg.steps}: nothing to train")
            go = self.stopping.go_on(self.step)
            while go:
                in_step = True
                run_sum += self.one_step()
                run_n += 1
                crops_log += cfg.batch
                bar.update(1)
                in_step = False
                step = self.step
                go = self.stopping.go_on(self.step)
                if step % cfg.log_every == 0 or step % cfg.save_every == 0 or not go:
                    mean = self.mean_loss(run_sum, run_n)
                    if not math.isfinite(mean):
                        raise TrainingError(f"the loss is {mean} at step {step}; the state saved at step {self.saved} "
                                            f"is kept: lower --lr and resume")
                    now = time.time()
                    rate = crops_log / max(now - t_log, 1e-9)
                    if self.writer:
                        append_row(workdir / LOSS_CSV, LOSS_FIELDS,
                                [step, f"{mean:.5f}", f"{self.seconds0 + now - self.t_wall:.1f}", f"{rate:.1f}"])
                    bar.set_postfix(loss=f"{mean:.4f}", crops_s=f"{rate:.0f}")
                    self.loss = mean
                    run_sum.zero_()
                    run_n, t_log, crops_log = 0, now, 0
                if step % cfg.save_every == 0:
                    self.save()
                    t_log = time.time()  # crops/s counts training, not saving and evaluating
            self.stopping.agree(self.stopping.signal is None)  # a signal that came after the ranks' last agreement
            if self.step > self.saved:  # the last save and export, still under the signal handlers
                self.save()
            elif self.writer and cfg.export and self.exported != self.step and not self.export_is_current():
                self.export()
            if self.stopping.signal is not None:
                raise KeyboardInterrupt(self.stopping.signal)
        except KeyboardInterrupt:
            if in_step:  # stopped inside a step: its half-made changes are not saved
                self.log(f"interrupted during step {self.step + 1}: the state of step {self.saved} in "
                         f"{self.state_path} is kept")
            elif self.saving:  # a second signal during a save: stop at once (the state file is written atomically)
                self.log(f"interrupted during a save: {self.state_path} holds step {self.saved}")
            elif self.dist.world > 1:  # a save is collective: a rank stopped on its own keeps the last one
                self.log(f"interrupted: {self.state_path} holds step {self.saved}")
            else:
                if self.step > self.saved:
                    self.save()
                self.log(f"interrupted: saved step {self.step} to {self.state_path}")
            raise
        finally:
            bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        return self._result()

    def _result(self) -> TrainResult:
        cfg = self.cfg
        if self.state_path.is_file():
            self.log(f"step {self.step}: state in {self.state_path}" + (f", prior in {cfg.export}" if cfg.export else ""))
        else:  # --steps 0 on a new work folder
            self.log(f"step {self.step}: nothing trained, no state written to {self.workdir}"
                     + (f"; prior of the initial weights in {cfg.export}" if cfg.export else ""))
        return TrainResult(self.step, self.loss, time.time() - self.t_wall, self.n_params, self.heldout, self.workdir,
                           Path(cfg.export) if cfg.export else None, self.data.skipped)

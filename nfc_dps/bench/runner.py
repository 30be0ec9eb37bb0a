"""Running the grid (:func:`run`): sharding the (task, image) jobs round-robin over torchrun
ranks (:class:`Dist`, gloo on CPU, NCCL on GPUs), every missing row of one job
(:func:`run_job`), the merge on rank 0, and config.json with its fingerprint check."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..distributed import Dist, init_distributed, resolve_device
from ..io import atomic_write_text
from ..priors.default import prior_identity
from ..priors.diffusers_prior import resolve_precision
from .instruments import PeakMemory, lpips_status, machine_description, row_metrics, save_png
from .measurements import load_images, measurement
from .plots import make_plots
from .spec import (CLASSICAL_METHODS, DIFFUSION_METHODS, MIXTURE_RECORD_KEY, BenchSpec, MethodRun, TaskSpec, budget_str, estimators,
                   method_runs, not_applicable, task_specs)
from .tables import PartWriter, all_rows, is_failed, merge_results, result_row, row_key, summary_markdown
from ..priors.default import load_prior
from ..api import restore
from ..baselines import restore_classical
from ..operators import build_operator


def prior_record(path: str | None) -> dict[str, Any]:
    """The prior as summary.md and profile.json record it: its folder, whether it is the embedded
    default (then its path is the package's "assets/default_prior", not this machine's), and (when
    it has files) a hash of their contents and the newest file's time."""
    info = prior_identity(path, contents=True)
    if info["embedded_default"]:
        info["path"] = "assets/default_prior"
    return {k: info[k] for k in ("path", "embedded_default", "sha256", "modified") if k in info}


def load_bench_prior(spec: BenchSpec, device: torch.device):
    """The run's prior (--prior, else the embedded default); FileNotFoundError says how to pass one."""
    try:
        return load_prior(spec.prior, device=device, precision=spec.precision)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}\nPass --prior DIR (e.g. runs/prior/export, the training job's export).") from e


def run_job(spec: BenchSpec, task: TaskSpec, image: str, img: np.ndarray, runs: list[MethodRun], prior, device,
            done: set[tuple], writer: PartWriter, notes: list[str], log: Callable[[str], None]) -> None:
    """All methods of one (task, image): measurement once, then every missing row."""
    op, x, y, meta = measurement(spec, task, image, img)
    seed = meta["sampler_seed"]
    dev_op = None
    for run in runs:
        ests = estimators(run, spec.samples)
        keys = [(task.name, image, run.label, e, budget_str(run)) for e in ests]
        if all(k in done for k in keys):
            continue
        reason = not_applicable(run, op)
        if reason is not None:
            notes.append(f"{task.name} / {run.label}: skipped, {reason}")
            continue
        label = f"{task.name}/{image}/{run.label}" + ("" if run.budget is None else f"@{run.budget}")
        try:
            if run.method in CLASSICAL_METHODS:
                with PeakMemory(torch.device("cpu")) as mem:
                    t0 = time.perf_counter()
                    xr = restore_classical(run.method, op, y, spec.sigma_y)
                    secs = time.perf_counter() - t0
                outs = {"deterministic": (xr, 0, secs)}
            else:
                if dev_op is None:
                    dev_op = op if device.type == "cpu" else copy.deepcopy(op).to(device)
                with PeakMemory(device) as mem:
                    t0 = time.perf_counter()
                    res = restore(y.to(device), dev_op, prior=prior, method=run.method, config=run.config,
                                  sigma_y=spec.sigma_y, seed=seed, progress=False,
                                  num_samples=1 if ests == ["deterministic"] else spec.samples)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    secs = time.perf_counter() - t0
                if ests == ["deterministic"]:
                    outs = {"deterministic": (res.image, res.nfe, secs)}
                elif spec.samples > 1:  # K chains in one call: a sample costs one chain, the mean all K
                    k = spec.samples
                    outs = {"sample": (res.samples[0], res.nfe, secs / k), f"mean{k}": (res.image, k * res.nfe, secs)}
                else:
                    outs = {"sample": (res.image, res.nfe, secs)}
            for est, (xr, nfe, row_secs) in outs.items():
                if (task.name, image, run.label, est, budget_str(run)) in done:
                    continue
                met = row_metrics(xr, x)
                writer.write(result_row(spec, task.name, image, run, est, nfe=nfe, seconds=row_secs, peak_mem_mb=mem.mb,
                                  seed=seed if run.method not in CLASSICAL_METHODS else "", **met))
                if spec.save_images:
                    save_png(spec.out / "images" / task.name / image / f"{run.label.replace(':', '-')}-{est}-{budget_str(run)}.png",
                              xr[0].detach().cpu().clamp(0, 1))
                log(f"{label} [{est}] psnr {met['psnr']:.2f} ssim {met['ssim'] if met['ssim'] is not None else float('nan'):.3f} "
                    f"{secs:.1f}s")
        except Exception as e:  # noqa: BLE001 - a failing method is a row with a note, not a crashed benchmark
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            for est in ests:
                writer.write(result_row(spec, task.name, image, run, est, nfe=0 if run.config is None else run.config.nfe, note=msg))
            log(f"{label}: FAILED {msg}")


def run(spec: BenchSpec, log: Callable[[str], None] = print) -> list[dict[str, str]]:
    """Run (or resume) the grid; returns the merged rows on rank 0 (others: [])."""
    t_start = time.perf_counter()
    d = init_distributed(spec.device)
    device = resolve_device(spec.device, d)
    out = spec.out
    cfg_path = out / "config.json"
    runs = method_runs(spec)
    needs_prior = any(r.method in DIFFUSION_METHODS for r in runs)
    # hashed once (config.json and summary.md record the same); a classical-only grid uses no prior
    prior_info = prior_record(spec.prior) if needs_prior else None
    # bfloat16 and float32 rows differ: the resolved precision is part of what the folder's rows are
    precision = resolve_precision(spec.precision, device) if needs_prior else None
    # every rank checks: an error on one rank only would leave the others waiting
    existing = all_rows(out)
    record, notes_on_folder = check_folder_record(
        spec, cfg_path, folder_record(spec, column_configs(runs), prior_info, precision),
        {f"{r['method']}@{r['budget']}" for r in existing})
    all_tasks = task_specs(spec.protocol, spec.size, spec.boundary)
    unknown = [t for t in spec.tasks if t not in all_tasks]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(all_tasks)}")
    images = load_images(spec)
    # config.json only once everything validated: a refused run leaves the folder as it was
    d.barrier()
    if d.rank == 0:
        for note in notes_on_folder:
            log(note)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cfg_path, json.dumps({**_saved(cfg_path), **record}, indent=1, default=str))
    d.barrier()
    names = [n for n, _ in images]
    done = {row_key(r) for r in existing if not is_failed(r)}  # failed rows are retried
    jobs = [(t, n) for t in spec.tasks for n in names]
    mine = jobs[d.rank::d.world]
    prior = None
    notes: list[str] = []
    prefix = f"[rank {d.rank}] " if d.world > 1 else ""
    writer = PartWriter(out / "parts" / f"rank{d.rank}.csv")
    imgs = dict(images)
    try:
        for t, n in mine:
            todo = [r for r in runs for e in estimators(r, spec.samples)
                    if (t, n, r.label, e, budget_str(r)) not in done]
            if not todo:
                continue
            if needs_prior and prior is None:
                prior = load_bench_prior(spec, device)
                with torch.no_grad():  # warm-up call, so that the first timed method pays no set-up cost
                    prior.denoise(torch.zeros(1, prior.channels, spec.size, spec.size, device=device),
                                  torch.ones(1, device=device))
            run_job(spec, all_tasks[t], n, imgs[n], runs, prior, device, done, writer, notes,
                    lambda s: log(prefix + s))
    finally:
        writer.close()
    # applicability notes are cheap to recompute for the summary (jobs of every rank)
    if d.rank == 0:
        for t in spec.tasks:
            ts = all_tasks[t]
            op = build_operator(ts.name, spec.size, 0, **ts.params)
            for r in runs:
                why = not_applicable(r, op)
                if why:
                    notes.append(f"{t} / {r.label}: skipped, {why}")
    d.barrier()
    rows: list[dict[str, str]] = []
    if d.rank == 0:
        rows = merge_results(spec, names)
        header = _header(spec, d, device, time.perf_counter() - t_start, names, prior_info)
        atomic_write_text(cfg_path, json.dumps({**record, "header": header}, indent=1, default=str))
        # the tables average over this run's images only (results.csv keeps every row of the folder)
        this_run = set(names)
        table_rows = [r for r in rows if r["image"] in this_run]
        others = sorted({r["image"] for r in rows} - this_run)
        if others:
            notes.append(f"results.csv also holds rows of {len(others)} image(s) not in this run "
                         f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); the tables leave them out")
        plots = make_plots(spec, table_rows, names, log) if spec.plots else []
        atomic_write_text(out / "summary.md", summary_markdown(spec, table_rows, header, notes, plots))
        log(f"wrote {out / 'results.csv'} ({len(rows)} rows) and {out / 'summary.md'}")
    d.barrier()
    if d.initialised:
        import torch.distributed as dist

        dist.destroy_process_group()
    return rows


def column_configs(runs: list[MethodRun]) -> dict[str, Any]:
    """{"label@budget": sampler config} of every diffusion column of the grid."""
    return {f"{r.label}@{budget_str(r)}": r.config for r in runs if r.config is not None}


def folder_record(spec: BenchSpec, configs: dict[str, Any], prior: dict[str, Any] | None,
                  precision: str | None = None) -> dict[str, Any]:
    """What config.json records so that a rerun into the same folder adds rows only of the same
    configuration: the spec's fingerprint, the resolved sampler config of every diffusion column
    (``configs``: "label@budget" -> config dataclass; the row key leaves them out) and the prior's
    content hash (``prior``: its :func:`prior_record`, None when the grid uses no prior) and the
    network's resolved ``precision``."""
    record: dict[str, Any] = {"fingerprint": spec.fingerprint(), "spec": spec_json(spec),
                              "configs": {column: dataclasses.asdict(c) for column, c in configs.items()}}
    if prior is not None:
        record["prior_sha256"] = prior.get("sha256")
    if precision is not None:
        record["precision"] = precision
    return json.loads(json.dumps(record, default=str))  # tuples -> lists, as they are read back


def _saved(cfg_path: Path) -> dict[str, Any]:
    return json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON values differ, as 'key: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_folder_record(spec: BenchSpec, cfg_path: Path, record: dict[str, Any],
                        columns_with_rows: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Refuse to mix rows of another configuration into an existing output folder: another spec
    fingerprint, another prior, or a column ("label@budget") with rows whose sampler config
    changed (a preset edited since). Columns without rows (an interrupted run) are not compared.
    Returns the record to save (the configs of the folder's columns that have rows, and this
    run's) and notes for the log (a folder written before configs were recorded)."""
    saved = _saved(cfg_path)
    if MIXTURE_RECORD_KEY in saved:  # the mixture protocol's record: its rows have other columns
        raise ValueError(f"{spec.out} holds results of the mixture protocol ({cfg_path}); use another --out")
    problems, notes = [], []
    old_fp = saved.get("fingerprint")
    if old_fp is not None and old_fp != record["fingerprint"]:
        problems += _differences(old_fp, record["fingerprint"])
    diffusion_rows = any(c.split("@")[0].split(":")[0] in DIFFUSION_METHODS for c in columns_with_rows)
    old_sha, new_sha = saved.get("prior_sha256"), record.get("prior_sha256")
    if diffusion_rows and old_sha and new_sha and old_sha != new_sha:
        problems.append(f"prior (sha256 of its files): {old_sha} -> {new_sha}")
    old_prec, new_prec = saved.get("precision"), record.get("precision")
    if diffusion_rows and old_prec and new_prec and old_prec != new_prec:
        problems.append(f"network precision: {old_prec} -> {new_prec} (--precision)")
    old_configs = {k: v for k, v in saved.get("configs", {}).items() if k in columns_with_rows}
    for column, cfg in record["configs"].items():
        if column in old_configs and old_configs[column] != cfg:
            problems += [f"{column} config {d}" for d in _differences(old_configs[column], cfg)]
    if problems:
        raise ValueError(f"{spec.out} holds results of another configuration ({cfg_path}): "
                         + "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
                         + ". Use another --out")
    if diffusion_rows and saved and "configs" not in saved:
        notes.append(f"note: {cfg_path} predates the record of sampler configs and prior; the rows already "
                     f"in {spec.out} cannot be checked against this run's, which is recorded from now on")
    merged = {**record, "configs": {**old_configs, **record["configs"]}}
    if not new_sha and old_sha and diffusion_rows:
        merged["prior_sha256"] = old_sha
    if not new_prec and old_prec and diffusion_rows:
        merged["precision"] = old_prec
    return merged, notes


def spec_json(spec: BenchSpec) -> dict[str, Any]:
    """The spec as JSON-ready values (paths as strings), for config.json."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(spec).items()}


def _header(spec: BenchSpec, d: Dist, device: torch.device, seconds: float, names: Sequence[str],
            prior: dict[str, Any] | None) -> dict[str, Any]:
    """The settings list at the top of summary.md (``prior``: its :func:`prior_record`, None when
    the grid uses no network; images, noise, machine, ...)."""
    mach = machine_description()
    h: dict[str, Any] = {}
    if spec.label:
        h["label"] = spec.label
    if prior is not None:
        h["prior"] = prior
        h["network precision"] = resolve_precision(spec.precision, device)
    else:
        h["prior"] = "none (classical methods only)"
    h.update({
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "images": f"{len(names)} ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}), {spec.size}x{spec.size}"
                  + (f", centre crop {spec.size * spec.zoom} px area-averaged by {spec.zoom}"
                     if spec.protocol == "local" and not spec.images and spec.zoom > 1 else ""),
        "sigma_y": f"{spec.sigma_y} in [0, 1] units (= {2 * spec.sigma_y:g} in [-1, 1])",
        "preset / budgets": f"{spec.preset} / {', '.join(map(str, spec.budgets)) or 'preset NFE'}",
        "samples per image": spec.samples,
        "seed": spec.seed,
        "blur boundary": spec.boundary,
        "machine": f"{mach.get('cpu', platform.processor())}, nproc {mach['nproc']}, RAM {mach.get('ram_gib', '?')} GiB"
                   + (f", GPU {mach['gpu']}" if "gpu" in mach else ""),
        "device / processes": f"{device} / {d.world}",
        "torch": mach["torch"],
        "wall time of this invocation": f"{seconds / 60:.1f} min",
        "LPIPS": lpips_status()[1],
    })
    if spec.overrides:
        h["overrides"] = spec.overrides
    return h

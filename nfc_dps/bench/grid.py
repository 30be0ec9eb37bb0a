"""The grid protocols (``local`` and ``paper``, :class:`Grid`): tasks x images x methods x NFE
budgets on a diffusion prior's photographs. A case is one (task, image): its measurement once
(:func:`~nfc_dps.bench.measurements.measurement`), then every missing row of every method
(:func:`run_job`); :func:`~nfc_dps.bench.runner.run_protocol` does the rest."""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Hashable, Iterator

import torch

from ..api import restore
from ..baselines import CLASSICAL, restore_classical
from ..io import atomic_write_text
from ..noise import NoiseModel
from ..operators import build_operator
from ..priors.diffusers_prior import resolve_precision
from .instruments import PeakMemory, lpips_status, row_metrics, save_png
from .measurements import load_images, measurement
from .plots import make_plots
from .runner import Case, Protocol, Row, Table, folder_record, load_bench_prior, prior_record
from .spec import (
    DIFFUSION_METHODS,
    BenchSpec,
    MethodRun,
    TaskSpec,
    budget_str,
    estimators,
    method_runs,
    noise_problem,
    not_applicable,
    task_specs,
)
from .tables import COLUMNS, KEY, is_failed, result_row, row_order, summary_markdown

#: results.csv of the grid (and of the oracle): one row per task x image x method x estimator x budget
RESULTS = Table("results.csv", tuple(COLUMNS), KEY, ("task", "image"))


def _noise_header(noise: NoiseModel) -> dict[str, str]:
    """The summary's line on the measurements' noise."""
    sigma = noise.gaussian_sigma
    if sigma is None:
        return {"noise": f"{noise} ([0, 1] units)"}
    return {"sigma_y": f"{sigma} in [0, 1] units (= {2 * sigma:g} in [-1, 1])"}


def _restore_timed(spec: BenchSpec, run: MethodRun, ests: list[str], op, y, prior, device, seed: int
                   ) -> tuple[dict[str, tuple[Any, int, float]], PeakMemory, float]:
    """{estimator: (image, NFE, seconds of the row)} of one column on one measurement, its peak
    memory and the seconds of the call."""
    if run.method in CLASSICAL:
        with PeakMemory(torch.device("cpu")) as mem:
            t0 = time.perf_counter()
            xr = restore_classical(run.method, op, y, spec.noise)
            secs = time.perf_counter() - t0
        return {"deterministic": (xr, 0, secs)}, mem, secs
    with PeakMemory(device) as mem:
        t0 = time.perf_counter()
        res = restore(y.to(device), op, prior=prior, method=run.method, config=run.config, noise=spec.noise, seed=seed,
                      progress=False, num_samples=1 if ests == ["deterministic"] else spec.samples)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        secs = time.perf_counter() - t0
    if ests == ["deterministic"]:
        return {"deterministic": (res.image, res.nfe, secs)}, mem, secs
    if spec.samples > 1:  # K chains in one call: a sample costs one chain, the mean all K
        k = spec.samples
        return {"sample": (res.samples[0], res.nfe, secs / k), f"mean{k}": (res.image, k * res.nfe, secs)}, mem, secs
    return {"sample": (res.image, res.nfe, secs)}, mem, secs


def run_job(spec: BenchSpec, task: TaskSpec, image: str, measured: tuple, runs: list[MethodRun], prior, device,
            done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
    """The rows of one (task, image) not in ``done``: every column on the one measurement."""
    op, x, y, meta = measured
    seed = meta["sampler_seed"]
    dev_op = op if device.type == "cpu" else copy.deepcopy(op).to(device)
    for run in runs:
        ests = estimators(run, spec.samples)
        if all((task.name, image, run.label, e, budget_str(run)) in done for e in ests) \
                or not_applicable(run, op) is not None:
            continue
        label = f"{task.name}/{image}/{run.label}" + ("" if run.budget is None else f"@{run.budget}")
        try:
            outs, mem, secs = _restore_timed(spec, run, ests, op if run.method in CLASSICAL else dev_op, y, prior,
                                       device, seed)
            for est, (xr, nfe, row_secs) in outs.items():
                if (task.name, image, run.label, est, budget_str(run)) in done:
                    continue
                met = row_metrics(xr, x)
                yield RESULTS.file, result_row(spec, task.name, image, run, est, nfe=nfe, seconds=row_secs,
                                               peak_mem_mb=mem.mb, seed=seed if run.method not in CLASSICAL
                                               else "", **met)
                if spec.save_images:
                    save_png(spec.out / "images" / task.name / image / f"{run.label.replace(':', '-')}-{est}-"
                             f"{budget_str(run)}.png", xr[0].detach().cpu().clamp(0, 1))
                log(f"{label} [{est}] psnr {met['psnr']:.2f} ssim {met['ssim'] if met['ssim'] is not None else float('nan'):.3f} "
                    f"{secs:.1f}s")
        except Exception as e:  # noqa: BLE001 - a failing method is a row with a note, not a crashed benchmark
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            for est in ests:
                yield RESULTS.file, result_row(spec, task.name, image, run, est,
                                               nfe=0 if run.config is None else run.config.nfe, note=msg)
            log(f"{label}: FAILED {msg}")


class Grid(Protocol):
    """The local and paper protocols: the spec's tasks x images, every method at every budget."""

    tables = (RESULTS,)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.runs = method_runs(spec)
        refused = [why for r in self.runs if (why := noise_problem(r.label, spec.noise))]
        if refused:
            raise ValueError(f"noise {spec.noise}: {'; '.join(dict.fromkeys(refused))}")
        self.needs_prior = any(r.method in DIFFUSION_METHODS for r in self.runs)
        # hashed once (config.json and summary.md record the same); a classical-only grid uses no prior
        self.prior_info = prior_record(spec.prior) if self.needs_prior else None
        # bfloat16 and float32 rows differ: the resolved precision is part of what the folder's rows are
        self.precision = resolve_precision(spec.precision, device) if self.needs_prior else None
        self.all_tasks = task_specs(spec.protocol, spec.size, spec.boundary)
        unknown = [t for t in spec.tasks if t not in self.all_tasks]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(self.all_tasks)}")
        self.images = dict(load_images(spec))
        self.names = list(self.images)
        self.prior = None

    def record(self) -> dict[str, Any]:
        configs = {f"{r.label}@{budget_str(r)}": r.config for r in self.runs if r.config is not None}
        return folder_record(self.spec, configs, self.prior_info, self.precision)

    def cases(self) -> list[Case]:
        return [Case((t, n), (t, n), tuple((t, n, r.label, e, budget_str(r)) for r in self.runs
                                           for e in estimators(r, self.spec.samples)))
                for t in self.spec.tasks for n in self.names]

    def setup(self, group: Hashable, log: Callable[[str], None]) -> tuple:
        task, image = group
        return measurement(self.spec, self.all_tasks[task], image, self.images[image])

    def measure(self, ctx, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        spec, device = self.spec, self.device
        if self.needs_prior and self.prior is None:
            self.prior = load_bench_prior(spec, device)
            with torch.no_grad():  # warm-up call, so that the first timed method pays no set-up cost
                self.prior.denoise(torch.zeros(1, self.prior.channels, spec.size, spec.size, device=device),
                                   torch.ones(1, device=device))
        task, image = case.group
        yield from run_job(spec, self.all_tasks[task], image, ctx, self.runs, self.prior, device, done, log)

    def failed(self, row: Row) -> bool:
        return is_failed(row)

    def order(self, table: Table, cases) -> Callable[[Row], Any]:
        return row_order(self.spec, self.names)

    def header(self) -> dict[str, Any]:
        spec = self.spec
        h: dict[str, Any] = {}
        if self.prior_info is not None:
            h["prior"] = self.prior_info
            h["network precision"] = resolve_precision(spec.precision, self.device)
        else:
            h["prior"] = "none (classical methods only)"
        names = self.names
        h.update({
            "images": f"{len(names)} ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}), {spec.size}x{spec.size}"
                      + (f", centre crop {spec.size * spec.zoom} px area-averaged by {spec.zoom}"
                         if spec.protocol == "local" and not spec.images and spec.zoom > 1 else ""),
            **_noise_header(spec.noise),
            "preset / budgets": f"{spec.preset} / {', '.join(map(str, spec.budgets)) or 'preset NFE'}",
            "samples per image": spec.samples,
            "seed": spec.seed,
            "blur boundary": spec.boundary,
            "LPIPS": lpips_status()[1],
        })
        if spec.overrides:
            h["overrides"] = spec.overrides
        return h

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        spec, rows = self.spec, tables[RESULTS.file]
        notes = []
        for t in spec.tasks:  # the applicability notes of every rank's jobs
            ts = self.all_tasks[t]
            op = build_operator(ts.name, spec.size, 0, **ts.params)
            notes += [f"{t} / {r.label}: skipped, {why}" for r in self.runs if (why := not_applicable(r, op))]
        # the tables average over this run's images only (results.csv keeps every row of the folder)
        this_run = set(self.names)
        table_rows = [r for r in rows if r["image"] in this_run]
        others = sorted({r["image"] for r in rows} - this_run)
        if others:
            notes.append(f"results.csv also holds rows of {len(others)} image(s) not in this run "
                         f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); the tables leave them out")
        plots = make_plots(spec, table_rows, self.names, log) if spec.plots else []
        atomic_write_text(spec.out / "summary.md", summary_markdown(spec, table_rows, header, notes, plots))
        log(f"wrote {spec.out / 'results.csv'} ({len(rows)} rows) and {spec.out / 'summary.md'}")
        return {}


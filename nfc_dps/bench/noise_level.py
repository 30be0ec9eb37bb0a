"""How well ``sigma_y="auto"`` reads the noise level, and what its error costs (``--protocol noise_level``).

On the held-out photos (the local protocol's crops), for every standard task at Gaussian noise
levels from 0.002 to 0.1 (denoising also at 0: the photo as it came): the estimate of
:func:`nfc_dps.noise_level.measurement_sigma` against the true level, and NFC's default restored
with the estimate against the same restoration with the true level (same seed) and, for
denoising, against the photo itself. ``--methods estimate`` measures the estimates alone.

Rows (results.csv): task, sigma, image, estimate, ratio (estimate / sigma; empty at sigma 0),
psnr_true, psnr_auto, delta (psnr_auto - psnr_true), psnr_input (the measurement's own PSNR,
denoising only), seconds, note. PSNRs are capped at ``PSNR_CAP`` (an exact copy).

``--tasks poisson_gaussian`` is the shot-noise grid instead (its own results file, so its own
``--out``): denoising under Poisson-Gaussian noise over ``SHOT_PEAKS`` x ``SHOT_SIGMAS`` (read std 0:
Poisson alone), estimated with ``poisson-gaussian:auto`` (``poisson:auto`` at read std 0,
:func:`nfc_dps.noise_level.estimated_models`), NFC's default restored with the estimated model
against the true one. Rows (poisson_gaussian.csv): peak, sigma, image, est_peak, est_sigma,
peak_ratio, sigma_ratio (empty at sigma 0), psnr_input, psnr_true, psnr_auto, delta, seconds, note.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch

from ..api import restore
from ..metrics import psnr
from ..noise import EstimatedNoise, GaussianNoise, PoissonGaussianNoise, PoissonNoise
from ..noise_level import estimated_models, measurement_sigma
from ..operators import TASKS, build_operator
from ..restore_inputs import stable_seed
from .runner import Case, Protocol, Row, Table, folder_record, load_bench_prior, prior_record
from .tables import fmt
from .tier_tables import committed_rows, source_note, write_summary

RESULTS = Table("results.csv", ("task", "sigma", "image", "estimate", "ratio", "psnr_true", "psnr_auto", "delta",
                                "psnr_input", "seconds", "note"), ("task", "sigma", "image"), ("task", "sigma"))
SIGMAS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
#: denoising's levels: also the photo as it came (no noise added), which ``auto`` must not make worse
DENOISE_SIGMAS = (0.0,) + SIGMAS
#: the highest PSNR recorded, dB: an exact copy's (float rounding apart)
PSNR_CAP = 100.0
#: the standard tasks, as a photograph is measured (valid blur boundaries)
TASK_NAMES = ("denoise", "sr_bicubic", "deblur_gaussian", "deblur_motion", "inpaint_box", "inpaint_random", "colorize")
METHODS = ("estimate", "nfc")
#: the shot-noise grid's --tasks name, its peaks (photons at a clean value of 1) and read stds
SHOT_TASK = "poisson_gaussian"
SHOT_PEAKS = (10.0, 30.0, 100.0, 300.0, 1000.0)
SHOT_SIGMAS = (0.0, 0.005, 0.02)
SHOT_RESULTS = Table("poisson_gaussian.csv", ("peak", "sigma", "image", "est_peak", "est_sigma", "peak_ratio",
                                              "sigma_ratio", "psnr_input", "psnr_true", "psnr_auto", "delta",
                                              "seconds", "note"), ("peak", "sigma", "image"), ("peak", "sigma"))


def shot_noise(peak: float, sigma: float) -> tuple[PoissonNoise, EstimatedNoise]:
    """The true noise of a shot-noise cell and the estimated noise restore reads it with: Poisson
    alone (``poisson:auto``) at read std 0, else Poisson-Gaussian (``poisson-gaussian:auto``)."""
    if sigma == 0:
        return PoissonNoise(peak), EstimatedNoise("poisson")
    return PoissonGaussianNoise(peak, sigma), EstimatedNoise("poisson-gaussian")


def task_params(task: str, size: int) -> dict[str, Any]:
    """The task's parameters at ``size`` px: its defaults at 256, those that scale with the image
    (``Task.params_at``: a box's) scaled below."""
    scaled = TASKS[task].params_at
    return scaled(size) if scaled is not None and size < 256 else {}


class NoiseLevelTier(Protocol):
    """Per (task, sigma) a group of measurements; per image the estimate and, with ``nfc``, both
    restorations. With ``--tasks poisson_gaussian`` per (peak, read std) of the shot-noise grid."""

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self.shot = SHOT_TASK in spec.tasks
        self.tables = (SHOT_RESULTS,) if self.shot else (RESULTS,)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.tasks = self.chosen(spec.tasks, TASK_NAMES + (SHOT_TASK,), "--tasks", "tasks") if spec.tasks \
            else list(TASK_NAMES)
        if self.shot and len(self.tasks) > 1:
            raise ValueError(f"--tasks {','.join(self.tasks)}: {SHOT_TASK} is a grid of its own (its own results "
                             f"file, {SHOT_RESULTS.file}): run it alone, into its own --out")
        self.restores = "nfc" in self.chosen(spec.methods, METHODS, "--methods", "methods")
        self.names = self.photo_names()
        self.prior = load_bench_prior(spec, device) if self.restores else None
        self.prior_info = prior_record(spec.prior) if self.restores else None

    def record(self) -> dict[str, Any]:
        return folder_record(self.spec, {}, self.prior_info, self.prior.precision if self.prior else None)

    def cases(self) -> list[Case]:
        if self.shot:
            return [Case((str(p), str(s)), (SHOT_TASK, p, s), tuple((str(p), str(s), n) for n in self.names))
                    for s in SHOT_SIGMAS for p in SHOT_PEAKS]
        return [Case((t, str(s)), (t, s), tuple((t, str(s), n) for n in self.names)) for t in self.tasks
                for s in (DENOISE_SIGMAS if t == "denoise" else SIGMAS)]

    def row_labels(self, rows: Sequence[Row]) -> set[str]:
        """Rows hold no method column: "nfc" where a row has restorations (its prior is checked)."""
        if not rows:
            return set()
        return {"estimate"} | ({"nfc"} if any(str(r.get("psnr_true", "")) != "" for r in rows) else set())

    def setup(self, group: Hashable, log: Callable[[str], None] = print) -> SimpleNamespace:
        """The task's operator at this size, the truths x (N, 3, size, size) and seeded measurements y
        (the shot-noise grid's: denoising, under its cell's true noise)."""
        task, *level = group
        spec = self.spec
        zoom = spec.zoom if spec.size < 256 else 1
        x = self.photo_truths(self.names, zoom)
        name = "denoise" if self.shot else task
        op = build_operator(name, spec.size, seed=0, **task_params(name, spec.size)).to(self.device)
        gens = [torch.Generator(device=self.device).manual_seed(stable_seed(spec.seed, "noise-level", task, *level, n))
                for n in self.names]
        if self.shot:
            noise = shot_noise(*level)[0]
            return SimpleNamespace(peak=level[0], sigma=level[1], op=op, x=x, y=op.measure(x, noise=noise, generator=gens))
        return SimpleNamespace(task=task, sigma=level[0], op=op, x=x, y=op.measure(x, level[0], gens))

    def measure(self, c: SimpleNamespace, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        if self.shot:
            yield from self._measure_shot(c, done, log)
            return
        for i, name in enumerate(self.names):
            key = (c.task, str(c.sigma), name)
            if key in done:
                continue
            t0 = time.perf_counter()
            row: Row = {"task": c.task, "sigma": c.sigma, "image": name, "estimate": "", "ratio": "", "psnr_true": "",
                        "psnr_auto": "", "delta": "", "psnr_input": "", "note": ""}
            y = c.y[i:i + 1]
            try:
                est = measurement_sigma(y, c.op)[0]
                row.update(estimate=round(est, 6), ratio=round(est / c.sigma, 4) if c.sigma > 0 else "")
                truth = c.x[i:i + 1].double()
                if c.op.family == "denoise":  # the measurement is the image: its own PSNR
                    row["psnr_input"] = round(_capped_psnr(y, truth), 4)
                if self.restores:
                    seed = stable_seed(self.spec.seed, "noise-level-restore", c.task, name)
                    row.update(self._restored_both(y, c.op, truth, seed, GaussianNoise(c.sigma), GaussianNoise(est)))
            except Exception as e:  # noqa: BLE001 - a failing estimate or restoration is a noted row
                row["note"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            row["seconds"] = round(time.perf_counter() - t0, 2)
            yield RESULTS.file, row
        log(f"{c.task} sigma {c.sigma}: done")

    def _restored_both(self, y: torch.Tensor, op: Any, truth: torch.Tensor, seed: int, true: Any,
                       estimated: Any) -> dict[str, float]:
        """NFC's default on ``y`` with the true and with the estimated noise model (same seed): the
        row's psnr_true, psnr_auto and their difference."""
        scores = [_capped_psnr(restore(y, op, prior=self.prior, noise=m, seed=seed, progress=False).image.clamp(0, 1),
                               truth) for m in (true, estimated)]
        return {"psnr_true": round(scores[0], 4), "psnr_auto": round(scores[1], 4),
                "delta": round(scores[1] - scores[0], 4)}

    def _measure_shot(self, c: SimpleNamespace, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        """The shot-noise grid's rows of one (peak, read std): per image the estimated model and, with
        ``nfc``, NFC's default restored with it and with the true model (same seed)."""
        true, estimated = shot_noise(c.peak, c.sigma)
        for i, name in enumerate(self.names):
            if (str(c.peak), str(c.sigma), name) in done:
                continue
            t0 = time.perf_counter()
            row: Row = {"peak": c.peak, "sigma": c.sigma, "image": name, **{k: "" for k in SHOT_RESULTS.columns[3:]}}
            y, truth = c.y[i:i + 1], c.x[i:i + 1].double()
            try:
                row["psnr_input"] = round(_capped_psnr(y, truth), 4)
                model = estimated_models(y, c.op, estimated)[0]
                row.update(est_peak=round(model.peak, 3), peak_ratio=round(model.peak / c.peak, 4))
                if c.sigma > 0:
                    row.update(est_sigma=round(model.sigma, 6), sigma_ratio=round(model.sigma / c.sigma, 4))
                if self.restores:
                    seed = stable_seed(self.spec.seed, "noise-level-restore", SHOT_TASK, name)
                    row.update(self._restored_both(y, c.op, truth, seed, true, model))
            except Exception as e:  # noqa: BLE001 - a failing estimate or restoration is a noted row
                row["note"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            row["seconds"] = round(time.perf_counter() - t0, 2)
            yield SHOT_RESULTS.file, row
        log(f"{SHOT_TASK} peak {c.peak:g} sigma {c.sigma:g}: done")

    def header(self) -> dict[str, Any]:
        tasks = (f"denoise under {SHOT_TASK} noise, peaks {', '.join(f'{p:g}' for p in SHOT_PEAKS)} x read std "
                 f"{', '.join(f'{s:g}' for s in SHOT_SIGMAS)}" if self.shot else
                 "; ".join(f"{t} {task_params(t, self.spec.size) or ''}".strip() for t in self.tasks))
        return {"images": f"{', '.join(self.names)} ({self.spec.size} px)", "prior": self.prior_info or "none",
                "tasks": tasks}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        if self.shot:
            write_summary(self.spec.out, "Shot noise from the measurement", header,
                          shot_table(tables[SHOT_RESULTS.file]))
            return {}
        denoised = denoise_table(tables[RESULTS.file]) if self.restores and "denoise" in self.tasks else ""
        write_summary(self.spec.out, "Noise level from the measurement", header, noise_level_table(tables[RESULTS.file]),
                      denoised)
        return {}


def _capped_psnr(image: torch.Tensor, truth: torch.Tensor) -> float:
    """PSNR in dB of ``image`` against ``truth``, at most :data:`PSNR_CAP`."""
    return min(float(psnr(image.to(truth.device).double(), truth)), PSNR_CAP)


def _values(rows: list[Row], column: str) -> list[float]:
    return [float(r[column]) for r in rows if str(r.get(column, "")) not in ("", "nan")]


def noise_level_table(rows: list[Row]) -> str:
    """Per task (rows) and sigma (columns): the estimate's worst ratio to the truth over the images and,
    where restored, the mean PSNR change of restoring with the estimate; images whose estimate or
    restoration failed (a note) are counted in the cell, never left out silently."""
    tasks = [t for t in TASK_NAMES if any(r["task"] == t for r in rows)]
    sigmas = [s for s in SIGMAS if any(float(r["sigma"]) == s for r in rows)]  # sigma 0: denoise_table
    restored = any(str(r.get("delta", "")) != "" for r in rows)
    L = ["| task | " + " | ".join(f"σ {s:g}" for s in sigmas) + " |", "|---|" + "---|" * len(sigmas)]
    for t in tasks:
        cells = []
        for s in sigmas:
            mine = [r for r in rows if r["task"] == t and float(r["sigma"]) == s]
            ratios, deltas = _values(mine, "ratio"), _values(mine, "delta")
            failed = sum(1 for r in mine if str(r.get("note", "")).strip())
            if not ratios:
                cells.append(f"failed on {failed} of {len(mine)}" if failed else "–")
                continue
            worst = max(ratios, key=lambda v: abs(v - 1))
            cell = f"×{fmt(worst, '.2f')}"
            if restored and deltas:
                cell += f" ({fmt(float(np.mean(deltas)), '+.2f')} dB)"
            if failed:
                cell += f", failed on {failed} of {len(mine)}"
            cells.append(cell)
        L.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(L)


def denoise_table(rows: list[Row]) -> str:
    """Denoising with ``auto`` against the photo as it came, per sigma (columns): the mean PSNR of the
    measurement, of NFC's default with the estimate and with the true sigma, and the worst image's
    margin of the estimate's restoration over the measurement (>= 0: never worse than it came)."""
    rows = [r for r in rows if r["task"] == "denoise" and str(r.get("psnr_auto", "")) not in ("", "nan")]
    sigmas = [s for s in DENOISE_SIGMAS if any(float(r["sigma"]) == s for r in rows)]

    def cell(v: float) -> str:
        return f"≥ {PSNR_CAP:g}" if v >= PSNR_CAP else fmt(v, ".2f")

    L = ["| denoising | " + " | ".join(f"σ {s:g}" for s in sigmas) + " |", "|---|" + "---|" * len(sigmas)]
    for label, column in (("the photo as measured", "psnr_input"), ("NFC, σ auto", "psnr_auto"),
                          ("NFC, the true σ", "psnr_true")):
        L.append(f"| {label} | " + " | ".join(
            cell(float(np.mean(_values([r for r in rows if float(r["sigma"]) == s], column)))) for s in sigmas) + " |")
    margins = []
    for s in sigmas:
        mine = [r for r in rows if float(r["sigma"]) == s]
        margins.append(fmt(min(min(float(r["psnr_auto"]), PSNR_CAP) - min(float(r["psnr_input"]), PSNR_CAP)
                               for r in mine), "+.2f"))
    L.append("| auto over the photo, worst image (dB) | " + " | ".join(margins) + " |")
    return "\n".join(L)


def noise_level_doc_table(folder: Path, link: str) -> str:
    """The table from a committed run folder (results.csv, summary.md's header) with its source line."""
    rows, h, name = committed_rows(folder, RESULTS.file, RESULTS.columns, ("sigma", "ratio", "delta"))
    what = ("the estimate's ratio to the true σ, the worst over the images; in brackets the mean PSNR change "
            "of NFC's default restored with the estimate instead of the true σ" if any(r["delta"] != "" for r in rows)
            else "the estimate's ratio to the true σ, the worst over the images")
    return noise_level_table(rows) + f"\n\nPer cell: {what}. " + source_note(name, link, h, h.get("images", "?"))


def denoise_doc_table(folder: Path, link: str) -> str:
    """:func:`denoise_table` from a committed run folder with its source line."""
    rows, h, name = committed_rows(folder, RESULTS.file, RESULTS.columns, ("sigma", "psnr_input", "psnr_auto"))
    return (denoise_table(rows) + f"\n\nMean PSNR (dB) over {h.get('images', '?')}; the last row the smallest margin "
            f"of any image. " + source_note(name, link, h))


def _spread(values: list[float], spec: str) -> str:
    """The range of ``values`` (×min–max), one number where they agree to the format."""
    low, high = fmt(min(values), spec), fmt(max(values), spec)
    return f"×{low}" if low == high else f"×{low}–{high}"


def shot_table(rows: list[Row]) -> str:
    """The shot-noise grid per (peak, read std): the estimates' ratios to the truth over the images
    (their range), the mean PSNR of the measurement and of NFC's default with the true and the
    estimated model, and the PSNR change of the estimate (mean, worst image); failed images counted."""
    L = ["| peak | read σ | estimated peak | estimated read σ | measurement | NFC, true model | NFC, estimated "
         "| change (dB), mean (worst) |", "|---|---|---|---|---|---|---|---|"]
    for sigma in SHOT_SIGMAS:
        for peak in SHOT_PEAKS:
            mine = [r for r in rows if float(r["peak"]) == peak and float(r["sigma"]) == sigma]
            if not mine:
                continue
            ratios, sigmas, deltas = (_values(mine, c) for c in ("peak_ratio", "sigma_ratio", "delta"))
            failed = sum(1 for r in mine if str(r.get("note", "")).strip())
            cells = [_spread(ratios, ".2f") if ratios else "–",
                     "(Poisson alone)" if sigma == 0 else _spread(sigmas, ".2f") if sigmas else "–"]
            cells += [fmt(float(np.mean(v)), ".2f") if v else "–"
                      for v in (_values(mine, c) for c in ("psnr_input", "psnr_true", "psnr_auto"))]
            cells.append(f"{fmt(float(np.mean(deltas)), '+.2f')} ({fmt(min(deltas), '+.2f')})" if deltas else "–")
            if failed:
                cells[-1] += f", failed on {failed} of {len(mine)}"
            L.append(f"| {peak:g} | {sigma:g} | " + " | ".join(cells) + " |")
    return "\n".join(L)


def shot_doc_table(folder: Path, link: str) -> str:
    """:func:`shot_table` from a committed run folder with its source line."""
    rows, h, name = committed_rows(folder, SHOT_RESULTS.file, SHOT_RESULTS.columns,
                                   ("peak", "sigma", "peak_ratio", "sigma_ratio", "delta"))
    return (shot_table(rows) + "\n\nPer row: the estimate's ratio to the true peak and read std over the images "
            "(lowest–highest), the mean PSNR (dB) over them, and the PSNR change of NFC's default restored with the "
            "estimated model instead of the true one (mean, and the worst image). " + source_note(name, link, h, h.get("images", "?")))

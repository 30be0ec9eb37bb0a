"""Calibrate on one source, test on another: every interval rule refitted offline on the draws of
:mod:`nfc_dps.bench.calibration_shift` (``python -m nfc_dps.bench.shift_rules --out OUT``).

For each task and ordered pair of sources (A, B), the rule is fitted on A's tiles and measured on
B's; within a source (A = A) on :data:`FOLDS` folds (fitted on the others, measured on one, every
tile measured once). The edge weight c is chosen on the calibration tiles as ``calibrate`` does
(:func:`~nfc_dps.conformal.fit_rule`, pooled); then q by each rule of :data:`SHIFT_RULES`:

* ``pooled``: today's rule;
* ``weighted``: weighted conformal under covariate shift (:mod:`nfc_dps.conformal_shift`), the
  classifier fitted between A's tiles and the target tiles (B's, or the fold's), the ESS floored at
  :func:`~nfc_dps.conformal.min_images` by tempering, the target image's own weight at +infinity;
* ``reweighted``: the same weights without the target image's own weight: the pooled rule's
  estimate of the mean coverage, importance-weighted to the target images;
* ``scaled``: the score normalised by each image's mean spread to the fitted power;
* ``scaled_reweighted``: both.

A pair is *validation* when neither source is a test source
(:data:`~nfc_dps.bench.calibration_shift.TEST_SOURCES`), else *test*. Writes OUT/shift.csv (one
row per task, pair and rule: mean and 5th-percentile image coverage, mean width, ESS) and
OUT/shift.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..conformal import DEFAULT_EPS, fit_rule, min_images, spread
from ..conformal_shift import DEFAULT_L2, fit_scale_exponent, image_features, shift_weights, weighted_quantile
from ..io import atomic_write_text
from .calibration_shift import SOURCES, TASKS, TEST_SOURCES, load_source_chains, task_operator

__all__ = ["SHIFT_RULES", "FOLDS", "SHIFT_COLUMNS", "SourceData", "load_source", "pair_results", "shift_rows",
           "read_shift_csv", "shift_table", "shift_doc_table", "main"]

SHIFT_RULES = ("pooled", "weighted", "reweighted", "scaled", "scaled_reweighted")
#: per rule: (weights, the target image's own weight at +infinity, scaled scores)
RULE_PARTS = {"pooled": (False, False, False), "weighted": (True, True, False), "reweighted": (True, False, False),
              "scaled": (False, False, True), "scaled_reweighted": (True, False, True)}
FOLDS = 4
DEFAULT_COVERAGE = 0.9
SHIFT_COLUMNS = ("task", "l2", "calibration", "target", "split", "rule", "n_calibration", "n_target", "coverage",
                 "coverage_p5", "width", "ess", "tempering")


@dataclass
class SourceData:
    """One (task, source)'s tiles: mean, std, truth (N, C, H, W) float64 ([0, 1] units, the mean
    clamped as restore() does), their :func:`~nfc_dps.conformal_shift.image_features` (N, F), names (N,)."""

    mean: np.ndarray
    std: np.ndarray
    truth: np.ndarray
    features: np.ndarray
    names: np.ndarray

    def subset(self, index: np.ndarray) -> "SourceData":
        return SourceData(self.mean[index], self.std[index], self.truth[index], self.features[index], self.names[index])


def _meta(meta: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in meta.split())


def load_source(out: Path, task: str, source: str) -> SourceData:
    """A (task, source)'s saved draws (:func:`~nfc_dps.bench.calibration_shift.load_source_chains`)
    as restore() would report them, and their features."""
    z = load_source_chains(out, task, source)
    meta = _meta(str(z["meta"][0]))
    chains = torch.from_numpy(z["chains"]).double()
    mean, std = chains.mean(1).clamp(0, 1), chains.std(1)
    y = torch.from_numpy(z["y"]).double()
    features = np.vstack([image_features(mean[i:i + 1], std[i:i + 1], y[i:i + 1],
                                         task_operator(task, int(meta["size"]), int(meta["seed"]), source, i))
                          for i in range(len(mean))])
    return SourceData(mean.numpy(), std.numpy(), z["truth"].astype(np.float64), features, z["names"])


@dataclass(frozen=True)
class PairResult:
    """Per target image: covered fraction and mean width (m,); the weights' ESS and tempering (nan
    for rules without weights)."""

    covered: np.ndarray
    width: np.ndarray
    ess: float
    tempering: float


def pair_results(cal: SourceData, target: SourceData, rule: str, coverage: float = DEFAULT_COVERAGE,
                 l2: float = DEFAULT_L2) -> PairResult:
    """The rule (module doc) fitted on ``cal``, measured on ``target``; ``l2``: the classifier's penalty."""
    weighted, test_mass, scaled = RULE_PARTS[rule]
    fit = fit_rule(list(zip(cal.mean, cal.std, cal.truth)), coverage, "pooled")
    c = fit.edge_weight
    u_cal = [spread(m, s, DEFAULT_EPS, c) for m, s in zip(cal.mean, cal.std)]
    u_target = [spread(m, s, DEFAULT_EPS, c) for m, s in zip(target.mean, target.std)]
    scores = [np.abs(x - m) / u for x, m, u in zip(cal.truth, cal.mean, u_cal)]
    scale_cal, scale_target = np.ones(len(cal.mean)), np.ones(len(target.mean))
    if scaled:
        d_cal = np.array([u.mean() for u in u_cal])
        beta = fit_scale_exponent(scores, d_cal, coverage)
        scale_cal = d_cal ** beta
        scale_target = np.array([u.mean() for u in u_target]) ** beta
        scores = [s / k for s, k in zip(scores, scale_cal)]
    ess, tempering = float("nan"), float("nan")
    if weighted:
        w = shift_weights(cal.features, target.features, l2, ess_floor=min_images(coverage))
        qs = [weighted_quantile(scores, w.calibration, coverage, wt if test_mass else 0.0) for wt in w.target]
        ess, tempering = w.ess, w.tempering
    else:
        qs = [fit.q if rule == "pooled" else weighted_quantile(scores, np.ones(len(scores)), coverage)] * len(u_target)
    covered, width = [], []
    for m, u, x, q, k in zip(target.mean, u_target, target.truth, qs, scale_target):
        half = np.full_like(u, np.inf) if not np.isfinite(q) else q * k * u
        lo, hi = np.clip(m - half, 0, 1), np.clip(m + half, 0, 1)
        covered.append(float(np.mean((x >= lo) & (x <= hi))))
        width.append(float(np.mean(hi - lo)))
    return PairResult(np.array(covered), np.array(width), ess, tempering)


def _folds(n: int, folds: int = FOLDS) -> list[np.ndarray]:
    """Interleaved folds of range(n): tile i in fold i % folds."""
    return [np.arange(f, n, folds) for f in range(folds)]


def _pooled_over(results: Sequence[PairResult]) -> PairResult:
    return PairResult(np.concatenate([r.covered for r in results]), np.concatenate([r.width for r in results]),
                      float(np.mean([r.ess for r in results])), float(np.mean([r.tempering for r in results])))


def shift_rows(data: dict[str, dict[str, SourceData]], rules: Sequence[str] = SHIFT_RULES,
               coverage: float = DEFAULT_COVERAGE, l2: float = DEFAULT_L2) -> list[dict[str, Any]]:
    """Rows of shift.csv (module doc) from {task: {source: SourceData}}."""
    rows = []
    for task, sources in data.items():
        for a in sources:
            for b in sources:
                split = "test" if a in TEST_SOURCES or b in TEST_SOURCES else "validation"
                for rule in rules:
                    if a == b:
                        n = len(sources[a].mean)
                        parts = [pair_results(sources[a].subset(np.setdiff1d(np.arange(n), f)), sources[a].subset(f),
                                              rule, coverage, l2) for f in _folds(n)]
                        res, n_cal = _pooled_over(parts), n - n // FOLDS
                    else:
                        res, n_cal = pair_results(sources[a], sources[b], rule, coverage, l2), len(sources[a].mean)
                    rows.append({"task": task, "l2": l2, "calibration": a, "target": b, "split": split, "rule": rule,
                                 "n_calibration": n_cal, "n_target": len(res.covered),
                                 "coverage": float(res.covered.mean()),
                                 "coverage_p5": float(np.percentile(res.covered, 5)),
                                 "width": float(res.width.mean()), "ess": res.ess, "tempering": res.tempering})
    return rows


def write_shift_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SHIFT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
    atomic_write_text(path, buffer.getvalue())


def read_shift_csv(path: Path) -> list[dict[str, Any]]:
    """shift.csv's rows, the measures as floats and the counts as ints."""
    with open(path, newline="") as f:
        return [{k: (int(v) if k in ("n_calibration", "n_target") else
                     float(v) if k in SHIFT_COLUMNS[8:] or k == "l2" else v) for k, v in row.items()} for row in csv.DictReader(f)]


def shift_table(rows: Sequence[dict[str, Any]], rules: Sequence[str] = SHIFT_RULES) -> str:
    """Markdown: one line per task and ordered pair (the split, then per rule: mean % · 5th-percentile
    image % · width, the weighted rule's ESS), the target source's within-source pooled figures beside."""
    by = {(r["task"], r["calibration"], r["target"], r["rule"]): r for r in rows}
    head = ["task", "calibrated on → tested on", "split"] + [f"{r}: mean · p5 · width" for r in rules]
    head += ["ESS (reweighted)", "within target, pooled: mean · p5 · width"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pairs = sorted({k[:3] for k in by}, key=lambda k: (TASKS.index(k[0]) if k[0] in TASKS else 99,
                                                      k[1] != k[2], SOURCES.index(k[1]), SOURCES.index(k[2])))
    def cell(r: dict[str, Any] | None) -> str:
        return "" if r is None else f"{100 * r['coverage']:.1f} · {100 * r['coverage_p5']:.1f} · {r['width']:.3f}"
    for task, a, b in pairs:
        weighted = by.get((task, a, b, "reweighted"))
        line = [task, f"{a} → {b}", by[(task, a, b, rules[0])]["split"]] + [cell(by.get((task, a, b, r))) for r in rules]
        line += ["" if weighted is None else f"{weighted['ess']:.1f}", cell(by.get((task, b, b, "pooled")))]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


def shift_doc_table(folder: Path, link: str) -> str:
    """The docs' table (:func:`shift_table`) of ``folder``/shift.csv, its legend and source (``link``:
    the prefix of ``folder`` relative to the page)."""
    rows = read_shift_csv(folder / "shift.csv")
    nominal = ", ".join(sorted({f"{r['l2']:g}" for r in rows}))
    return (shift_table(rows) + "\n"
            + "mean: the mean over the target tiles of each tile's covered fraction of pixel values (%); p5: the "
              "5th-percentile tile (%); width: the mean of upper − lower ([0, 1] units); calibrated on → tested on: "
              "fitted on every tile of the first source, measured on every tile of the second; a source against "
              f"itself: {FOLDS} folds (fitted on the others, every tile measured once). ESS: the reweighted rule's "
              f"effective sample size after the floor (the classifier's L2 penalty {nominal}). test: a pair with the "
              "held-out photographs, never used to choose a rule. Source: "
              f"[`{folder.name}/shift.csv`]({link}{folder.name}/shift.csv).")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nfc_dps.bench.shift_rules", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="a folder of python -m nfc_dps.bench.calibration_shift")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--sources", default=",".join(SOURCES))
    p.add_argument("--coverage", type=float, default=DEFAULT_COVERAGE)
    p.add_argument("--l2", type=float, default=DEFAULT_L2, help="the classifier's L2 penalty")
    a = p.parse_args(argv)
    data = {t: {s: load_source(a.out, t, s) for s in a.sources.split(",")} for t in a.tasks.split(",")}
    rows = shift_rows(data, coverage=a.coverage, l2=a.l2)
    write_shift_csv(a.out / "shift.csv", rows)
    atomic_write_text(a.out / "shift.md", shift_table(rows))
    print(shift_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Refit the calibrated interval on the draws a calibration run kept, without sampling again.

``nfc-dps bench --protocol calibration`` keeps, per embedded (setting, method), every tile's K
chains and truth in OUT/chains/SETTING_METHOD@BUDGET.npz. This fits an interval rule on the
validation draws and measures it on the test draws, as the protocol's conformal.csv does, for
another rule or another set of edge weights:

    python scripts/refit_intervals.py runs/conformal_inpaint_random
    python scripts/refit_intervals.py runs/conformal_inpaint_random --rule risk-control --edge-weights 0,2,8,32

Prints one line per (file, K): the fitted q and edge weight c, the coverage of the validation
tiles (in sample) and of the test tiles, and the test interval's mean width. Choose a rule on the
validation columns only; the test column is what gets reported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from nfc_dps.bench.calibration import conformal_rows, interval_stats
from nfc_dps.conformal import EDGE_WEIGHTS, RULES


def load_draws(path: Path) -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """{split: (per measurement (K, B, C, H, W) float64 chains, per measurement (B, C, H, W) truth)}."""
    with np.load(path) as saved:
        return {split: ([torch.from_numpy(a).double() for a in saved[f"{split}_chains"]],
                        [torch.from_numpy(a).double() for a in saved[f"{split}_truth"]])
                for split in ("validation", "test")}


def refit(path: Path, coverage: float, rule: str, edge_weights: list[float]) -> list[dict]:
    """conformal.csv's rows for one saved file, plus the in-sample coverage of the validation tiles."""
    draws = load_draws(path)
    (v_xs, v_truth), (t_xs, t_truth) = draws["validation"], draws["test"]
    rows = conformal_rows(path.stem, "", 0, v_xs, v_truth, t_xs, t_truth, coverage, clip=True, rule=rule,
                          edge_weights=edge_weights)
    for row in rows:
        k = row["k"]
        row["validation_coverage"] = interval_stats([xs[:k] for xs in v_xs], v_truth, row["q"], 1.0, True,
                                                    row["edge_weight"])["coverage"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a calibration run's --out folder (it holds chains/)")
    parser.add_argument("--coverage", type=float, default=0.9, help="the interval's target coverage (default 0.9)")
    parser.add_argument("--rule", choices=RULES, default="pooled", help="how q is fitted (default pooled)")
    parser.add_argument("--edge-weights", default=",".join(f"{c:g}" for c in EDGE_WEIGHTS),
                        help="comma-separated edge weights c to choose from (default: the library's)")
    args = parser.parse_args(argv)
    files = sorted((args.run / "chains").glob("*.npz"))
    if not files:
        parser.error(f"no saved draws in {args.run / 'chains'} (a calibration run with an embedded-* setting keeps them)")
    try:
        weights = [float(c) for c in args.edge_weights.split(",")]
    except ValueError:
        parser.error(f"--edge-weights must be comma-separated numbers, got {args.edge_weights!r}")
    print(f"{'draws':<44} {'K':>3} {'q':>7} {'c':>5} {'valid %':>8} {'test %':>7} {'width':>7}")
    for path in files:
        for row in refit(path, args.coverage, args.rule, weights):
            print(f"{path.stem:<44} {row['k']:>3} {row['q']:>7.3f} {row['edge_weight']:>5g} "
                  f"{100 * row['validation_coverage']:>8.1f} {100 * row['coverage']:>7.1f} {row['width']:>7.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Calibration of the K-sample std map: coverage table and reliability plot (nfc_dps/bench/calibration.py).

    python scripts/calibration.py --out runs/bench/calibration --threads 1
    python scripts/calibration.py --out runs/cal_quick --settings gaussian --budgets 20 --methods nfc,daps

Writes OUT/calibration.csv, OUT/conformal.csv, OUT/summary.md and OUT/reliability.png (see
docs/benchmarks.md and docs/uncertainty.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nfc_dps.bench.calibration import DEFAULT_SAMPLES, DEFAULT_SETTINGS, DEFAULT_VALIDATION_IMAGES, run_calibration


def _list(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--settings", type=_list, default=DEFAULT_SETTINGS,
                    help=f"comma list (default {','.join(DEFAULT_SETTINGS)}); gaussian, mixture-<setting of the "
                         f"mixture protocol>, embedded-<local task>")
    ap.add_argument("--budgets", type=lambda s: tuple(int(v) for v in _list(s)), default=(20, 100),
                    help="NFE budgets on the oracles (default 20,100)")
    ap.add_argument("--embedded-budget", type=int, default=20, help="NFE budget on the embedded prior (default 20)")
    ap.add_argument("--samples", "-k", type=int, default=DEFAULT_SAMPLES, help="chains per measurement K (default 16)")
    ap.add_argument("--methods", type=_list, default=(), help="registry names to run (default: every stochastic one)")
    ap.add_argument("--prior", default=None, help="prior folder for the embedded settings (default: the embedded prior)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=64, help="embedded images' size in px (default 64)")
    ap.add_argument("--validation-images", type=int, default=DEFAULT_VALIDATION_IMAGES,
                    help=f"embedded validation tiles (of chelsea, camera) the calibrated interval is fitted on "
                         f"(default {DEFAULT_VALIDATION_IMAGES}; 0: no calibrated interval on the embedded prior)")
    ap.add_argument("--test-images", type=int, default=2,
                    help="embedded test tiles (of astronaut, coffee; the first two are their centre crops, default 2)")
    ap.add_argument("--coverage", type=float, default=0.9, help="target coverage of the calibrated interval (default 0.9)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.samples < 4 or args.samples % 4:
        ap.error(f"--samples must be a multiple of 4 (K = 4 is measured on groups of 4), got {args.samples}")
    if args.threads:
        torch.set_num_threads(args.threads)
    run_calibration(args.out, args.settings, args.budgets, args.embedded_budget, args.samples, args.methods,
                    args.prior, args.seed, embedded_size=args.size, validation_images=args.validation_images,
                    test_images=args.test_images, coverage=args.coverage)
    return 0


if __name__ == "__main__":
    sys.exit(main())

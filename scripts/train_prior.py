#!/usr/bin/env python
"""Train an EDM prior: a thin wrapper over :func:`nfc_dps.training.train_prior` (``nfc-dps train-prior``).

Same flags as ``nfc-dps train-prior`` (see its --help and docs/prior.md), plus the earlier
script's ``--hours`` (wall time of this invocation) and ``--threads``; without --steps, --minutes
or --hours it trains until stopped (SIGTERM or Ctrl-C save first). Work folders written by the
earlier version of this script (state.pt with model, ema, opt, step, rng, torch_rng, args) resume.

    python scripts/train_prior.py --workdir runs/prior --hours 2 --export assets/default_prior
    python scripts/train_prior.py --workdir runs/prior2 --init-from assets/default_prior --hours 2 \\
        --export runs/prior2/export --device cuda
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nfc_dps.training import TrainingError, train_prior
from nfc_dps.training.args import add_arguments, config_from_args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, workdir_default=Path("runs/prior"))
    ap.add_argument("--hours", type=float, default=None, help="stop after this much wall time in this run")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.hours is not None:
        if args.minutes is not None:
            ap.error("give --hours or --minutes, not both")
        args.minutes = args.hours * 60
    if args.steps is None and args.minutes is None:
        args.steps = 10**9  # as before: until stopped
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        train_prior(config_from_args(args, args.device, progress=not args.quiet))
    except TrainingError as e:
        print(f"train_prior.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("train_prior.py: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``nfc-dps prior-report``: the wiring of :mod:`nfc_dps.bench.prior_report` (one-step denoising of a
prior folder against tuned TV and wavelet baselines) and the summary of a training loss log."""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
from pathlib import Path

from ..bench.prior_report import SIGMAS, ReportError, ReportSettings, prior_report
from ..bench.prior_report_markdown import loss_table
from ..io import atomic_write_text
from ..priors.diffusers_prior import PRECISIONS
from ..training.plot import read_loss_csv, render_loss_png
from .common import EXIT_OK, Log, UsageError
from .outputs import cannot_write, check_output_file

EXAMPLES = """examples:
  nfc-dps prior-report                                   # the embedded default prior
  nfc-dps prior-report --prior runs/prior/export --markdown
  nfc-dps prior-report --loss-only --loss-csv runs/prior/loss.csv --loss-png docs/prior_loss.png

The protocol is in the docstring of nfc_dps.bench.prior_report and in docs/prior.md ("Denoising report").
Wavelet denoising needs PyWavelets (pip install 'nfc_dps[bench]'); without it that baseline is
skipped and the report says so."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``prior-report`` subcommand and its arguments."""
    p = sub.add_parser("prior-report", help="one-step denoising report of a prior folder vs tuned TV and wavelet",
                       description="Denoise held-out photos in one prior call at fixed noise levels and compare with "
                                   "TV and wavelet denoising tuned on training crops; time a 256 x 256 forward pass.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("--prior", type=Path, default=None, help="prior folder (default: the embedded one)")
    p.add_argument("--label", default="", help="free text recorded with the prior (e.g. a checkpoint name)")
    p.add_argument("--tile", type=int, default=None, help="tile size for the overlap row when the prior is not tiled")
    p.add_argument("--sigmas", type=float, nargs="+", default=list(SIGMAS), help="noise levels in [0, 1] units")
    p.add_argument("--crop", type=int, default=256, help="centre crop of the held-out images (0 = whole images)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tune-crop", type=int, default=128, help="size of the training crops used to tune TV/wavelet")
    p.add_argument("--tune-per-image", type=int, default=2, help="tuning crops per training photo")
    p.add_argument("--timing-runs", type=int, default=5)
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="the network's compute precision (auto: bfloat16 where the CPU/GPU has it natively)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--no-overlap", action="store_true", help="skip the overlap=True row (4x the cost)")
    p.add_argument("--no-whole", action="store_true", help="skip the untiled reference row")
    p.add_argument("--out", type=Path, default=Path("prior_report.json"),
                   help="JSON with all numbers and the table (default ./prior_report.json)")
    p.add_argument("--markdown", action="store_true", help="print the full markdown section (table and notes) for docs")
    p.add_argument("--loss-csv", type=Path, default=None, help="train-prior's loss log (loss.csv) to summarise")
    p.add_argument("--loss-png", type=Path, default=None, help="render the loss curve here (PIL)")
    p.add_argument("--loss-every", type=int, default=500, help="loss table row every this many steps")
    p.add_argument("--loss-only", action="store_true", help="only the loss summary/plot, no denoising")
    p.set_defaults(func=functools.partial(cmd_prior_report, parser=p))


def command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command that reproduces ``args``: ``nfc-dps prior-report`` and the flags that differ
    from their defaults (recorded in the report)."""
    words = ["nfc-dps", "prior-report"]
    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public list
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        words.append(action.option_strings[0])
        if action.nargs != 0:
            words += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return shlex.join(words)


def summarise_loss(args, log: Log) -> None:
    """``--loss-csv``: the loss table on stdout, and the curve as a PNG with ``--loss-png``."""
    import numpy as np

    if not args.loss_csv.is_file():
        raise UsageError(f"--loss-csv {args.loss_csv}: no such file")
    rows = read_loss_csv(args.loss_csv)
    print(loss_table(rows, args.loss_every))
    if rows:
        r = rows[-1]
        print(f"\n{r['step']} steps in {r['hours']:.2f} h; median {np.median([x['crops_per_s'] for x in rows]):.1f} crops/s")
    if args.loss_png is not None and rows:
        render_loss_png(rows, args.loss_png, f"EDM training loss ({args.loss_csv}, {rows[-1]['step']} steps)")
        log.info(f"wrote {args.loss_png}")


def cmd_prior_report(args, parser: argparse.ArgumentParser) -> int:
    """Run ``prior-report``: the loss summary, then the denoising report (unless ``--loss-only``)
    written to ``--out`` as JSON, its table (or with ``--markdown`` its whole section) on stdout."""
    import torch

    log = Log(False)
    for flag, value, low in (("--timing-runs", args.timing_runs, 1), ("--crop", args.crop, 0),
                             ("--tune-crop", args.tune_crop, 1), ("--tune-per-image", args.tune_per_image, 1),
                             ("--loss-every", args.loss_every, 1), ("--threads", args.threads, 0)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    bad = [s for s in args.sigmas if not 0 < s < 1]
    if bad:
        raise UsageError(f"--sigmas: noise levels lie in (0, 1) ([0, 1] units, e.g. 0.05 0.1 0.2), got {bad[0]:g}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.loss_csv is not None:
        summarise_loss(args, log)
    if args.loss_only:
        return EXIT_OK
    if args.prior is not None and not args.prior.is_dir():
        raise UsageError(f"--prior {args.prior}: no such folder")
    check_output_file(args.out, "--out")
    settings = ReportSettings(
        prior=args.prior, label=args.label, tile=args.tile, sigmas=tuple(args.sigmas), crop=args.crop, seed=args.seed,
        tune_crop=args.tune_crop, tune_per_image=args.tune_per_image, timing_runs=args.timing_runs,
        precision=args.precision, overlap=not args.no_overlap, whole=not args.no_whole,
        command=command_line(parser, args))
    try:
        report = prior_report(settings, log=log.info)
    except ReportError as e:
        raise UsageError(str(e)) from e
    try:
        atomic_write_text(args.out, json.dumps(report, indent=1))
    except OSError as e:  # the disk filled meanwhile: the report is not lost
        print(report["markdown"])
        raise UsageError(f"--out {args.out}: {cannot_write(e)} (the report is printed above)") from e
    log.info(f"wrote {args.out} ({report['wall_seconds']:.0f} s)")
    if args.markdown:
        print(report["markdown"])
    else:
        print("\n".join(report["markdown"].split("\n\n")[0:1]))
        a = report["acceptance"]
        print(f"\nacceptance: denoise margin {'PASS' if a['denoise_margin'] else 'FAIL'}, "
              f"speed {'PASS' if a['speed'] else 'FAIL'} ({report['timing']['tiled']['median_s']:.2f} s)")
    sys.stdout.flush()
    return EXIT_OK

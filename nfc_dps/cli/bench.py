"""``nfc-dps bench``: the wiring of :mod:`nfc_dps.bench`, which owns the options
(:mod:`nfc_dps.bench.cli`) and the run."""

from __future__ import annotations

import argparse

from ..bench.cli import run_from_args
from .common import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` subcommand (a stub naming the reason when the harness cannot be imported)."""
    try:
        from ..bench import cli as benchmark
    except Exception as e:  # noqa: BLE001 - a broken optional module must not break the other commands
        bench_error = str(e)
        b = sub.add_parser("bench", help="benchmarks (unavailable in this installation)")
        b.set_defaults(func=lambda a: _unavailable("bench", bench_error))
    else:
        b = sub.add_parser("bench", help="PSNR/SSIM tables vs peers and classical baselines (docs/benchmarks.md)",
                           description="See docs/benchmarks.md. "
                                       "`nfc-dps bench report` regenerates the docs' tables from the "
                                       "committed result files.")
        benchmark.build_parser(b)
        b.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    """Run ``bench``: :func:`nfc_dps.bench.cli.run_from_args`."""
    return run_from_args(args)


def _unavailable(command: str, reason: str) -> int:
    """The ``bench`` stub's action: a UsageError naming why the harness is missing."""
    raise UsageError(f"{command} is not available in this installation ({reason})")

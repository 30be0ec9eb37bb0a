"""Flags that several subcommands share: device / threads / quiet, the network's precision, and the
task flags of ``restore`` and ``simulate``."""

from __future__ import annotations

import argparse

from ..config import DEFAULT_NOISE_SIGMA
from ..priors.diffusers_prior import PRECISIONS
from ..operators import TASKS


def common_flags(p: argparse.ArgumentParser) -> None:
    """--device, --threads, --quiet."""
    p.add_argument("--device", default=None, help="torch device: cpu (default), cuda, cuda:1, mps")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or info messages (errors still shown)")


def precision_flag(p: argparse.ArgumentParser) -> None:
    """--precision of the prior network."""
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="the prior network's compute precision (default auto: bfloat16 where the CPU or GPU has it "
                        "natively, about 2x faster; float32 otherwise)")


def task_flags(p: argparse.ArgumentParser, seed_help: str) -> None:
    """--task, --config, --param, --noise-sigma and --seed (its help: ``seed_help``)."""
    p.add_argument("--task", choices=list(TASKS), help="task name (its default parameters), or use --config")
    p.add_argument("--config", "-c", action="append", metavar="FILE",
                   help="YAML/JSON config: a task (configs/deblur_gaussian.yaml), a sampler (configs/nfc_fast.yaml), "
                        "a resolved_config.json or a simulation.json; repeatable, later files win, flags win over files")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="operator parameter, e.g. --param kernel_size=25 (repeatable)")
    p.add_argument("--noise-sigma", type=float, default=None,
                   help=f"measurement noise std in [0, 1] pixel units (default {DEFAULT_NOISE_SIGMA}; "
                        f"DPS/DAPS's 0.05 in [-1, 1] units is 0.025 here)")
    p.add_argument("--seed", type=int, default=None, help=seed_help)

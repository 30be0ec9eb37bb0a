"""Flags that several subcommands share: device / threads / quiet, the prior and its precision, the
task flags of ``restore``, ``simulate`` and ``calibrate``, and the sampler flags of ``restore`` and
``calibrate``."""

from __future__ import annotations

import argparse

from ..config import DEFAULT_NOISE_SIGMA
from ..operators import TASKS
from ..priors.diffusers_prior import PRECISIONS
from ..samplers import METHODS


def noise_sigma_value(text: str) -> float | str:
    """``--noise-sigma``: a number, or ``auto`` (estimated per image by restore)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1] or 'auto', got {text!r}") from None

def common_flags(p: argparse.ArgumentParser) -> None:
    """--device, --threads, --quiet."""
    p.add_argument("--device", default=None, help="torch device: cpu (default), cuda, cuda:1, mps")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bars, info messages or notes on single images (errors, and restore's final "
                        "line of counts and mean PSNR, still shown)")


def prior_flags(p: argparse.ArgumentParser) -> None:
    """--prior and the --precision of its network."""
    p.add_argument("--prior", default=None,
                   help="diffusers prior folder, or module:function (a Python factory that returns a Prior; "
                        "default: the embedded prior)")
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
                   help="operator parameter, e.g. --param kernel_size=25 (repeatable); the blur tasks' boundary "
                        "is valid, a photograph's, unless --param boundary=circular or reflect")
    p.add_argument("--noise-sigma", type=noise_sigma_value, default=None,
                   help=f"measurement noise std in [0, 1] pixel units (default {DEFAULT_NOISE_SIGMA}; "
                        f"DPS/DAPS's 0.05 in [-1, 1] units is 0.025 here); restore: auto estimates it per image "
                        f"from the measurement (results.csv's noise_sigma column)")
    p.add_argument("--noise", default=None, metavar="KIND:VALUES",
                   help="measurement noise model: gaussian:SIGMA, poisson:PEAK (counts / PEAK: PEAK photons at a "
                        "clean value of 1) or poisson-gaussian:PEAK,SIGMA (default gaussian at --noise-sigma); "
                        "restore: poisson:auto and poisson-gaussian:auto estimate them per image (results.csv's "
                        "noise column)")
    p.add_argument("--seed", type=int, default=None, help=seed_help)


def sampler_flags(p: argparse.ArgumentParser, preset_help: str) -> None:
    """--method, --preset (its help: ``preset_help``), --steps and --set."""
    p.add_argument("--method", choices=sorted(METHODS), default=None,
                   help="sampler (default nfc); switching away from a --config file's method starts from the "
                        "new method's default preset and drops that file's sampler fields")
    p.add_argument("--preset", default=None, help=preset_help)
    p.add_argument("--steps", type=int, default=None, help="annealing levels / sampler steps (overrides the preset)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="sampler field of the preset, e.g. --set prior_weight=0.3 (nfc deterministic) or "
                        "--set band.cutoff_start=0.5 (nfc fast) (repeatable)")

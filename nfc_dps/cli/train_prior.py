"""``nfc-dps train-prior``: the wiring of :mod:`nfc_dps.training`, which owns the options
(:mod:`nfc_dps.training.args`) and the run."""

from __future__ import annotations

import argparse

from ..distributed import init_distributed, resolve_device, shutdown
from ..training import TrainingError, train_prior
from ..training.args import EXAMPLES, add_arguments, config_from_args
from .common import EXIT_OK, Log, UsageError, parse_device, set_threads
from .flags import common_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``train-prior`` subcommand: the training package's arguments plus the common flags."""
    t = sub.add_parser("train-prior", help="train a diffusion prior on the package photos or your own images",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
                       description="Train an EDM denoiser (a prior folder for --prior) on CPU or GPU; resumable.")
    add_arguments(t)
    common_flags(t)
    t.set_defaults(func=cmd_train_prior)


def cmd_train_prior(args) -> int:
    """Run ``train-prior``: :func:`nfc_dps.training.train_prior` with the parsed options."""
    set_threads(args.threads)
    device = parse_device(args.device)
    dist = init_distributed(str(device))  # under torchrun: one model, gradients averaged over the ranks
    if dist.world > 1 and device.type == "cuda" and device.index is not None:
        raise UsageError(f"--device {args.device} under torchrun: every rank would train on that one GPU; give "
                         f"--device cuda (each rank takes its own)")
    if dist.world > 1 and device.type == "cuda" and device.index is None:  # one GPU per rank
        device = resolve_device("cuda", dist)
    log = Log(args.quiet or dist.rank > 0)
    warn = log.error if dist.rank == 0 else (lambda msg: None)  # one voice: rank 0's
    try:
        train_prior(config_from_args(args, str(device), progress=not args.quiet), log=log.info, warn=warn,
                    dist=dist)
    except TrainingError as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # an export or log file that cannot be written (full disk, permissions)
        raise UsageError(f"cannot write {e.filename or ''}: {e.strerror or e}; the last saved state is kept") from e
    finally:
        shutdown()
    return EXIT_OK

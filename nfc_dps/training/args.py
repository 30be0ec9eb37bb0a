"""Command-line flags of ``nfc-dps train-prior``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..priors.archs import ARCHS
from .config import TrainConfig
from .data import DEFAULT_SCALES
from .leaves import SYNTHETIC

EXAMPLES = """examples:
  nfc-dps train-prior --workdir runs/ct --images scans/ --channels 1 --minutes 60 --export priors/ct
  nfc-dps train-prior --workdir runs/ct --images scans/ --minutes 60 --export priors/ct   # resumes
  nfc-dps train-prior --workdir runs/p2 --init-from assets/default_prior --steps 2000 --export runs/p2/export
then restore with --prior priors/ct, or nfc_dps.load_prior("priors/ct").

The work folder holds state.pt (model, EMA, optimiser, step, RNG; saved atomically every
--save-every steps and on exit or SIGTERM; after a crash or SIGKILL the same command resumes from
the last save), loss.csv, loss.png, heldout.csv and train_config.json. A work folder is bound to
its network, crop, channels and data: other settings there are refused, naming the keys."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 48,96,192; got {text!r}") from None
    return vals


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, e.g. 1,0.5; got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser, workdir_default: Path | None = None) -> None:
    """The training flags (not --device, --threads, --quiet: the caller adds its own)."""
    p.add_argument("--workdir", "-w", type=Path, required=workdir_default is None, default=workdir_default,
                   help="work folder: resumable state, logs, plot" + (f" (default {workdir_default})" if workdir_default else ""))
    p.add_argument("--images", "-i", type=Path, default=None,
                   help="folder of training images (recursive; any size, gray or RGB, 8/16-bit). Default: the "
                        "built-in package photos (scikit-image) plus dead leaves; their held-out photos are never used")
    p.add_argument("--export", "-o", type=Path, default=None,
                   help="write the EMA prior folder here at every save (load_prior(OUT), --prior OUT) and print its "
                        "held-out denoising PSNR")
    p.add_argument("--steps", type=int, default=None,
                   help="stop at this total step count (0 with --export: export the saved state's or --init-from's "
                        "weights without training)")
    p.add_argument("--minutes", type=float, default=None, help="stop after this many minutes in this run")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="what --minutes counts: wall time (default) or this process's CPU time (equal-effort comparisons)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=None,
                   help="1 (gray) or 3 (RGB); default: 1 when every image is gray, else 3 (RGB -> BT.601 luma for 1)")
    p.add_argument("--arch", choices=ARCHS, default=None,
                   help="network design (default unet: GroupNorm + attention, applied in tiles; unet-pixelnorm: "
                        "per-pixel norms, no attention, output independent of the image size)")
    p.add_argument("--widths", type=_ints, default=None, help="channels per resolution level (default 48,96,192)")
    p.add_argument("--layers", type=int, default=None, help="ResNet layers per block (default 1)")
    p.add_argument("--crop", type=int, default=None, help="training crop in pixels, also the tile (default 48)")
    p.add_argument("--batch", type=int, default=32, help="crops per step (default 32; a GPU takes hundreds)")
    p.add_argument("--lr", type=float, default=2e-4, help="Adam learning rate (default 2e-4)")
    p.add_argument("--warmup", type=int, default=0, help="steps of linear learning-rate warm-up (default 0)")
    p.add_argument("--cooldown", type=int, default=0,
                   help="decay the learning rate linearly to 0 over the last N steps before --steps (default 0: "
                        "none; a rerun with a larger --steps moves the decay later)")
    p.add_argument("--ema", type=float, default=0.999, help="EMA decay per step of the exported weights (default 0.999)")
    p.add_argument("--p-mean", type=float, default=-1.2, help="mean of ln sigma (model units, default -1.2)")
    p.add_argument("--p-std", type=float, default=1.2, help="std of ln sigma (default 1.2)")
    p.add_argument("--save-every", type=int, default=200, help="save (and export) every N steps (default 200)")
    p.add_argument("--log-every", type=int, default=50, help="loss.csv row every N steps (default 50)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the weights' initialisation and the crop stream (default 0; a resumed work folder "
                        "keeps its own, and another value is refused)")
    p.add_argument("--precision", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto (default): bfloat16 autocast on a CUDA GPU that has it, float32 on CPU")
    p.add_argument("--init-from", type=Path, default=None,
                   help="warm start a NEW work folder from a prior folder (e.g. assets/default_prior)")
    p.add_argument("--holdout", type=float, default=0.1,
                   help="fraction of --images held out for the PSNR, by a hash of each path (default 0.1)")
    p.add_argument("--dead-leaves", type=float, default=None,
                   help="fraction of procedural crops, drawn by --synthetic (default 0.25 built-in, 0 with --images)")
    p.add_argument("--synthetic", choices=SYNTHETIC, default=None,
                   help="procedural generator: dead_leaves (flat occluding disks, the default) or textured (textured "
                        "leaves of photographic colours, depth of field, optical blur and noise); a resumed work "
                        "folder keeps its own")
    p.add_argument("--scales", type=_floats, default=DEFAULT_SCALES,
                   help="image scales in the crop pool (default 1,0.75,0.5)")
    p.add_argument("--eval-crop", type=int, default=128, help="centre crop of held-out images for the PSNR (default 128)")


def config_from_args(args: argparse.Namespace, device: str = "cpu", progress: bool = True) -> TrainConfig:
    """A TrainConfig from parsed :func:`add_arguments` flags."""
    return TrainConfig(
        workdir=args.workdir, images=args.images, export=args.export, steps=args.steps, minutes=args.minutes,
        clock=args.clock, arch=args.arch, widths=args.widths, layers=args.layers, channels=args.channels,
        crop=args.crop, batch=args.batch, lr=args.lr, warmup=args.warmup, cooldown=args.cooldown, ema=args.ema,
        p_mean=args.p_mean, p_std=args.p_std, save_every=args.save_every, log_every=args.log_every, seed=args.seed,
        device=str(device), precision=args.precision, init_from=args.init_from, holdout=args.holdout,
        dead_leaves=args.dead_leaves, synthetic=args.synthetic, scales=tuple(args.scales), eval_crop=args.eval_crop,
        progress=progress,
    )

"""``nfc-dps convert-adm``: an ADM (guided-diffusion) checkpoint -> a diffusers prior folder
(:mod:`nfc_dps.priors.adm_convert` does the conversion)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import EXIT_FAILED, EXIT_OK, Log, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``convert-adm`` subcommand and its arguments."""
    c = sub.add_parser("convert-adm", help="convert an ADM (guided-diffusion) checkpoint to a diffusers prior folder")
    c.add_argument("checkpoint", help="ADM .pt (e.g. ffhq_10m.pt) or .safetensors state dict")
    c.add_argument("out_dir", help="output folder (then use --prior OUT_DIR)")
    c.add_argument("--preset", required=True, help="ffhq256 or imagenet256")
    c.add_argument("--overwrite", action="store_true", help="replace an existing conversion")
    c.add_argument("--trust-pickle", action="store_true",
                   help="load a checkpoint that pickles objects besides tensors (runs code from the file: only "
                        "for files you trust); by default only plain tensors are read")
    c.add_argument("--quiet", "-q", action="store_true")
    c.set_defaults(func=cmd_convert_adm)


def cmd_convert_adm(args) -> int:
    """Run ``convert-adm``; exit status 1 when the conversion fails."""
    try:
        from ..priors import adm, adm_convert
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("nfc_dps"):
            raise UsageError("ADM checkpoint conversion is not available in this installation "
                             "(module nfc_dps.priors.adm is missing)") from e
        raise UsageError(f"ADM checkpoint conversion needs a missing package: {e.name}") from e
    presets = sorted(getattr(adm, "ADM_PRESETS", {"ffhq256": None, "imagenet256": None}))
    if args.preset not in presets:
        raise UsageError(f"--preset {args.preset!r}: choose one of {', '.join(presets)}")
    ckpt = Path(args.checkpoint)
    if not ckpt.is_file():
        raise UsageError(f"checkpoint {ckpt}: no such file")
    log = Log(args.quiet)
    try:
        out = adm_convert.convert_adm_checkpoint(ckpt, args.out_dir, args.preset, overwrite=args.overwrite,
                                                 trust_pickle=args.trust_pickle)
    except (FileExistsError, NotADirectoryError) as e:
        raise UsageError(str(e)) from e
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        log.error(f"conversion of {ckpt} failed: {e}")
        return EXIT_FAILED
    log.info(f"converted {ckpt} ({args.preset}) -> {out}; use it with --prior {out}")
    return EXIT_OK

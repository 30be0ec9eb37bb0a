"""The benchmark's command line (``nfc-dps bench``): the arguments (:func:`build_parser`), the
:class:`BenchSpec` they make, and the dispatch of its protocol to the benchmark runner, or the
profile (:func:`run_from_args`).

    nfc-dps bench --protocol local --budgets 20,50,100 --out runs/bench/local
    nfc-dps bench --protocol oracle --out runs/bench/oracle
    nfc-dps bench --protocol calibration --out runs/bench/calibration
    nfc-dps bench --profile --size 256 --out runs/bench/profile
    nfc-dps bench --protocol paper --images DIR --prior DIR --out runs/bench/paper
    nfc-dps bench report                 # the docs' tables from the committed result files in docs/
    torchrun --nproc_per_node=K -m nfc_dps bench ...              # shards (task, image) jobs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..config import DEFAULT_NOISE_SIGMA, parse_scalar
from ..noise import GaussianNoise, NoiseModel, parse_noise
from ..operators import noise_sigma_problem
from ..priors.diffusers_prior import PRECISIONS
from .blind import BlindTier
from .calibration import DEFAULT_SETTINGS, Calibration
from .grid import Grid
from .jpeg import JpegTier
from .mixture import Mixture
from .noise_level import NoiseLevelTier
from .nonlinear import NonlinearTier
from .oracle import Oracle, oracle_methods
from .profiling import run_profile
from .report import run_report
from .runner import Protocol, run_protocol
from .spec import DEFAULT_METHODS, DEFAULT_TASKS, PROTOCOLS, BenchSpec, noise_problem, task_specs

#: the protocol class of each --protocol
PROTOCOL_RUNS: dict[str, type[Protocol]] = {"local": Grid, "paper": Grid, "oracle": Oracle, "mixture": Mixture,
                                           "calibration": Calibration, "nonlinear": NonlinearTier,
                                           "noise_level": NoiseLevelTier, "blind": BlindTier, "jpeg": JpegTier}
#: the protocols whose --tasks and --methods pick among their own settings and rows (empty: all)
OWN_SETTINGS = ("mixture", "calibration", "nonlinear", "noise_level", "blind", "jpeg")


def _int_list(s: str, flag: str = "--budgets") -> tuple[int, ...]:
    """"1,2" -> (1, 2); empty -> (); a ValueError naming ``flag`` unless every entry is an int >= 1."""
    try:
        vals = tuple(int(v) for v in s.split(",") if v.strip()) if s else ()
    except ValueError:
        vals = (0,)
    if any(v < 1 for v in vals):
        raise ValueError(f"{flag} {s!r}: expected comma-separated integers >= 1, e.g. 20,50,100")
    return vals


def _str_list(s: str) -> tuple[str, ...]:
    """"a, b" -> ("a", "b"); empty -> ()."""
    return tuple(v.strip() for v in s.split(",") if v.strip()) if s else ()


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The benchmark's arguments (added to ``parser`` when given, e.g. an `nfc-dps bench` subparser)."""
    p = parser or argparse.ArgumentParser(
        prog="benchmark", description="PSNR/SSIM tables against the peers and classical baselines, NFE curves, "
                                      "timing, the Gaussian oracle and a per-NFE profile (see docs/benchmarks.md).")
    p.add_argument("action", nargs="?", choices=("run", "report"), default="run",
                   help="run (default): the benchmark; report: regenerate the tables of docs/benchmarks.md, "
                        "docs/prior.md and README.md from the committed result files (nfc_dps.bench.report)")
    p.add_argument("--root", type=Path, default=Path("."), help="report: the repository folder (default .)")
    p.add_argument("--check", action="store_true",
                   help="report: write nothing; exit 1 if a page differs from what the result files give")
    p.add_argument("--protocol", choices=PROTOCOLS, default="local",
                   help="local: embedded prior, 4 held-out scikit-image crops; paper: 256 px, --images and --prior "
                        "(DPS/DAPS operators); oracle: Gaussian prior with exact bounds; mixture: Gaussian-mixture "
                        "prior, exact multimodal posterior (nfc_dps.bench.mixture; --tasks picks its settings); "
                        "calibration: coverage of the K-sample std map and of the conformal interval "
                        "(nfc_dps.bench.calibration; --tasks picks its settings); nonlinear: HDR, phase retrieval, "
                        "camera blur and Poisson noise on the held-out photos (nfc_dps.bench.nonlinear; --tasks "
                        "picks its settings, --methods its rows); noise_level: sigma_y=auto's estimate and its cost "
                        "in PSNR (nfc_dps.bench.noise_level; --methods estimate skips the restorations); blind: the kernel "
                        "unknown, estimated from each photo (nfc_dps.bench.blind; --tasks picks the kernel families, "
                        "--methods the rows); jpeg: real JPEG files of the held-out photos at quality 10, 20, 40 "
                        "(nfc_dps.bench.jpeg; --tasks q10,q20,q40 picks the qualities, --methods the rows)")
    p.add_argument("--profile", action="store_true", help="time per NFE vs the bare network forward, with a breakdown")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/bench/<protocol>)")
    p.add_argument("--prior", default=None, help="diffusers prior folder (default: the embedded prior)")
    p.add_argument("--images", default=None, help="folder of images (paper protocol; optional for local)")
    p.add_argument("--image-names", default="",
                   help="comma list of scikit-image names (local: default the held-out four; paper: instead of --images)")
    p.add_argument("--num-images", type=int, default=None, help="use the first N images (oracle: N images, default 30; "
                                                                "mixture: measurements, default 4; calibration: "
                                                                "embedded test tiles, default 2)")
    p.add_argument("--size", type=int, default=None, help="image size (local 64, paper 256, oracle 64, mixture 32, "
                                                          "calibration: embedded tiles 64, profile 256)")
    p.add_argument("--zoom", type=int, default=2, help="local: centre crop of size*zoom px area-averaged by zoom")
    p.add_argument("--tasks", default="", help=f"comma list (default {','.join(DEFAULT_TASKS)}; also: denoise; "
                                               f"mixture: its settings, default all; calibration: its settings, "
                                               f"default {','.join(DEFAULT_SETTINGS)}; profile: deblur_gaussian)")
    p.add_argument("--methods", default="", help=f"comma list (default {','.join(DEFAULT_METHODS)}; oracle: "
                                                 f"{','.join(oracle_methods())}; mixture: every sampler; calibration: "
                                                 f"every stochastic sampler; profile: nfc,daps)")
    p.add_argument("--budgets", default="", help="comma list of NFE budgets, e.g. 20,50,100 (default: preset NFE)")
    p.add_argument("--preset", default=None, help="sampler preset (local/oracle/profile: fast; paper: paper)")
    p.add_argument("--samples", type=int, default=1, help="K posterior samples per image; K > 1 adds a 'mean of K' row "
                                                          "(mixture, calibration: K chains per measurement, default 16)")
    p.add_argument("--sigma-y", "--noise-sigma", dest="sigma_y", type=float, default=None,
                   help=f"Gaussian noise std in [0, 1] units (default {DEFAULT_NOISE_SIGMA} = DPS's 0.05)")
    p.add_argument("--noise", default=None, metavar="KIND:VALUES",
                   help="local and paper: the measurements' noise model, gaussian:SIGMA, poisson:PEAK (counts / PEAK) "
                        "or poisson-gaussian:PEAK,SIGMA (default gaussian at --sigma-y); a method that cannot take "
                        "it is refused (left out of the default --methods)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--boundary", choices=("circular", "reflect"), default=None,
                   help="blur boundary (local: circular; paper: reflect, as DPS)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="prior network compute precision (auto: bfloat16 where the hardware has it natively)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="override of one column of --methods, e.g. nfc.inner=langevin (the bare nfc column) or "
                        "nfc:deterministic.prior_weight=0.3 (that preset's column) (repeatable)")
    p.add_argument("--oracle-alpha", type=float, default=2.0, help="oracle: power-law exponent of the Gaussian prior")
    p.add_argument("--oracle-pixel-std", type=float, default=0.5, help="oracle: per-pixel std of the prior (model units)")
    p.add_argument("--embedded-budget", type=int, default=20, help="calibration: NFE budget on the embedded prior")
    p.add_argument("--validation-images", type=int, default=9,
                   help="calibration: embedded validation tiles (of chelsea, camera) the calibrated interval is "
                        "fitted on (0: no calibrated interval on the embedded prior)")
    p.add_argument("--coverage", type=float, default=0.9, help="calibration: coverage the calibrated interval targets")
    p.add_argument("--label", default="", help="free text recorded in the summary (e.g. the checkpoint step)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.add_argument("--no-images", action="store_true", help="do not save restored images (and no grid.png)")
    return p


def _parse_overrides(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """--set METHOD.KEY=VALUE items -> {method: {key: YAML-parsed value}} (``parse_scalar``: 1e-1 is a number)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, val = item.partition("=")
        method, dot, field_ = key.strip().partition(".")
        if not eq or not dot or not field_:
            raise ValueError(f"--set expects METHOD.KEY=VALUE, got {item!r}")
        out.setdefault(method, {})[field_] = parse_scalar(val)
    return out


def _noise(args: argparse.Namespace) -> NoiseModel:
    """The measurements' noise model of --sigma-y and --noise (``gaussian:S`` is --sigma-y S); a
    protocol that measures under its own noise takes neither."""
    if args.protocol in OWN_SETTINGS and not args.profile:
        for flag, value in (("--sigma-y", args.sigma_y), ("--noise", args.noise)):
            if value is not None:
                raise ValueError(f"{flag} {value}: the {args.protocol} protocol measures under its own noise "
                                 f"(nfc_dps.bench.{args.protocol}); leave {flag} out")
    if args.noise is None:
        sigma = DEFAULT_NOISE_SIGMA if args.sigma_y is None else args.sigma_y
        why = noise_sigma_problem(sigma)
        if why:
            raise ValueError(f"--sigma-y {why}")
        return GaussianNoise(sigma)
    if args.sigma_y is not None:
        raise ValueError("pass one of --noise and --sigma-y (--noise gaussian:S is --sigma-y S)")
    try:
        model = parse_noise(args.noise)
    except ValueError as e:
        raise ValueError(f"--noise: {e}") from None
    if model.stated_problem():
        raise ValueError(f"--noise {args.noise}: {model.stated_problem()}")
    if model.gaussian_sigma is None and (args.protocol not in ("local", "paper") or args.profile):
        what = "the profile" if args.profile else f"the {args.protocol} protocol"
        raise ValueError(f"--noise {model}: {what} measures under its own noise; --noise applies to the local and "
                         f"paper protocols")
    return model


def _methods_taking(noise: NoiseModel, methods: Sequence[str], given: bool) -> tuple[str, ...]:
    """The ``methods`` that take measurements under ``noise``: a ValueError naming each that does
    not when they were ``given`` (--methods), else those left out, said on stdout."""
    problems = {m: why for m in methods if (why := noise_problem(m, noise))}
    if problems and given:
        raise ValueError(f"--noise {noise}: " + "; ".join(problems.values())
                         + f"; leave {', '.join(problems)} out of --methods")
    if problems:
        print(f"--noise {noise}: left out {', '.join(problems)} (" + "; ".join(problems.values()) + ")")
    return tuple(m for m in methods if m not in problems)


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """The :class:`BenchSpec` of parsed arguments, with the protocol's defaults (size, tasks, methods, preset)."""
    protocol = args.protocol
    noise = _noise(args)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    for flag, value in (("--samples", args.samples), ("--zoom", args.zoom), ("--num-images", args.num_images),
                        ("--size", args.size), ("--threads", args.threads), ("--embedded-budget", args.embedded_budget)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.validation_images < 0:
        raise ValueError(f"--validation-images must be >= 0, got {args.validation_images}")
    if not 0 < args.coverage < 1:
        raise ValueError(f"--coverage must be in (0, 1), got {args.coverage}")
    if protocol == "calibration":
        fixed = [flag for flag, given in (("--set", args.overrides), ("--preset", args.preset)) if given]
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: the calibration protocol runs every sampler at its fast preset "
                             f"(nfc_dps.bench.calibration), which these flags would not change")
    if protocol == "oracle":
        fixed = [flag for flag, given in (("--set", args.overrides), ("--preset", args.preset),
                                          ("--samples", args.samples != 1)) if given]
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: the oracle protocol runs its fixed configurations "
                             f"(nfc_dps.bench.oracle.oracle_configs), which these flags would not change")
    default_size = (256 if (protocol in ("paper", "blind", "jpeg") or args.profile) else 32 if protocol == "mixture"
                    else 128 if protocol == "noise_level" else 64)
    if args.profile and not (args.out):
        args.out = Path("runs/bench/profile")
    tasks = _str_list(args.tasks) or (("deblur_gaussian",) if args.profile else DEFAULT_TASKS)
    methods = _str_list(args.methods) or (("nfc", "daps") if args.profile else DEFAULT_METHODS)
    if protocol == "oracle":
        allowed = oracle_methods()
        methods = _str_list(args.methods) or allowed
        unknown = [m for m in methods if m not in allowed]
        if unknown:
            raise ValueError(f"--methods {','.join(unknown)}: the oracle protocol runs {','.join(allowed)}")
    elif protocol not in OWN_SETTINGS or args.profile:
        known = task_specs("paper" if protocol == "paper" else "local", 64, "circular")
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise ValueError(f"--tasks {','.join(unknown)}: unknown; choose from {', '.join(known)}")
    if noise.gaussian_sigma is None:
        methods = _methods_taking(noise, methods, given=bool(_str_list(args.methods)))
    if protocol in OWN_SETTINGS:  # empty: the protocol's settings and samplers
        tasks, methods = _str_list(args.tasks), _str_list(args.methods)
    return BenchSpec(
        protocol=protocol, out=Path(args.out or f"runs/bench/{protocol}"), prior=args.prior, images=args.images,
        image_names=_str_list(args.image_names), num_images=args.num_images, size=args.size or default_size,
        zoom=args.zoom, tasks=tasks, methods=methods, budgets=_int_list(args.budgets),
        preset=args.preset or ("paper" if protocol == "paper" else "fast"), samples=args.samples,
        noise=noise, seed=args.seed, boundary=args.boundary or ("reflect" if protocol == "paper" else "circular"),
        device=args.device, precision=args.precision, overrides=_parse_overrides(args.overrides), plots=not args.no_plots,
        save_images=not args.no_images, label=args.label, oracle_alpha=args.oracle_alpha,
        oracle_pixel_std=args.oracle_pixel_std, embedded_budget=args.embedded_budget,
        validation_images=args.validation_images, coverage=args.coverage)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the profile, or the protocol through the benchmark runner; 0, or 2 with a one-line error."""
    try:
        if getattr(args, "action", "run") == "report":
            return run_report(args.root, check=args.check)
        spec = spec_from_args(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.profile:
            run_profile(spec)
        else:
            run_protocol(PROTOCOL_RUNS[spec.protocol](spec))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"benchmark: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

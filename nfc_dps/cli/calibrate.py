"""``nfc-dps calibrate``: fit the calibrated interval rule of :mod:`nfc_dps.conformal` on clean
calibration images. Each image's measurement is simulated as ``simulate`` does (the task's
operator, seeded by the image's file name, noise, clipped to [0, 1]), restored with K samples by
:func:`nfc_dps.api.restore`, and scored; the rule and what it was fitted for go to one JSON file,
which ``restore --calibration FILE`` (and ``restore(..., calibration=FILE)``) applies."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .. import io as nio
from ..api import restore
from ..config import ResolvedSampler, TaskConfig, load_config
from ..conformal import (
    DEFAULT_EPS,
    RULES,
    Calibration,
    CalibrationError,
    fit_rule,
    mean_spread,
    min_images,
    prior_fingerprint,
    sampler_fields,
)
from ..operators import TASKS
from ..restore_inputs import as_batch, stable_seed
from ..samplers.common import PriorRangeError
from .common import (
    DEFAULT_MAX_BATCH,
    EXIT_OK,
    Log,
    UsageError,
    check_samples,
    input_names,
    parse_device,
    prior_key,
    read_inputs,
    set_threads,
)
from .flags import common_flags, prior_flags, sampler_flags, task_flags
from .outputs import check_output_file, file_lock
from .preflight import FirstImage, check_method_takes_operator, first_image, open_checked_prior
from .simulate import simulated_measurement
from .tasks import RANDOM_TASKS, OperatorSource, check_operator_file, resolve_sampler, resolve_seed, resolve_task


def _spread_range(restored: list, edge_weight: float) -> list[float]:
    """[min, max] over the calibration images of their mean interval spread (restore warns outside it)."""
    values = [float(mean_spread(m, sd, DEFAULT_EPS, edge_weight)[0]) for m, sd, _ in restored]
    return [min(values), max(values)]

def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``calibrate`` subcommand and its arguments."""
    c = sub.add_parser(
        "calibrate", help="fit calibrated per-pixel intervals (mean ± q (std + c·edge)) on clean calibration images",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulates a measurement of each clean image in --images with the task's operator and noise,\n"
                    "restores it with --samples K posterior samples, and fits q and an edge weight c so that\n"
                    "mean ± q (std + c·edge(mean) + eps)\n"
                    "covers --coverage of the pixel values (docs/uncertainty.md says what the coverage means).\n"
                    "Writes --out FILE.json; restore --samples K --calibration FILE.json then writes\n"
                    "<name>_lower.png and <name>_upper.png. The file only applies to the same task (parameters,\n"
                    "noise), method, preset and sampler settings, K and prior. Needs at least ceil(1/alpha) - 1\n"
                    "images (alpha = 1 - coverage: 9 for 0.9, 19 for 0.95); a few dozen give a tighter q.")
    c.add_argument("--images", required=True, metavar="DIR", help="folder of clean calibration images (ground truth)")
    c.add_argument("--out", "-o", required=True, metavar="FILE.json", help="the calibration file to write")
    task_flags(c, "base seed (default 0): each image's operator, noise and sampler seeds come from it and the "
               "image's file name")
    sampler_flags(c, "sampler preset, as for restore; it must draw samples (nfc: fast, fast_psnr, paper)")
    prior_flags(c)
    c.add_argument("--samples", type=int, required=True, metavar="K",
                   help="posterior samples per image (K >= 2); restore must use the same K")
    c.add_argument("--coverage", type=float, default=0.9, help="target coverage 1 - alpha in (0, 1) (default 0.9)")
    c.add_argument("--rule", choices=RULES, default="pooled",
                   help="pooled (default): at most alpha of the calibration pixel values outside, images weighted "
                        "equally; risk-control: conformal risk control, E[fraction of a new image's pixels "
                        "outside] <= alpha guaranteed for exchangeable images, wider when there are few images")
    c.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help=f"at most N sampler chains at once (default {DEFAULT_MAX_BATCH}, or K if larger)")
    common_flags(c)
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    """Run ``calibrate``: every check before the prior loads, then simulate, restore, score, fit, write."""
    log = Log(args.quiet)
    task, sampler, seed, images, out = _settings(args)
    folder = Path(args.images)
    _check_inputs(images, input_names(images, folder), task, seed)
    check_output_file(out, "--out")
    with file_lock(out):  # one run per --out: a second is refused before its work, naming the first
        return _calibrate(args, log, task, sampler, seed, images, out, folder)


def _calibrate(args, log: Log, task: TaskConfig, sampler: ResolvedSampler, seed: int, images: list[Path], out: Path,
               folder: Path) -> int:
    """The checked run of ``calibrate``, holding the lock on ``out``: restore, score, fit, write."""
    first = first_image(images)
    if first is not None:
        check_method_takes_operator(sampler.method, OperatorSource(task), input_names([first.path], folder)[0],
                                    first.image, task.noise_model, sampler.config)
    device = parse_device(args.device)
    set_threads(args.threads)
    prior = open_checked_prior(args, device, first)
    try:  # before any restoration: a prior no calibration can identify (not deterministic) is refused now
        fingerprint = prior_fingerprint(prior)
    except CalibrationError as e:
        raise UsageError(str(e)) from e
    log.info(f"calibrating {sampler.method}/{sampler.preset} K={args.samples} on {len(images)} image(s) of "
             f"{folder} [{task.task}, noise_sigma={task.noise_sigma}, target coverage {args.coverage:g}]")
    names = input_names(images, folder)
    restored = _restored(args, task, sampler, seed, images, names, prior, device, first)
    try:
        fit = fit_rule(restored, args.coverage, args.rule)
    except CalibrationError as e:
        raise UsageError(str(e)) from e
    q, inside = fit.q, fit.covered
    info = prior_key(args.prior)
    cal = Calibration(
        q=q, coverage=float(args.coverage), rule=args.rule, eps=DEFAULT_EPS, n_images=len(restored),
        num_samples=int(args.samples), method=sampler.method, preset=sampler.preset,
        sampler=sampler_fields(sampler.config),
        prior={"fingerprint": fingerprint, "path": info["path"],
               "embedded_default": args.prior is None, "precision": prior.precision},
        task=task.as_dict(), edge_weight=fit.edge_weight,
        fit={"images": names, "folder": str(folder.resolve()), "seed": int(seed),
             "coverage_in_sample": float(np.mean(inside)), "coverage_in_sample_per_image": inside,
             "per_image_spread_by_edge_weight": {str(c): v for c, v in fit.spread_by_weight.items()},
             "mean_spread_range": _spread_range(restored, fit.edge_weight),
             "units": "images in [0, 1]; interval = clip(mean -/+ q (std + edge_weight edge(mean) + eps), 0, 1) "
                      "per pixel and channel (nfc_dps.conformal)"},
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        cal.save(out)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write ({e.strerror or e})") from e
    if task.task in RANDOM_TASKS:
        flag = RANDOM_TASKS[task.task]
        log.info(f"note: {task.task} draws its operator at random; restore measurements simulated with it "
                 f"(restore --config <simulate output>/simulation.json) to apply this file; a {flag} of "
                 f"another origin is another task")
    log.info(f"q = {q:.4g}, edge weight {fit.edge_weight:g} (rule {args.rule}): {100 * np.mean(inside):.1f} % of the "
             f"calibration pixel values inside mean ± q (std + {fit.edge_weight:g} edge + {DEFAULT_EPS:.4g}) -> {out}")
    return EXIT_OK


def _settings(args) -> tuple[TaskConfig, ResolvedSampler, int, list[Path], Path]:
    """(task, sampler, base seed, calibration images, output file) of the flags and configs;
    UsageError (or ConfigError) naming the flag before any work."""
    bundle = load_config(list(args.config or []))
    task = resolve_task(args, bundle, "calibrate")
    if TASKS[task.task].estimates:  # no calibration holds an estimated operator's error
        raise UsageError(f"--task {task.task}: its {TASKS[task.task].estimates} is estimated from each photo, and "
                         f"calibrated intervals hold only for the operator they were fitted with; calibrate the task "
                         f"with the kernel known (deblur_kernel, deblur_motion)")
    if TASKS[task.task].reads_measurement is not None:  # its measurement is a file, not the operator's measure
        raise UsageError(f"--task {task.task}: each measurement is a file that gives its own operator and noise, "
                         f"which calibrate (it simulates measurements with one operator and a stated Gaussian noise) "
                         f"cannot pose; calibrated intervals are not available for it")
    check_operator_file(task, None)
    if task.noise:
        raise UsageError(f"--noise {task.noise}: calibrated intervals are fitted and checked under Gaussian noise "
                         f"(--noise-sigma) only")
    sampler = resolve_sampler(args, bundle)
    if args.samples < 2:
        raise UsageError(f"--samples must be >= 2 (a calibrated interval scales the spread of K samples), got "
                         f"{args.samples}")
    check_samples(args.samples, sampler.config)
    if sampler.config.is_deterministic:
        raise UsageError(f"{sampler.method}/{sampler.preset} is deterministic (every sample would be the same, "
                         f"std 0): calibrate a sampling preset, e.g. --preset fast")
    if not 0.0 < args.coverage < 1.0:
        raise UsageError(f"--coverage must lie strictly between 0 and 1 (e.g. 0.9), got {args.coverage}")
    if args.max_batch is not None and args.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {args.max_batch}")
    folder = Path(args.images)
    if not folder.is_dir():
        raise UsageError(f"--images {folder}: not a folder of clean calibration images")
    images, _ = read_inputs("--images", folder)
    need = min_images(args.coverage)
    if len(images) < need:
        raise UsageError(f"--images {folder} holds {len(images)} image(s); coverage {args.coverage:g} needs at least "
                         f"{need} calibration images (ceil(1/alpha) - 1, alpha = {1 - args.coverage:.4g}); a few dozen "
                         f"give a tighter interval")
    out = Path(args.out)
    if out.suffix.lower() != ".json":
        raise UsageError(f"--out {out}: the calibration file must end in .json")
    return task, sampler, resolve_seed(args, bundle), images, out


def _simulate(path: Path, name: str, source: OperatorSource, task: TaskConfig, seed: int, x=None):
    """(truth, operator, y) of one calibration image: read (unless ``x`` is given) and measured as
    ``simulate`` measures it. UsageError naming the image."""
    try:
        x = nio.read_image(path)[0] if x is None else x
        x, _, op, y, _, _ = simulated_measurement(x, path.name, name, source, task.noise_model, seed)
    except (nio.ImageReadError, OSError, ValueError) as e:
        raise UsageError(f"calibration image {path}: {e}") from e
    return as_batch(x)[0], op, y.clamp(0, 1)


def _check_inputs(images: list[Path], names: list[str], task: TaskConfig, seed: int) -> None:
    """Read and measure every calibration image before any sampling; one UsageError naming each that fails."""
    source, bad = OperatorSource(task), []
    for path, name in zip(images, names):
        try:
            _simulate(path, name, source, task, seed)
        except UsageError as e:
            bad.append(str(e))
    if bad:
        raise UsageError(f"{len(bad)} of {len(images)} calibration image(s) cannot be used (nothing was sampled):\n  "
                         + "\n  ".join(bad))


def _restored(args, task: TaskConfig, sampler: ResolvedSampler, seed: int, images: list[Path], names: list[str],
              prior, device, first: FirstImage | None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each image's (mean, std, truth) as (C, H, W) float64: its measurement as ``simulate`` takes
    it, restored with K samples. UsageError naming an image that cannot be read or restored."""
    from tqdm.auto import tqdm

    source = OperatorSource(task)
    max_batch = args.max_batch or max(DEFAULT_MAX_BATCH, args.samples)
    restored = []
    for path, name in zip(tqdm(images, desc="calibrate", unit="img", disable=args.quiet), names):
        truth, op, y = _simulate(path, name, source, task, seed,
                                 first.image if first is not None and first.path == path else None)
        try:
            res = restore(y.to(device), op.to(device), prior=prior, method=sampler.method, sigma_y=task.noise_sigma,
                          seed=stable_seed(seed, "calibrate", name), num_samples=args.samples, progress=False,
                          config=sampler.config, max_batch=max_batch, keep_samples=False)
        except PriorRangeError as e:
            raise UsageError(f"--method {sampler.method} with this prior: {e}") from e
        except (ValueError, FloatingPointError, RuntimeError) as e:  # NaN in a restoration, out of memory
            raise UsageError(f"calibration image {path}: {type(e).__name__}: {e}") from e
        restored.append(tuple(np.asarray(t[0].detach().cpu(), dtype=np.float64) for t in (res.image, res.std, truth)))
    return restored

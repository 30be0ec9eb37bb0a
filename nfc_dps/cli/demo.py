"""``nfc-dps demo``: two held-out photographs x three simulated tasks restored with NFC's default
(deterministic) preset; per-task images, grid.png, metrics.csv and resolved_config.json."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import io as nio
from ..api import restore
from ..bench.spec import DEFAULT_TASKS, task_specs
from ..config import DEFAULT_NOISE_SIGMA, ResolvedSampler, SamplerSpec, parse_task
from ..operators import TASKS
from ..priors.training_data import HELDOUT_IMAGES, load_skimage_image
from ..run_record import resolved_config
from ..samplers import METHODS
from .common import (
    EXIT_OK,
    RESOLVED_JSON,
    Log,
    UsageError,
    image_metrics,
    noise_seed,
    open_prior,
    parse_device,
    prior_key,
    set_threads,
    to_numpy,
)
from .flags import common_flags, prior_flags
from .outputs import cannot_write, check_output_folder, folder_lock
from .preflight import check_prior_fits


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand and its arguments."""
    d = sub.add_parser("demo", help="restore 2 held-out photos x 3 tasks; write a grid and metrics",
                       description="Simulate SR x4 (bicubic), box inpainting and Gaussian deblurring (noise_sigma "
                                   "0.025; --tasks all adds random inpainting and motion deblurring) on two "
                                   "photographs the default prior never saw, restore them with NFC (its default "
                                   "deterministic preset) and write per-task images, grid.png and metrics.csv. "
                                   "The tasks' parameters are the local benchmark protocol's.")
    d.add_argument("--output", "-o", default="nfc_dps_demo", help="output folder (default ./nfc_dps_demo)")
    d.add_argument("--steps", type=int, default=None, help="NFC levels (default: the deterministic preset's 16; 1 NFE each)")
    d.add_argument("--size", type=int, default=96,
                   help=f"image size in pixels: a multiple of 16 from 32 to {MAX_SIZE} (default 96)")
    prior_flags(d)
    d.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    d.add_argument("--tasks", default=",".join(DEMO_TASKS), metavar="T1,T2|all",
                   help=f"tasks, comma-separated (default {','.join(DEMO_TASKS)}; all: {','.join(ALL_TASKS)})")
    common_flags(d)
    d.set_defaults(func=cmd_demo)


DEMO_IMAGES = ("astronaut", "coffee")
#: the demo's tasks by default, and with --tasks all (the benchmark harness's standard tasks)
DEMO_TASKS = ("sr_bicubic", "inpaint_box", "deblur_gaussian")
ALL_TASKS = DEFAULT_TASKS
#: the largest --size: the demo photographs are 400 and 512 px, which a larger size only upsamples
MAX_SIZE = 1024


def _demo_tasks(size: int, names: str) -> list[tuple[str, dict[str, Any]]]:
    """(task, parameters) of the demo's ``names`` ("all" or comma-separated) at image size ``size``:
    the local benchmark protocol's parameters. UsageError naming an unknown task."""
    specs = {s.name: s.params for s in task_specs("local", size, "circular").values()}
    chosen = ALL_TASKS if names == "all" else tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [n for n in chosen if n not in ALL_TASKS]
    if unknown or not chosen:
        raise UsageError(f"--tasks {names}: choose from {', '.join(ALL_TASKS)}, or all")
    return [(name, dict(specs[name])) for name in chosen]


def _demo_image(name: str, size: int) -> np.ndarray:
    """Held-out photograph ``name``: centre square, resized to (size, size, 3) float32 in [0, 1]."""
    from skimage.transform import resize

    if name not in HELDOUT_IMAGES:
        raise UsageError(f"demo image {name!r} is not held out of the prior's training set")
    img = load_skimage_image(name)
    h, w = img.shape[:2]
    s = min(h, w)
    img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    return np.clip(resize(img, (size, size), order=3, anti_aliasing=True), 0, 1).astype(np.float32)


def _grid(rows: list[list[np.ndarray]], labels_top: list[str], labels_left: list[str], pad: int = 2) -> np.ndarray:
    """Tile equally sized RGB images into a grid with white gaps and text labels."""
    from PIL import Image, ImageDraw

    th, tw = rows[0][0].shape[:2]
    top, left = 26, 96  # two text lines above each column: "image:" then its role
    H = top + len(rows) * (th + pad) + pad
    W = left + len(rows[0]) * (tw + pad) + pad
    canvas = np.ones((H, W, 3), np.float32)
    for r, row in enumerate(rows):
        for c, im in enumerate(row):
            y0, x0 = top + pad + r * (th + pad), left + pad + c * (tw + pad)
            canvas[y0:y0 + th, x0:x0 + tw] = im if im.ndim == 3 else im[..., None]
    pil = Image.fromarray(nio.quantize(canvas, 8))
    draw = ImageDraw.Draw(pil)
    for c, text in enumerate(labels_top):
        draw.text((left + pad + c * (tw + pad) + 2, 1), text.replace(": ", ":\n", 1), fill=(0, 0, 0), spacing=1)
    for r, text in enumerate(labels_left):
        draw.text((2, top + pad + r * (th + pad) + th // 2 - 5), text, fill=(0, 0, 0))
    return np.asarray(pil, np.float32) / 255.0


def cmd_demo(args) -> int:
    """Run ``demo``."""
    log = Log(args.quiet)
    device = parse_device(args.device)
    set_threads(args.threads)
    if not 32 <= args.size <= MAX_SIZE or args.size % 16:
        raise UsageError(f"--size must be a multiple of 16 from 32 to {MAX_SIZE} (the demo photographs are 400 "
                         f"and 512 px); got {args.size}")
    spec = SamplerSpec("nfc")  # the default preset: the deterministic continuation
    if args.steps is not None:
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {args.steps}")
        spec.set(METHODS["nfc"].steps_field, int(args.steps), "--steps")
    sampler = spec.resolve()
    tasks = _demo_tasks(args.size, args.tasks)
    out = check_output_folder(Path(args.output), [])
    prior = open_prior(args.prior, device, args.precision)
    images = {name: _demo_image(name, args.size) for name in DEMO_IMAGES}
    check_prior_fits(prior, DEMO_IMAGES[0], images[DEMO_IMAGES[0]])
    rows_csv, grid_rows = [], []
    t_start = time.perf_counter()
    with folder_lock(out):
        nio.remove_stale_temp_files(out)
        for task_name, params in tasks:
            try:
                rows, grid_row = _demo_task(args, task_name, params, images, prior, sampler, device, out, log)
            except FloatingPointError as e:  # a prior that returns NaN
                raise UsageError(f"demo {task_name}: {e}; try another --prior or --precision float32") from e
            except OSError as e:
                raise UsageError(f"demo {task_name}: {cannot_write(e)}") from e
            rows_csv += rows
            grid_rows.append(grid_row)
        top = [f"{n}: {c}" if c == "measurement" else c for n in DEMO_IMAGES for c in ("measurement", "restored", "truth")]
        fields = ["task", "image", "psnr_measurement", "psnr", "ssim_measurement", "ssim", "nfe", "seconds"]
        try:
            nio.write_image(out / "grid.png", _grid(grid_rows, top, [t for t, _ in tasks]))
            nio.write_csv(out / "metrics.csv", rows_csv, fields)
            nio.write_json(out / RESOLVED_JSON, resolved_config(
                None, sampler, args.seed, 1, prior=prior_key(args.prior)["path"], command="demo",
                per_image_seed="seed + index of the image in the demo batch",
                device=str(device), images=list(DEMO_IMAGES), note={
                    "size": args.size, "noise_sigma": DEFAULT_NOISE_SIGMA,
                    "tasks": {t: {"task": t, **p} for t, p in tasks},
                    "measurement column": "nearest-neighbour upsampled for SR"}))
        except OSError as e:
            raise UsageError(cannot_write(e)) from e
    total = time.perf_counter() - t_start
    if not args.quiet:
        print(f"{'task':<16} {'image':<10} {'PSNR in':>8} {'PSNR out':>9} {'SSIM out':>9}")
        for r in rows_csv:
            print(f"{r['task']:<16} {r['image']:<10} {r['psnr_measurement']:>8.2f} {r['psnr']:>9.2f} {r['ssim']:>9.4f}")
        print(f"({total:.0f} s) grid: {out / 'grid.png'}  metrics: {out / 'metrics.csv'}")
    return EXIT_OK


def _demo_task(args, task_name: str, params: dict[str, Any], images: dict[str, np.ndarray], prior,
               sampler: ResolvedSampler, device, out: Path, log: Log) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Simulate ``task_name`` on the demo photographs, restore them in one batch and write each
    one's measurement, restoration and truth to ``out/<task>``: (metrics rows, the grid's row)."""
    import torch

    sigma, seed, label, cfg = DEFAULT_NOISE_SIGMA, args.seed, task_name, sampler.config
    task = parse_task({"task": task_name, **params, "noise_sigma": sigma}, f"demo {task_name}")
    op = task.build((args.size, args.size), seed=seed).to(device)
    x = torch.stack([torch.from_numpy(images[n]).permute(2, 0, 1) for n in DEMO_IMAGES]).to(device)
    gens = [torch.Generator().manual_seed(noise_seed(seed + i)) for i in range(len(DEMO_IMAGES))]
    y = torch.cat([op.measure(x[i:i + 1], sigma, gens[i]) for i in range(len(DEMO_IMAGES))])
    log.info(f"{label}: restoring {len(DEMO_IMAGES)} images ({task_name}, {args.size}x{args.size}, "
             f"noise_sigma={sigma}, nfc/{sampler.preset}, {cfg.steps} levels, {cfg.nfe} NFE)")
    res = restore(y, op, prior=prior, method="nfc", sigma_y=sigma, seed=seed, progress=not args.quiet, config=cfg)
    rows_csv, grid_row = [], []
    for i, name in enumerate(DEMO_IMAGES):
        gt = images[name]
        yi = to_numpy(y[i:i + 1])
        up = TASKS[task_name].upscale(task.params)
        shown = np.repeat(np.repeat(yi, up, 0), up, 1)
        xi = to_numpy(res.image[i:i + 1])
        if not np.isfinite(xi).all():
            raise FloatingPointError(f"{label}/{name}: NaN/Inf in the restoration")
        base = out / label
        nio.write_image(base / f"{name}_measurement.png", np.clip(yi, 0, 1))
        nio.write_image(base / f"{name}_restored.png", xi)
        nio.write_image(base / f"{name}_ground_truth.png", gt)
        p_in, s_in = image_metrics(shown, gt)
        p, s = image_metrics(xi, gt)
        rows_csv.append({"task": label, "image": name, "psnr_measurement": p_in, "psnr": p,
                         "ssim_measurement": s_in, "ssim": s, "nfe": int(res.nfe),
                         "seconds": round(res.seconds / len(DEMO_IMAGES), 2)})
        grid_row += [np.clip(shown, 0, 1), np.clip(xi, 0, 1), gt]
    return rows_csv, grid_row

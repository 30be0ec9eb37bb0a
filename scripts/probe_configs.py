#!/usr/bin/env python
"""PSNR of sampler configs on the harness's measurements, for quick design probes.

Each config is a JSON object {"task", "method", "preset"?, <field overrides>...}; without "preset"
the method's default is used, as restore() does (NFC: "deterministic"; the benchmark's ``nfc``
column is "fast"). The PSNR printed is the mean over the images (dB, outputs clipped to [0, 1]),
after the config and the preset it ran. Measurements are the local
protocol's (the same seeds as ``scripts/benchmark.py``), cached under --out.

    python scripts/probe_configs.py --size 256 --images coffee,chelsea \\
        '[{"task": "deblur_motion", "method": "nfc", "num_levels": 16}, {"task": "deblur_motion", "method": "tv"}]'
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from nfc_dps.bench.measurements import load_images, measurement
from nfc_dps.bench.spec import CLASSICAL_METHODS, BenchSpec, task_specs
from nfc_dps.api import restore
from nfc_dps.samplers import get_method
from nfc_dps.baselines import restore_classical
from nfc_dps.metrics import restoration_metrics
from nfc_dps.priors.default import load_prior


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", help="JSON list of configs")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--images", default="coffee,chelsea", help="comma list of held-out scikit-image names")
    ap.add_argument("--zoom", type=int, default=1,
                    help="centre crop of size*zoom px area-averaged by zoom (the 64-px tables use 2, the 256-px tier 1)")
    ap.add_argument("--sigma-y", type=float, default=0.025, help="measurement noise std, [0, 1] units (the protocol's 0.025)")
    ap.add_argument("--prior", default=None, help="prior folder (default: the embedded prior)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/probe/bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = BenchSpec(protocol="local", out=args.out / f"{args.size}x{args.zoom}_s{args.sigma_y:g}", size=args.size,
                     zoom=args.zoom, sigma_y=args.sigma_y, image_names=tuple(args.images.split(",")), save_images=False)
    tasks = task_specs("local", args.size, "circular")
    prior = load_prior(args.prior)
    images = load_images(spec)
    for entry in json.loads(args.configs):
        cfg = dict(entry)
        task, method, preset = cfg.pop("task"), cfg.pop("method"), cfg.pop("preset", None)
        t0, values, ran = time.time(), [], "classical"
        for name, img in images:
            op, x, y, meta = measurement(spec, tasks[task], name, img)
            if method in CLASSICAL_METHODS:
                xr = restore_classical(method, op, y, spec.sigma_y)
            else:
                res = restore(y, op, prior=prior, method=method, preset=preset, sigma_y=spec.sigma_y,
                              seed=meta["sampler_seed"], progress=False, **cfg)
                xr, ran = res.image, f"preset {preset or get_method(method).default_preset}, {res.nfe} NFE"
            values.append(restoration_metrics(xr, x)["psnr"])
        print(json.dumps(entry), f"[{ran}]", f"{sum(values) / len(values):.3f} dB", f"{time.time() - t0:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()

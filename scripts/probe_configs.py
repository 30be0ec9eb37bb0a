#!/usr/bin/env python
"""PSNR of sampler configs on the harness's measurements, for quick design probes.

Each config is a JSON object {"task", "method", "preset"?, <field overrides>...}; without "preset"
the method's default is used, as restore() does (NFC: "deterministic"; the benchmark's ``nfc``
column is "fast"). The PSNR printed is the mean over the images (dB, outputs clipped to [0, 1]),
after the config and the preset it ran. Measurements are the local
protocol's (the same seeds as ``scripts/benchmark.py``), cached under --out.

    python scripts/probe_configs.py --size 256 --images coffee,chelsea \\
        '[{"task": "deblur_motion", "method": "nfc", "num_levels": 16}, {"task": "deblur_motion", "method": "tv"}]'

One probe-only key: ``"full_ensemble_last": k`` (a config with ``self_ensemble`` on) makes the last
k network calls average the denoiser over all eight symmetries of the square (DPIR's full x8
ensemble, 8 network calls each) instead of taking one in turn.
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
from nfc_dps.priors.base import Prior
from nfc_dps.samplers import get_config, get_method
from nfc_dps.samplers.self_ensemble import DIHEDRAL_ORDER, SelfEnsemblePrior, dihedral, dihedral_inverse
from nfc_dps.baselines import restore_classical
from nfc_dps.metrics import restoration_metrics
from nfc_dps.priors.default import load_prior


class FullEnsembleAtEnd(SelfEnsemblePrior):
    """The periodical self-ensemble, except that calls ``first_full`` onwards average all eight
    symmetries of the square; ``full_calls`` counts those (each is 8 network calls)."""

    def __init__(self, inner: Prior, first_full: int) -> None:
        super().__init__(inner)
        self.first_full, self.full_calls = first_full, 0

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        if self.calls < self.first_full:
            return super().denoise(x, sigma)
        if x.shape[-2] != x.shape[-1]:
            raise ValueError(f"full_ensemble_last needs square images (quarter turns), got {tuple(x.shape[-2:])}")
        self.calls += 1
        self.full_calls += 1
        return sum(dihedral_inverse(self.inner.denoise(dihedral(x, k), sigma), k)
                   for k in range(DIHEDRAL_ORDER)) / DIHEDRAL_ORDER


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
        full_last = cfg.pop("full_ensemble_last", None)
        if full_last is not None:
            config = None if method in CLASSICAL_METHODS else get_config(method, preset, **cfg)
            if not getattr(config, "self_ensemble", False):
                raise SystemExit(f"{entry}: full_ensemble_last needs a sampler config with self_ensemble on")
            if not (isinstance(full_last, int) and 1 <= full_last <= config.nfe):
                raise SystemExit(f"{entry}: full_ensemble_last must be an integer in [1, {config.nfe}] "
                                 f"(the config's network calls), got {full_last!r}")
            cfg["self_ensemble"] = False  # the wrapper below takes its place
        t0, values, ran = time.time(), [], "classical"
        for name, img in images:
            op, x, y, meta = measurement(spec, tasks[task], name, img)
            if method in CLASSICAL_METHODS:
                xr = restore_classical(method, op, y, spec.sigma_y)
            else:
                net = prior if full_last is None else FullEnsembleAtEnd(prior, config.nfe - full_last)
                res = restore(y, op, prior=net, method=method, preset=preset, sigma_y=spec.sigma_y,
                              seed=meta["sampler_seed"], progress=False, **cfg)
                nfe = res.nfe if full_last is None else res.nfe + (DIHEDRAL_ORDER - 1) * net.full_calls
                xr, ran = res.image, f"preset {preset or get_method(method).default_preset}, {nfe} NFE"
            values.append(restoration_metrics(xr, x)["psnr"])
        print(json.dumps(entry), f"[{ran}]", f"{sum(values) / len(values):.3f} dB", f"{time.time() - t0:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Compare prior folders on VALIDATION images only: the evidence for shipping a new prior.

One-step denoising PSNR (the prior report's protocol: y = x + sigma n in [0, 1] units, the prior
called at 2 sigma on 2 y - 1, estimates clipped) at sigma 0.05, 0.1, 0.2 on two 256-px crops of
scikit-image's motorcycle (left view; centre and top-left) and two textured-leaves images (seeded), and NFC's default on SR x4
and Gaussian deblurring of the same crops at 128 px. The held-out test photos are never read.

    python scripts/validate_prior.py assets/default_prior runs/prior_r6/export --out runs/validate.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import nfc_dps
from nfc_dps.bench.measurements import _center_crop_zoom
from nfc_dps.metrics import psnr
from nfc_dps.priors.training_data import load_skimage_image
from nfc_dps.training.leaves import textured_leaves

SIGMAS = (0.05, 0.1, 0.2)


def validation_images(size: int) -> torch.Tensor:
    moto = load_skimage_image("motorcycle_left")
    photos = [_center_crop_zoom(moto, size, 1), np.ascontiguousarray(moto[:size, :size])]
    leaves = [textured_leaves(size, np.random.default_rng(1000 + i)) for i in range(2)]
    return torch.stack([torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).permute(2, 0, 1)
                        for a in photos + leaves]).clamp(0, 1)


def evaluate(folder: str) -> dict:
    prior = nfc_dps.load_prior(folder)
    x = validation_images(256)
    out: dict = {"prior": folder, "denoise": {}, "restore": {}}
    with torch.no_grad():
        for s in SIGMAS:
            y = x + s * torch.randn(x.shape, generator=torch.Generator().manual_seed(int(s * 1000)))
            est = (prior.denoise(2 * y - 1, torch.full((x.shape[0],), 2 * s)) + 1) / 2
            out["denoise"][s] = float(psnr(est.clamp(0, 1), x).mean())
    small = torch.nn.functional.avg_pool2d(x, 2)  # 128 px
    blur = {"kernel_size": 25, "kernel_std": 2.0, "boundary": "circular"}  # the local protocol's
    for task, params in (("sr_bicubic", {}), ("deblur_gaussian", blur)):
        op = nfc_dps.build_operator(task, 128, **params)
        y = op.measure(small, 0.025, [torch.Generator().manual_seed(i) for i in range(small.shape[0])])
        r = nfc_dps.restore(y, op, prior=prior, sigma_y=0.025, progress=False)
        out["restore"][task] = float(psnr(r.image, small).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("priors", nargs="+", help="prior folders (the first is the reference)")
    ap.add_argument("--out", type=Path, help="JSON of every number")
    args = ap.parse_args(argv)
    rows = [evaluate(p) for p in args.priors]
    ref = rows[0]
    for r in rows:
        d = " / ".join(f"{r['denoise'][s]:.3f} ({r['denoise'][s] - ref['denoise'][s]:+.3f})" for s in SIGMAS)
        t = " / ".join(f"{k} {v:.3f} ({v - ref['restore'][k]:+.3f})" for k, v in r["restore"].items())
        print(f"{r['prior']}: denoise {d}; NFC default {t}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

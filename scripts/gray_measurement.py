"""Gray measurements with the RGB embedded prior: the noise std the replicated copies are given.

``restore`` replicates a 1-channel measurement to the prior's 3 channels. The three copies share
one noise draw, so as independent channels each must carry std sigma_y * sqrt(3) for the
likelihood of their mean to stay exact (what ``restore`` does); giving each copy sigma_y counts
the measurement three times. This script measures both on the held-out photographs turned gray
(BT.601 luma; camera is gray already), centre 256 px crop area-averaged to 128 px, the local
protocol's operators at 128 px, sigma_y = 0.025 in [0, 1] units, PSNR of the gray restoration.

    python scripts/gray_measurement.py --threads 1      # 64 restorations, 12 min on one core next to a benchmark
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import nfc_dps
from nfc_dps.bench.spec import task_specs
from nfc_dps.metrics import restoration_metrics
from nfc_dps.priors.training_data import HELDOUT_IMAGES, load_skimage_image
from nfc_dps.training.data import LUMA

TASKS = ("sr4", "inpaint_random", "deblur_gaussian", "deblur_motion")
PRESETS = {"deterministic": {}, "fast_psnr": {"num_levels": 25}}  # fast_psnr at 25 levels x 2 = 50 NFE


def gray_crop(name: str, crop: int = 256, zoom: int = 2) -> torch.Tensor:
    """(1, 1, crop/zoom, crop/zoom) gray image in [0, 1]."""
    img = load_skimage_image(name).astype(np.float64) @ LUMA.astype(np.float64)  # (H, W, 3) in [0, 1] -> luma
    h, w = img.shape
    top, left = (h - crop) // 2, (w - crop) // 2
    img = img[top:top + crop, left:left + crop]
    img = img.reshape(crop // zoom, zoom, crop // zoom, zoom).mean(axis=(1, 3))
    return torch.from_numpy(img.astype(np.float32))[None, None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sigma-y", type=float, default=0.025)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prior = nfc_dps.load_prior()
    specs = task_specs("local", 128, "circular")
    sigma = args.sigma_y
    print("| task | preset | image | copies at sigma_y | copies at sigma_y * sqrt(3) (restore) |")
    print("|---|---|---|---|---|")
    for task in TASKS:
        for preset, overrides in PRESETS.items():
            pairs = []
            for i, name in enumerate(HELDOUT_IMAGES):
                x = gray_crop(name)
                spec = specs[task]
                op = nfc_dps.build_operator(spec.factory_task, image_size=x.shape[-2:], seed=i, **spec.params)
                y = op.measure(x, sigma_y=sigma, generator=torch.Generator().manual_seed(i))
                kw = dict(prior=prior, preset=preset, seed=i, progress=False, **overrides)
                once = nfc_dps.restore(y, op, sigma_y=sigma, **kw).image  # gray input: restore's rule
                thrice = nfc_dps.restore(y.expand(-1, 3, -1, -1), op, sigma_y=sigma, **kw).image.mean(1, keepdim=True)
                pairs.append((restoration_metrics(thrice, x)["psnr"], restoration_metrics(once, x)["psnr"]))
                print(f"| {task} | {preset} | {name} | {pairs[-1][0]:.2f} | {pairs[-1][1]:.2f} |", flush=True)
            a, b = np.mean(pairs, axis=0)
            print(f"| {task} | {preset} | **mean** | **{a:.2f}** | **{b:.2f}** ({b - a:+.2f}) |", flush=True)


if __name__ == "__main__":
    main()

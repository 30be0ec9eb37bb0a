"""The kernel estimator's settings measured end to end on validation crops (never the held-out photos).

The crops, kernels, noise and score of ``scripts/blind_validation.py`` (or, with ``--images``, the
256-px centre crops of those scikit-image photographs: the prior's training photos are fair game,
the held-out ones never); each setting is a
:class:`~nfc_dps.operators.kernel_estimation.KernelEstimator` (the projection threshold and the
full scale's Tikhonov weight), restored as ``deblur_blind`` restores (the kernel from the photo, NFC,
two refinements); ``--shock``: with the L0 image shock-filtered before each of the estimator's
kernel steps (``KernelEstimator.shock_steps`` 3; without it, 0). Prints one line per setting and family: mean PSNR,
each crop's, the mean kernel error; ``--out`` also writes them as a CSV.

    python scripts/blind_estimator_sweep.py --settings 0.15:0.01 0.08:1.0 0.1:1.0 0.15:1.0
    python scripts/blind_estimator_sweep.py --settings 0.15:0.01 0.08:1.0 --images rocket coins clock brick
    python scripts/blind_estimator_sweep.py --settings 0.15:0.01 --shock --families shake31
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import torch

from nfc_dps import restore
from nfc_dps.bench.blind import FAMILIES, SIGMA, shift_scores
from nfc_dps.operators import BlindBlur, BlurOperator
from nfc_dps.operators.kernel_estimation import KernelEstimator, kernel_error
from nfc_dps.priors.training_data import HELDOUT_IMAGES, center_crop, load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30))  # as scripts/blind_validation.py


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", required=True, help="THRESHOLD:GAMMA_FINEST pairs")
    p.add_argument("--images", nargs="+", default=None, help="scikit-image photographs (default: motorcycle crops)")
    p.add_argument("--out", type=Path, default=None, help="a CSV to write")
    p.add_argument("--shock", action="store_true", help="shock-filter the L0 image before each kernel step (shock_steps 3; else 0)")
    p.add_argument("--families", default=",".join(FAMILIES), help="kernel families (default: all)")
    args = p.parse_args()
    if args.images and set(args.images) & set(HELDOUT_IMAGES):
        p.error(f"--images: {', '.join(sorted(set(args.images) & set(HELDOUT_IMAGES)))} are held-out photos")
    if args.images:
        crops = [center_crop(load_skimage_image(n), 256) for n in args.images]
    else:
        photo = load_skimage_image("motorcycle_left")
        crops = [photo[r:r + 256, c:c + 256] for r, c in CROPS]
    rows = []
    for setting in args.settings:
        threshold, gamma_finest = (float(v) for v in setting.split(":"))
        estimator = KernelEstimator(threshold=threshold, gamma_finest=gamma_finest, shock_steps=3 if args.shock else 0)
        for family in args.families.split(","):
            size, draw, _ = FAMILIES[family]
            scores, errors = [], []
            for i, crop in enumerate(crops):
                x = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)[None].float()
                k_true = draw(size, 100 + i)
                blur = BlurOperator(k_true, "valid")
                y = blur.measure(x, SIGMA, torch.Generator().manual_seed(i))
                out = restore(y, BlindBlur(size, estimator=estimator), sigma_y=SIGMA, progress=False)
                scores.append(shift_scores(out.image, x, blur.measured_frame(tuple(x.shape)))[0])
                errors.append(kernel_error(out.kernel, k_true))
            rows.append({"threshold": threshold, "gamma_finest": gamma_finest, "shock": args.shock, "family": family,
                         "psnr": round(float(np.mean(scores)), 2), "crops": " ".join(f"{s:.2f}" for s in scores),
                         "kernel_error": round(float(np.mean(errors)), 2)})
            print(rows[-1], flush=True)
    if args.out is not None:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

"""Blind deblurring's designs measured on validation crops (never the held-out photos).

Four 256-px crops of scikit-image's motorcycle (left view: the embedded prior's validation photo),
each blurred by a kernel of each family of the blind protocol (valid boundary, σ 0.01), restored by:

- ``nfc-c2f``: the kernel estimated coarse to fine with NFC as the image step (at each scale two
  alternations of an NFC restoration and a kernel step on its strongest 3 % of gradients), then NFC;
- ``l0+nfc``: the classical L0 coarse-to-fine kernel (``estimate_kernel``), then NFC with it (the
  first three restore at the measurement's noise level);
- ``l0+nfc+refine``: the same, then twice the kernel from NFC's strongest 10 % of gradients and NFC
  again;
- ``l0+nfc+refine@2σ``: the same restored as if the noise were twice its level (the kernel's error
  taken as noise: what ``deblur_blind`` ships);
- ``nfc-true``: NFC with the true kernel (the bound).

Scored as the blind protocol scores (``nfc_dps.bench.blind.shift_scores``). Writes a CSV (one row
per crop, family and design) and prints the means.

    python scripts/blind_validation.py --out docs/notes/blind_validation.csv
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nfc_dps import restore
from nfc_dps.bench.blind import FAMILIES, SIGMA, shift_scores
from nfc_dps.operators import BlindBlur, BlurOperator, gaussian_kernel
from nfc_dps.operators.kernel_estimation import centred_kernel, kernel_error, kernel_step
from nfc_dps.priors.training_data import load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30))
DESIGNS = ("nfc-c2f", "l0+nfc", "l0+nfc+refine", "l0+nfc+refine@2σ", "nfc-true")


def _pyramid(size: int) -> list[int]:
    """Odd kernel sizes about halving from ``size`` down to no less than 7 px, coarse first."""
    sizes = [size]
    while True:
        smaller = int(round(sizes[-1] / 2))
        smaller -= 1 - smaller % 2
        if smaller < 7:
            return sizes[::-1]
        sizes.append(smaller)


def nfc_coarse_to_fine(y: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    """The kernel with NFC as the image step at each scale (:func:`_pyramid`'s kernel sizes)."""
    k, calls = None, 0
    h, w = y.shape[-2:]
    for s in _pyramid(size):
        r = s / size
        ys = F.interpolate(y, size=(round(h * r), round(w * r)), mode="bilinear", antialias=True) if s < size else y
        if k is None:
            k = gaussian_kernel(s, 1.0).double()
        else:
            k = centred_kernel(F.interpolate(k[None, None], size=(s, s), mode="bilinear", align_corners=True)[0, 0])
        for _ in range(2):
            out = restore(ys, BlurOperator(k.float(), "valid"), sigma_y=max(SIGMA * r, 0.002), progress=False)
            calls += out.nfe
            k = kernel_step(out.image[0], ys[0], s, k, threshold=0.15, salient=0.03)
    return k, calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the CSV to write")
    args = p.parse_args()
    photo = load_skimage_image("motorcycle_left")
    rows = []
    for family, (size, draw, _) in FAMILIES.items():
        for i, (r, c) in enumerate(CROPS):
            x = torch.from_numpy(np.ascontiguousarray(photo[r:r + 256, c:c + 256])).permute(2, 0, 1)[None].float()
            k_true = draw(size, 100 + i)
            y = BlurOperator(k_true, "valid").measure(x, SIGMA, torch.Generator().manual_seed(i))
            frame = BlurOperator(k_true, "valid").measured_frame(tuple(x.shape))
            for design in DESIGNS:
                t0 = time.perf_counter()
                if design == "nfc-c2f":
                    k, calls = nfc_coarse_to_fine(y, size)
                    out = restore(y, BlurOperator(k.float(), "valid"), sigma_y=SIGMA, progress=False)
                    image, nfe = out.image, calls + out.nfe
                elif design == "nfc-true":
                    out = restore(y, BlurOperator(k_true, "valid"), sigma_y=SIGMA, progress=False)
                    image, k, nfe = out.image, None, out.nfe
                else:
                    op = BlindBlur(size, refinements=0 if design == "l0+nfc" else 2)
                    if not design.endswith("@2σ"):  # the kernel's error not taken as noise
                        op.model_error = 0.0
                    out = restore(y, op, sigma_y=SIGMA, progress=False)
                    image, k, nfe = out.image, out.kernel, out.nfe
                score, similarity = shift_scores(image, x, frame)
                rows.append({"family": family, "crop": f"moto_r{r}c{c}", "design": design, "psnr": round(score, 3),
                             "ssim": round(similarity, 4), "kernel_error": "" if k is None else
                             round(kernel_error(k, k_true), 3), "nfe": nfe,
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for family in FAMILIES:
        for design in DESIGNS:
            mine = [r for r in rows if r["family"] == family and r["design"] == design]
            print(f"{family} {design}: PSNR {np.mean([r['psnr'] for r in mine]):.2f}")


if __name__ == "__main__":
    main()

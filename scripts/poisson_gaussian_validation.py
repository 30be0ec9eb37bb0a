"""``poisson-gaussian:auto`` and ``poisson:auto`` on validation crops (never the held-out photos): where
the shot-noise fit's settings of :mod:`nfc_dps.noise_level` (``SHOT_BINS``, the patch shapes) were
chosen.

Six crops of scikit-image's motorcycle (left view), as the noise-level tier measures its photos
(256-px crops area-averaged to 128 px) and at 256 px as they are, under Poisson-Gaussian noise over
a grid of peaks (photons at a clean value of 1) and read noise stds: per cell, each crop's relative
error of the estimated peak and read std (estimate / truth - 1; at read std 0, ``poisson:auto``'s
peak alone), and the median and worst absolute error over the crops.

    python scripts/poisson_gaussian_validation.py [--bins 6,8,10]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from nfc_dps import noise_level
from nfc_dps.noise import PoissonGaussianNoise
from nfc_dps.priors.training_data import load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30), (244, 480), (120, 240))
PEAKS = (10, 30, 100, 300)
READ_SIGMAS = (0.0, 0.005, 0.02)
#: (side of the crop taken, side it is area-averaged to)
SCALES = ((256, 128), (256, 256))


def crops(side: int, size: int) -> list[torch.Tensor]:
    """The validation crops, each (3, size, size) float64 in [0, 1]."""
    photo = load_skimage_image("motorcycle_left")
    zoom = side // size
    out = []
    for r, c in CROPS:
        a = photo[r:r + side, c:c + side].reshape(size, zoom, size, zoom, 3).mean(axis=(1, 3))
        out.append(torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).double())
    return out


def errors(images: list[torch.Tensor], peak: float, sigma: float) -> tuple[list[float], list[float]]:
    """Per image, the relative errors of the estimated peak and read std (the read std's: nan at 0)."""
    peak_errors, sigma_errors = [], []
    for i, x in enumerate(images):
        y = PoissonGaussianNoise(peak, sigma).sample(x[None], torch.Generator().manual_seed(i))[0]
        est_peak, est_sigma = noise_level.estimate_shot_noise(y, read_noise=sigma > 0)
        peak_errors.append(est_peak / peak - 1)
        sigma_errors.append(est_sigma / sigma - 1 if sigma > 0 else float("nan"))
    return peak_errors, sigma_errors


def summary(values: list[float]) -> str:
    a = np.abs(np.array(values))
    return f"median {np.median(a):.3f}, worst {a.max():.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bins", default=str(noise_level.SHOT_BINS), help="comma list of SHOT_BINS to compare")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for bins in (int(b) for b in args.bins.split(",")):
        noise_level.SHOT_BINS = bins
        for side, size in SCALES:
            images = crops(side, size)
            every_peak, every_sigma = [], []
            print(f"== SHOT_BINS {bins}, {len(images)} crops of {side} px at {size} px", flush=True)
            for sigma in READ_SIGMAS:
                for peak in PEAKS:
                    pe, se = errors(images, peak, sigma)
                    every_peak += pe
                    every_sigma += [] if sigma == 0 else se
                    read = "" if sigma == 0 else f"; sigma error {np.round(se, 3)} ({summary(se)})"
                    print(f"peak {peak:<4g} sigma {sigma:<6g} peak error {np.round(pe, 3)} ({summary(pe)}){read}",
                          flush=True)
            print(f"all cells: peak {summary(every_peak)}; sigma {summary(every_sigma)}", flush=True)


if __name__ == "__main__":
    main()

"""``sigma_y="auto"`` on denoising, on validation crops (never the held-out photos): where the
texture correction of :mod:`nfc_dps.noise_level` (``TEXTURE_READ``, ``TEXTURE_ONLY``) was chosen.

Four 256-px crops of scikit-image's motorcycle (left view) under Gaussian noise from 0 to 0.1: per
level, each crop's PSNR as measured, restored by NFC's default with ``auto`` and with the true
level, and the estimate.

    python scripts/auto_sigma_validation.py
"""

from __future__ import annotations

import numpy as np
import torch

from nfc_dps import build_operator, restore
from nfc_dps.metrics import psnr
from nfc_dps.priors.training_data import load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30))
LEVELS = (0.0, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


def main() -> None:
    photo = load_skimage_image("motorcycle_left")
    op = build_operator("denoise", 256)
    for sigma in LEVELS:
        rows = []
        for i, (r, c) in enumerate(CROPS):
            x = torch.from_numpy(np.ascontiguousarray(photo[r:r + 256, c:c + 256])).permute(2, 0, 1)[None].float()
            y = x + sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(i))
            auto = restore(y, op, sigma_y="auto", progress=False)
            true = restore(y, op, sigma_y=sigma, progress=False)
            rows.append([float(psnr(y.clamp(0, 1), x)), float(psnr(auto.image, x)), float(psnr(true.image, x)),
                         float(np.ravel(auto.noise_sigma)[0])])
        a = np.array(rows)
        print(f"sigma {sigma:g}: measured {a[:, 0].round(2)}, auto {a[:, 1].round(2)}, true sigma {a[:, 2].round(2)}, "
              f"estimate {a[:, 3].round(4)}", flush=True)


if __name__ == "__main__":
    main()

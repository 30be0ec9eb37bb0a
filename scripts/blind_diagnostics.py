"""Where blind deblurring's kernel error comes from, on validation images only (docs/notes/blind.md).

Each diagnostic prints, per kernel family and image, the kernel's error up to a shift
(:func:`~nfc_dps.operators.kernel_estimation.kernel_error`) and, last, the family's mean:

* ``photo``: :func:`~nfc_dps.operators.kernel_estimation.estimate_kernel` on the noisy photo, on the
  same photo without noise, and on the noisy photo denoised by the embedded prior first;
* ``step``: the kernel step given the true sharp image (the bound on what any image step can give),
  after 30, 100 and 300 conjugate-gradient iterations from a delta kernel, and after 150 with the
  image and the photo both smoothed by a Gaussian of std 1 px first (less noise in the photo's
  gradients, less of the kernel's finest detail);
* ``refit``: the kernel step given NFC's restoration made with the *true* kernel (what a
  refinement from a good restoration gives back), 300 iterations, thresholds 0.05 and 0.15;
* ``shock``: the estimator without and with its L0 image sharpened by three steps of a shock filter
  before each kernel step (``KernelEstimator.shock_steps``, after Cho and Lee 2009), the kernel fitted
  to all gradients or to the strongest 5 %.

Images: four crops of motorcycle (left view) and the 256-px centre crops of four of the prior's
training photographs; kernels, noise and boundary of the blind protocol (``nfc_dps.bench.blind``).

    python scripts/blind_diagnostics.py photo
    python scripts/blind_diagnostics.py step refit --families motion61
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

import nfc_dps.operators.kernel_estimation as ke
from nfc_dps import restore
from nfc_dps.bench.blind import FAMILIES, SIGMA
from nfc_dps.operators import BlurOperator, gaussian_kernel
from nfc_dps.operators.kernel_estimation import kernel_error, kernel_step
from nfc_dps.priors.default import load_prior
from nfc_dps.priors.training_data import HELDOUT_IMAGES, center_crop, load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30))  # as scripts/blind_validation.py
TRAINING_PHOTOS = ("rocket", "coins", "clock", "brick")


def validation_images() -> list[np.ndarray]:
    photo = load_skimage_image("motorcycle_left")
    assert not set(TRAINING_PHOTOS) & set(HELDOUT_IMAGES)
    return [photo[r:r + 256, c:c + 256] for r, c in CROPS] + [center_crop(load_skimage_image(n), 256)
                                                              for n in TRAINING_PHOTOS]


def denoised(prior, y: torch.Tensor, sigma: float) -> torch.Tensor:
    """The prior's one-call estimate of the noise-free photo (1, C, h, w), padded to its size multiple."""
    m, (h, w) = prior.size_multiple, y.shape[-2:]
    padded = F.pad(y, (0, -w % m, 0, -h % m), mode="reflect")
    with torch.no_grad():
        return ((prior(2 * padded - 1, torch.tensor([2 * sigma])) + 1) / 2)[..., :h, :w]


def photo(x, y, blur, size, k_true, prior) -> dict[str, float]:
    sources = {"noisy": y, "noise-free": blur.A(x), "denoised": denoised(prior, y, SIGMA)}
    return {name: kernel_error(ke.estimate_kernel(src[0], size), k_true) for name, src in sources.items()}


def smoothed(img: torch.Tensor, std: float) -> torch.Tensor:
    """(C, H, W) ``img`` convolved by a Gaussian of ``std`` px (reflected at the border)."""
    g = gaussian_kernel(2 * int(3 * std) + 1, std).to(img.dtype)
    r = g.shape[0] // 2
    padded = F.pad(img[:, None], (r, r, r, r), mode="reflect")
    return F.conv2d(padded, g[None, None])[:, 0]


def step(x, y, blur, size, k_true, prior) -> dict[str, float]:
    errors = {f"{it} iterations": kernel_error(kernel_step(x[0], y[0], size, None, 1e-2, 0.05, iterations=it), k_true)
              for it in (30, 100, 300)}
    k = kernel_step(smoothed(x[0], 1.0), smoothed(y[0], 1.0), size, None, 1e-2, 0.05, iterations=150)
    return {**errors, "smoothed": kernel_error(k, k_true)}


def refit(x, y, blur, size, k_true, prior) -> dict[str, float]:
    restored = restore(y, blur, prior=prior, sigma_y=2 * SIGMA, progress=False).image
    return {f"threshold {t}": kernel_error(kernel_step(restored[0], y[0], size, None, 1e-2, t, iterations=300,
                                                       salient=0.1), k_true)
            for t in (0.05, 0.15)}


@contextlib.contextmanager
def strongest_gradients(salient: float):
    """A context in which the estimator's kernel steps fit only the ``salient`` fraction of the
    image's strongest gradients."""
    original = ke.kernel_step
    ke.kernel_step = lambda *a, **kw: original(*a, **{**kw, "salient": salient})
    try:
        yield
    finally:
        ke.kernel_step = original


def shock(x, y, blur, size, k_true, prior) -> dict[str, float]:
    plain, shocked = ke.KernelEstimator(shock_steps=0), ke.KernelEstimator(shock_steps=3)
    out = {"no shock filter": kernel_error(ke.estimate_kernel(y[0], size, plain), k_true),
           "shock": kernel_error(ke.estimate_kernel(y[0], size, shocked), k_true)}
    with strongest_gradients(0.05):
        out["shock, strongest 5 %"] = kernel_error(ke.estimate_kernel(y[0], size, shocked), k_true)
    return out


DIAGNOSTICS: dict[str, Callable[..., dict[str, float]]] = {"photo": photo, "step": step, "refit": refit, "shock": shock}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("diagnostics", nargs="+", choices=sorted(DIAGNOSTICS))
    p.add_argument("--families", default=",".join(FAMILIES), help="kernel families (default: all)")
    args = p.parse_args()
    prior, images = load_prior(), validation_images()
    for name in args.diagnostics:
        for family in args.families.split(","):
            size, draw, _ = FAMILIES[family]
            errors: dict[str, list[float]] = {}
            for i, img in enumerate(images):
                x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()
                k_true = draw(size, 100 + i)
                blur = BlurOperator(k_true, "valid")
                y = blur.measure(x, SIGMA, torch.Generator().manual_seed(i))
                for key, err in DIAGNOSTICS[name](x, y, blur, size, k_true, prior).items():
                    errors.setdefault(key, []).append(err)
                print(name, family, i, {k: round(v[-1], 3) for k, v in errors.items()}, flush=True)
            print(name, family, "mean", {k: round(float(np.mean(v)), 3) for k, v in errors.items()}, flush=True)


if __name__ == "__main__":
    main()

"""Training and evaluation images that ship inside installed packages (no downloads).

The embedded default prior is trained on scikit-image's bundled public-domain photographs plus a
procedural dead-leaves model. Named evaluation images are held out of training, and
scikit-learn's two sample photographs (china.jpg, flower.jpg) are never used for training.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..frequency import fit_power_law

#: skimage.data photographs used for training (gray ones are replicated to RGB).
TRAIN_IMAGES = (
    "rocket", "hubble_deep_field", "immunohistochemistry", "retina", "brick", "grass",
    "gravel", "moon", "coins", "clock", "page", "text", "cell",
)
#: skimage.data photographs held out for evaluation (never trained on).
HELDOUT_IMAGES = ("astronaut", "coffee", "chelsea", "camera")


def load_skimage_image(name: str) -> np.ndarray:
    """A bundled scikit-image photograph as float32 (H, W, 3) in [0, 1] (gray replicated)."""
    import skimage.data
    from skimage.util import img_as_float32

    if name in ("motorcycle_left", "motorcycle_right"):  # the two views of skimage's stereo pair
        img = skimage.data.stereo_motorcycle()[0 if name == "motorcycle_left" else 1]
    else:
        try:
            img = getattr(skimage.data, name)()
        except AttributeError as e:
            raise ValueError(f"skimage.data has no image {name!r}") from e
    img = img_as_float32(img)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return np.ascontiguousarray(img[..., :3])


def dead_leaves(size: int, rng: np.random.Generator, n_disks: int = 600, r_min: float = 2.0, r_max: float = 96.0) -> np.ndarray:
    """A dead-leaves image (H = W = size, RGB in [0, 1]): occluding disks with radii ~ r^-3.

    Its power spectrum falls like |omega|^-2, as natural images do; colours are drawn per disk
    with a mild texture gradient so the model sees edges, flat regions and shading.
    """
    img = np.zeros((size, size, 3), np.float32)
    filled = np.zeros((size, size), bool)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    # radius density ~ r^-3 via inverse CDF
    u = rng.random(n_disks)
    radii = 1.0 / np.sqrt(u / r_min**2 + (1 - u) / r_max**2)
    for r in radii:
        cy, cx = rng.uniform(-r, size + r, 2)
        # the disk's bounding box (one pixel of margin): the same pixels and values as the whole
        # grid, at a fraction of the cost (most disks are small)
        y0, y1 = max(0, int(np.floor(cy - r))), min(size, int(np.ceil(cy + r)) + 1)
        x0, x1 = max(0, int(np.floor(cx - r))), min(size, int(np.ceil(cx + r)) + 1)
        if y0 >= y1 or x0 >= x1:
            continue
        by, bx = yy[y0:y1, x0:x1], xx[y0:y1, x0:x1]
        d2 = (by - cy) ** 2 + (bx - cx) ** 2
        disk = (d2 <= r * r) & ~filled[y0:y1, x0:x1]
        if not disk.any():
            continue
        colour = rng.random(3).astype(np.float32)
        grad = rng.normal(0, 0.3, 2).astype(np.float32) / max(r, 1.0)
        shade = (by - cy) * grad[0] + (bx - cx) * grad[1]
        img[y0:y1, x0:x1][disk] = np.clip(colour[None, :] + shade[disk][:, None], 0, 1)
        filled[y0:y1, x0:x1] |= disk
        if filled.all():
            break
    return img


def images_power_law(images: Sequence[np.ndarray], crop: int = 64, per_image: int = 8,
                     seed: int = 0) -> tuple[float, float]:
    """(amplitude, alpha) of S = amplitude * r^-alpha fitted to random crops of (H, W, C) images in [0, 1].

    Model units ([-1, 1]), orthonormal FFT, r the normalised radius of nfc_dps.frequency; the
    geometric mean of the per-crop amplitudes and the median exponent (r in [0.02, 0.5]); crops
    shrink to fit small images. Stored with a trained prior so samplers can use the spectrum it
    was trained on.
    """
    import torch

    rng = np.random.default_rng(seed)
    size = min(crop, *(min(im.shape[:2]) for im in images))
    crops = []
    for img in images:
        for _ in range(per_image):
            y, x = rng.integers(img.shape[0] - size + 1), rng.integers(img.shape[1] - size + 1)
            crops.append(img[y : y + size, x : x + size])
    batch = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).double() * 2 - 1
    amplitude, alpha = fit_power_law(batch, r_min=0.02, r_max=0.5)
    return float(amplitude.log().mean().exp()), float(alpha.median())


def center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """Centre ``size`` x ``size`` crop (each side capped at the image's); ``size <= 0``: the image."""
    if size <= 0:
        return img
    h, w = img.shape[:2]
    ch, cw = min(size, h), min(size, w)
    y, x = (h - ch) // 2, (w - cw) // 2
    return np.ascontiguousarray(img[y : y + ch, x : x + cw])

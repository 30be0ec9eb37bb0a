"""Build an operator from a task name and parameters (the configs' entry point).

``TASKS`` maps every task to its parameters and their defaults; ``None`` marks a required
parameter (a file path). Random kernels and masks are drawn from ``seed`` (numpy Generator for
motion kernels, torch Generator for masks), so a (task, image_size, seed, params) tuple fixes the
operator. The kernel or mask is kept on the operator (``op.kernel``, ``op.mask``) for recording.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .base import LinearOperator
from .blur import BlurOperator
from .denoising import Denoising
from .inpainting import Inpainting, box_mask, load_mask, random_mask
from .kernels import gaussian_kernel, load_kernel, motion_kernel
from .superres import SuperResolution

__all__ = ["TASKS", "build_operator", "check_task_params"]

TASKS: dict[str, dict[str, Any]] = {
    "sr_bicubic": {"factor": 4},
    "sr_average": {"factor": 4},
    "inpaint_box": {"box_size": 128, "margin": 16},
    "inpaint_random": {"missing_fraction": 0.7},
    "inpaint_mask": {"mask_path": None},
    "deblur_gaussian": {"kernel_size": 61, "kernel_std": 3.0, "boundary": "circular"},
    "deblur_motion": {"kernel_size": 61, "intensity": 0.5, "boundary": "circular"},
    "deblur_kernel": {"kernel_path": None, "boundary": "circular"},
    "denoise": {},
}


def _image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        h = w = int(image_size)
    elif isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        h, w = (int(v) for v in image_size)
    else:
        raise ValueError(f"image_size must be an int or (H, W), got {image_size!r}")
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    return h, w


def build_operator(task: str, image_size: int | Sequence[int] = (256, 256), seed: int = 0,
                   **params: Any) -> LinearOperator:
    """Operator for ``task`` (a key of TASKS) on images of ``image_size`` (H, W).

    Raises ValueError for an unknown task or parameter (listing the allowed names), a missing
    required parameter, or a size the operator cannot handle (SR factor, mask size).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; allowed tasks: {', '.join(TASKS)}")
    allowed = TASKS[task]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        names = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for task {task!r}; allowed: {names}")
    p = {**allowed, **params}
    missing = [k for k, v in p.items() if v is None]
    if missing:
        raise ValueError(f"task {task!r} needs parameter(s): {', '.join(missing)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    h, w = _image_size(image_size)

    if task in ("sr_bicubic", "sr_average"):
        op = SuperResolution(p["factor"], method=task[3:])
        op.measurement_shape((1, 1, h, w))  # fails early if the size is not divisible
        return op
    if task == "inpaint_box":
        return Inpainting(box_mask(h, w, p["box_size"], p["margin"], torch.Generator().manual_seed(int(seed))))
    if task == "inpaint_random":
        return Inpainting(random_mask(h, w, p["missing_fraction"], torch.Generator().manual_seed(int(seed))))
    if task == "inpaint_mask":
        mask = load_mask(p["mask_path"])
        if tuple(mask.shape) != (h, w):
            raise ValueError(f"mask {str(p['mask_path'])!r} has size {tuple(mask.shape)}, the images are {(h, w)}")
        return Inpainting(mask)
    if task == "deblur_gaussian":
        return BlurOperator(gaussian_kernel(p["kernel_size"], p["kernel_std"]), p["boundary"])
    if task == "deblur_motion":
        kernel = motion_kernel(p["kernel_size"], p["intensity"], np.random.default_rng(int(seed)))
        return BlurOperator(kernel, p["boundary"])
    if task == "deblur_kernel":
        return BlurOperator(load_kernel(p["kernel_path"]), p["boundary"])
    return Denoising()


def check_task_params(task: str, **params: Any) -> None:
    """The checks of :func:`build_operator` on parameter values that do not depend on the image
    size, made at once (on a canvas that every valid value fits) so that a bad config is reported
    before any image is read. Mask and kernel files are not read here (a folder holds one per
    image). ValueError names the task and the parameters given."""
    p = {**TASKS.get(task, {}), **params}
    try:
        if task == "deblur_kernel":
            BlurOperator(torch.ones(1, 1), p["boundary"])
            return
        if task == "inpaint_mask":
            return
        size: tuple[int, int] = (8, 8)
        if task in ("sr_bicubic", "sr_average") and isinstance(p["factor"], int) and p["factor"] >= 2:
            size = (2 * p["factor"], 2 * p["factor"])
        elif task == "inpaint_box":
            box, margin = p["box_size"], p["margin"]
            bh, bw = box if isinstance(box, (tuple, list)) else (box, box)
            mh, mw = margin if isinstance(margin, (tuple, list)) else (margin, margin)
            if all(isinstance(v, int) for v in (bh, bw, mh, mw)):
                size = (max(bh, 1) + 2 * max(mh, 0) + 1, max(bw, 1) + 2 * max(mw, 0) + 1)
        build_operator(task, size, seed=0, **params)
    except (TypeError, ValueError) as e:
        given = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ValueError(f"task {task!r}{f' ({given})' if given else ''}: {e}") from e

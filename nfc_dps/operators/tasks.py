"""The task registry: every restoration task the configs, the command line, the benchmark harness,
the demo and the operator property tests know, in one place.

A :class:`Task` declares its name, its operator family, its parameters with their defaults (the
type of a default is the parameter's type; ``None`` marks a required file path), how it builds its
operator, what it draws at random from the seed (a mask or a kernel), what it reads from a file,
and which parameter is an upscale factor. Random kernels and masks are drawn from ``seed`` (numpy
Generator for motion kernels, torch Generator for masks), so (task, image size, seed, parameters)
fixes the operator. Adding a task is one entry in :data:`TASKS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..io.jpeg import SUBSAMPLINGS, quality_tables, write_jpeg
from .base import LinearOperator
from .blind import BlindBlur
from .blur import BlurOperator
from .colorize import Colorization, gray_measurement
from .denoising import Denoising
from .inpainting import Inpainting, box_mask, load_mask, random_mask
from .jpeg import JpegOperator, jpeg_measurement
from .kernel_estimation import default_kernel_size
from .kernels import gaussian_kernel, load_kernel, motion_kernel
from .nonlinear import CameraBlur, Exposure, HighDynamicRange, PhaseRetrieval
from .superres import SuperResolution

__all__ = ["Task", "TASKS", "build_operator", "check_task_params", "task_reading"]

@dataclass(frozen=True)
class Task:
    """A restoration task.

    name: the one name of the task (CLI ``--task``, config files, harness, docs).
    family: the operator family ("sr", "inpaint", "blur", "denoise", or another operator's own).
    params: parameter -> default; the default's type is the parameter's (``None``: a required file
        path). build(h, w, seed, params) -> the operator on (h, w) images, params complete.
    draws: "mask" / "kernel" when the operator is drawn at random from the seed (restoring real
        data then needs the actual one, from a file), else None.
    reads: "mask" / "kernel" when the operator is read from the file (or folder of per-image
        files) named by the parameter ``<reads>_path``, else None.
    factor_param: the parameter that is the upscale factor (outputs are that many times larger).
    pair_params: int parameters that also take an (h, w) pair.
    check_size: params -> an image size every valid value of them fits (to check values before
        any image is read).
    params_at: image side -> the parameters that scale with the image at that side (their defaults
        are a 256-px image's: the box inpainting's box and margin); None: none scales.
    unbounded: the measurement may leave [0, 1] without noise (phase retrieval's amplitudes): files
        of it are float TIFFs.
    rotation_twin: the image rotated by 180 degrees measures the same (phase retrieval): a score
        against the truth counts the better of the two.
    estimates: "kernel" when the operator's kernel is estimated from each measurement (blind
        deblurring): the restoration carries it (``Restoration.kernel``), the CLI writes it.
    measurement_in: (image read from a file (h, w[, C]), file name) -> the measurement it holds,
        ValueError naming the file when it holds none (colorization: a gray photo's luma); None:
        the image itself.
    reads_measurement: path of an input file -> (its operator, its measurement (1, C, h, w)): the
        operator and the measurement both read from the file (a JPEG's quantisation tables, chroma
        subsampling and size, and its stored coefficients: task jpeg), so each input has its own
        operator and ``build`` is only what ``simulate`` and :func:`build_operator` use; an
        :class:`~nfc_dps.io.ImageReadError` naming the file when it holds no such measurement
        (a PNG given to jpeg). None: the operator is built, the file read as an image.
    writes_measurement: (extension, writer(path, clean image (h, w[, C]) in [0, 1], params)): the
        measurement ``simulate`` writes is a file of this kind made from the clean image (a real
        JPEG at ``quality``), which ``reads_measurement`` reads back; None: the operator's
        ``measure``, written as an image.
    """

    name: str
    family: str
    params: Mapping[str, Any]
    build: Callable[[int, int, int, dict[str, Any]], LinearOperator]
    draws: str | None = None
    reads: str | None = None
    factor_param: str | None = None
    pair_params: frozenset[str] = frozenset()
    check_size: Callable[[dict[str, Any]], tuple[int, int]] = field(default=lambda p: (8, 8))
    params_at: Callable[[int], dict[str, Any]] | None = None
    unbounded: bool = False
    rotation_twin: bool = False
    estimates: str | None = None
    measurement_in: Callable[[np.ndarray, str], np.ndarray] | None = None
    reads_measurement: Callable[[Path], tuple[LinearOperator, torch.Tensor]] | None = None
    writes_measurement: tuple[str, Callable[[Path, np.ndarray, dict[str, Any]], Any]] | None = None

    @property
    def file_param(self) -> str | None:
        """The parameter naming the mask / kernel file or folder (None: the task reads no file)."""
        return f"{self.reads}_path" if self.reads else None

    def upscale(self, params: Mapping[str, Any] | None = None) -> int:
        """How many times larger the image is than the measurement (1 unless SR)."""
        if self.factor_param is None:
            return 1
        return int({**self.params, **(params or {})}[self.factor_param])


def _sr(method: str) -> Callable[[int, int, int, dict[str, Any]], LinearOperator]:
    def build(h: int, w: int, seed: int, p: dict[str, Any]) -> LinearOperator:
        op = SuperResolution(p["factor"], method=method)
        op.measurement_shape((1, 1, h, w))  # fails early if the size is not divisible
        return op
    return build


def _sr_size(p: dict[str, Any]) -> tuple[int, int]:
    f = p.get("factor")
    return (2 * f, 2 * f) if isinstance(f, int) and not isinstance(f, bool) and f >= 2 else (8, 8)


def _box_size(p: dict[str, Any]) -> tuple[int, int]:
    box, margin = p["box_size"], p["margin"]
    bh, bw = box if isinstance(box, (tuple, list)) else (box, box)
    mh, mw = margin if isinstance(margin, (tuple, list)) else (margin, margin)
    if not all(isinstance(v, int) for v in (bh, bw, mh, mw)):
        return (8, 8)
    return (max(bh, 1) + 2 * max(mh, 0) + 1, max(bw, 1) + 2 * max(mw, 0) + 1)


def _mask_file(h: int, w: int, seed: int, p: dict[str, Any]) -> LinearOperator:
    mask = load_mask(p["mask_path"])
    if tuple(mask.shape) != (h, w):
        raise ValueError(f"mask {str(p['mask_path'])!r} has size {tuple(mask.shape)}, the images are {(h, w)}")
    return Inpainting(mask)


def _jpeg_params(p: dict[str, Any]) -> tuple[int, str]:
    quality, subsampling = p["quality"], p["subsampling"]
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be an int in 1..100 (a JPEG encoder's quality), got {quality!r}")
    if subsampling not in SUBSAMPLINGS:
        raise ValueError(f"subsampling must be one of {', '.join(SUBSAMPLINGS)}, got {subsampling!r}")
    return int(quality), subsampling


def _jpeg_build(h: int, w: int, seed: int, p: dict[str, Any]) -> LinearOperator:
    """The JPEG operator of Pillow's (libjpeg's) tables at ``quality``: what simulate writes."""
    quality, subsampling = _jpeg_params(p)
    return JpegOperator(np.stack(quality_tables(quality)), (h, w), subsampling)


def _jpeg_read(path: Path) -> tuple[LinearOperator, torch.Tensor]:
    """A JPEG file's operator and measurement (:func:`nfc_dps.operators.jpeg.jpeg_measurement`)."""
    m = jpeg_measurement(path)
    return m.operator, m.y


def _jpeg_write(path: Path, image: np.ndarray, p: dict[str, Any]) -> Any:
    """A real JPEG file of the clean ``image`` at the task's quality and subsampling."""
    quality, subsampling = _jpeg_params(p)
    return write_jpeg(path, image, quality, subsampling)


#: the blur tasks' default boundary: a photograph's (the scene goes on past the frame), as the
#: shipped configs; the benchmark protocols state theirs
PHOTO_BOUNDARY = "valid"


def _register(*tasks: Task) -> dict[str, Task]:
    return {t.name: t for t in tasks}


TASKS: dict[str, Task] = _register(
    Task("sr_bicubic", "sr", {"factor": 4}, _sr("bicubic"), factor_param="factor", check_size=_sr_size),
    Task("sr_average", "sr", {"factor": 4}, _sr("average"), factor_param="factor", check_size=_sr_size),
    Task("inpaint_box", "inpaint", {"box_size": 128, "margin": 16},
         lambda h, w, seed, p: Inpainting(box_mask(h, w, p["box_size"], p["margin"],
                                                   torch.Generator().manual_seed(int(seed)))),
         draws="mask", pair_params=frozenset({"box_size", "margin"}), check_size=_box_size,
         params_at=lambda side: {"box_size": side // 2, "margin": max(1, side // 16)}),
    Task("inpaint_random", "inpaint", {"missing_fraction": 0.7},
         lambda h, w, seed, p: Inpainting(random_mask(h, w, p["missing_fraction"],
                                                      torch.Generator().manual_seed(int(seed)))),
         draws="mask"),
    Task("inpaint_mask", "inpaint", {"mask_path": None}, _mask_file, reads="mask"),
    Task("deblur_gaussian", "blur", {"kernel_size": 61, "kernel_std": 3.0, "boundary": PHOTO_BOUNDARY},
         lambda h, w, seed, p: BlurOperator(gaussian_kernel(p["kernel_size"], p["kernel_std"]), p["boundary"])),
    Task("deblur_motion", "blur", {"kernel_size": 61, "intensity": 0.5, "boundary": PHOTO_BOUNDARY},
         lambda h, w, seed, p: BlurOperator(motion_kernel(p["kernel_size"], p["intensity"],
                                                          np.random.default_rng(int(seed))), p["boundary"]),
         draws="kernel"),
    Task("deblur_kernel", "blur", {"kernel_path": None, "boundary": PHOTO_BOUNDARY},
         lambda h, w, seed, p: BlurOperator(load_kernel(p["kernel_path"]), p["boundary"]), reads="kernel",
         check_size=lambda p: (8, 8)),
    # kernel_size 0: scaled with the photo (the image_size the CLI builds with), 31 px at 256 px
    Task("deblur_blind", "blur", {"kernel_size": 0, "boundary": PHOTO_BOUNDARY},
         lambda h, w, seed, p: BlindBlur(p["kernel_size"] or default_kernel_size(h, w), p["boundary"]),
         estimates="kernel"),
    Task("denoise", "denoise", {}, lambda h, w, seed, p: Denoising()),
    Task("colorize", "other", {}, lambda h, w, seed, p: Colorization(), measurement_in=gray_measurement),
    # a JPEG file: its operator (tables, subsampling, size) and measurement read from each file;
    # quality and subsampling are simulate's (and build_operator's)
    Task("jpeg", "other", {"quality": 20, "subsampling": "4:2:0"}, _jpeg_build,
         reads_measurement=_jpeg_read, writes_measurement=(".jpg", _jpeg_write)),
    # nonlinear forward models (nfc_dps.operators.nonlinear)
    Task("hdr", "nonlinear", {"scale": 2.0}, lambda h, w, seed, p: HighDynamicRange(p["scale"])),
    Task("exposure", "nonlinear", {"ev": 1.0}, lambda h, w, seed, p: Exposure(p["ev"])),
    Task("phase_retrieval", "nonlinear", {"oversample": 2.0}, lambda h, w, seed, p: PhaseRetrieval(p["oversample"]),
         unbounded=True, rotation_twin=True),
    Task("deblur_camera", "nonlinear", {"kernel_size": 61, "kernel_std": 3.0, "boundary": PHOTO_BOUNDARY},
         lambda h, w, seed, p: CameraBlur(BlurOperator(gaussian_kernel(p["kernel_size"], p["kernel_std"]),
                                                       p["boundary"]))),
)


def task_reading(family: str, what: str) -> Task | None:
    """The task of ``family`` that reads its ``what`` ("mask" / "kernel") from a file, if any."""
    return next((t for t in TASKS.values() if t.family == family and t.reads == what), None)


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
    """Operator for ``task`` (a key of :data:`TASKS`) on images of ``image_size`` (H, W).

    Raises ValueError for an unknown task or parameter (listing the allowed names), a missing
    required parameter, or a size the operator cannot handle (SR factor, mask size).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; allowed tasks: {', '.join(TASKS)}")
    allowed = TASKS[task].params
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
    return TASKS[task].build(h, w, int(seed), p)


def check_task_params(task: str, **params: Any) -> None:
    """The checks of :func:`build_operator` on parameter values that do not depend on the image
    size, made at once (on a canvas that every valid value fits) so that a bad config is reported
    before any image is read. Mask and kernel files are not read here (a folder holds one per
    image). ValueError names the task and the parameters given."""
    spec = TASKS.get(task)
    p = {**(spec.params if spec else {}), **params}
    try:
        if spec is not None and spec.reads:  # a stand-in for the file checks the other parameters
            stand_in = {"kernel": torch.ones(1, 1), "mask": torch.ones(8, 8)}[spec.reads]
            if spec.reads == "kernel":
                BlurOperator(stand_in, p["boundary"])
            return
        build_operator(task, spec.check_size(p) if spec else (8, 8), seed=0, **params)
    except (TypeError, ValueError) as e:
        given = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ValueError(f"task {task!r}{f' ({given})' if given else ''}: {e}") from e

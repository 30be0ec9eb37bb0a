"""What one restored image leaves in the output folder: its input and job (:class:`Item`,
:class:`Job`), its files (:func:`write_outputs`: the restoration, std map, samples and calibrated
interval, the main image last; :func:`planned_outputs` names them before the run, and
:func:`check_output_names` refuses a run where one input's would replace another's) and its
metrics against a ground truth (:func:`add_ground_truth_metrics`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import io as nio
from ..metrics import rotation_twin_aligned
from .common import STD_PNG_SCALE, UsageError, image_metrics, match_file
from .common import to_numpy as _to_numpy
from .outputs import npy_bytes
from .records import EarlierRuns


@dataclass
class Item:
    """An input image: its index in the sorted list, path, name (relative, '/'-separated), output stem and seed."""

    index: int
    path: Path
    name: str
    out_stem: str
    seed: int


@dataclass
class Job:
    """An image to restore: its measurement y ((h, w[, C]) in [0, 1]), operator and manifest key.
    Jobs of one ``group`` (measurement shape, operator file) can share a restore() call."""

    item: Item
    row: dict[str, Any]
    key: str
    y: np.ndarray
    info: nio.ImageInfo
    operator: Any
    group: tuple



def planned_outputs(stem: str, samples: int, save_samples: bool, calibrated: bool,
                    kernel: bool = False) -> list[tuple[str, str]]:
    """(path relative to the output folder, what it is) of each file :func:`write_outputs` writes for
    the input of output stem ``stem``, the restoration first (``kernel``: a blind blur's estimate)."""
    files = [(f"{stem}.png", "restoration")]
    if samples > 1:
        files += [(f"std/{stem}.png", "std map"), (f"std/{stem}.npy", "std map")]
        if save_samples:
            files += [(f"samples/{stem}_{j}.png", "sample") for j in range(samples)]
    if calibrated:
        files += [(f"{stem}_{end}.png", f"{end} interval bound") for end in ("lower", "upper")]
    if kernel:
        files += [(f"kernels/{stem}.npy", "estimated kernel"), (f"kernels/{stem}.png", "estimated kernel")]
    return files


def check_output_names(plan: dict[str, list[tuple[str, str]]], earlier: EarlierRuns, manifest: Path) -> None:
    """UsageError (before any work) where a file of one input (``plan``: input name -> its
    :func:`planned_outputs`) is a file of another input: of this run, or of an earlier run that
    ``manifest`` records (``earlier``), unless this run redoes that input without it. Two
    restorations of one name are :func:`~nfc_dps.cli.outputs.output_stems`' to settle."""
    mine = {name: {rel.casefold() for rel, _ in files} for name, files in plan.items()}
    planned: dict[str, tuple[str, str]] = {}
    for name, files in plan.items():
        for rel, kind in files:
            other = planned.setdefault(rel.casefold(), (name, kind))
            if other[0] != name:
                if other[1].endswith("interval bound"):  # name it as the interval written over a restoration
                    name, kind, other = other[0], other[1], (name, kind)
                raise UsageError(_clash(rel, (name, kind), other, "that this run writes"))
    for name, files in plan.items():
        for rel, kind in files:
            other = earlier.owners.get(rel.casefold())
            if other is None or other[0] == name or (kind, other[1]) == ("restoration", "restoration"):
                continue
            if other[0] in mine and rel.casefold() not in mine[other[0]]:
                continue  # redone now without it
            raise UsageError(_clash(rel, (name, kind), other, f"that an earlier run recorded in {manifest}"))


def _clash(rel: str, one: tuple[str, str], other: tuple[str, str], where: str) -> str:
    """The refusal of ``rel`` written as ``one`` (input, what) over ``other``'s file."""
    writes = (f"--calibration writes the {one[1]} of {one[0]} as {rel}" if one[1].endswith("interval bound")
              else f"{one[0]} would be written as {rel} (its {one[1]})")
    return (f"{writes}, which would overwrite the {other[1]} of {other[0]} {where}; restore {one[0]} and "
            f"{other[0]} into separate --output folders, or rename one of them")


def write_outputs(out: Path, job: Job, res: Any, i: int, batch: int, bit_depth: int | None, samples: int,
                  save_samples: bool, frame: list[int] | None = None) -> dict[str, Any]:
    """Write image ``i`` of the restore() result ``res`` of ``batch`` images into ``out`` (at
    ``bit_depth``, None: the input's; std map when ``samples`` > 1, and each sample with
    ``save_samples``), fill the job's row; its manifest entry. ``frame`` ([top, left, height,
    width]): every image written is that region of the restoration (the photo's own frame)."""
    item, row, info = job.item, job.row, job.info
    h, w = job.y.shape[:2]

    def to_numpy(a: Any) -> np.ndarray:
        a = _to_numpy(a)
        if frame is None:
            return a
        top, left, fh, fw = frame
        return a[top:top + fh, left:left + fw]

    image = to_numpy(res.image[i:i + 1])
    if not np.isfinite(image).all():
        raise FloatingPointError("restoration contains NaN/Inf; not saved")
    bit_depth = bit_depth or info.output_bit_depth
    same_size = image.shape[:2] == (h, w)
    alpha = info.alpha if (info.has_alpha and same_size) else None
    row["alpha"] = "" if not info.has_alpha else ("re-attached" if same_size else
                                                  "dropped (output size differs from the input)")
    outputs = [f"{item.out_stem}.png"]
    extra: list[tuple[str, Callable[[Path], Any]]] = []
    if res.std is not None:
        std = to_numpy(res.std[i:i + 1])
        if not np.isfinite(std).all():
            raise FloatingPointError("posterior std contains NaN/Inf; not saved")
        std_map = np.sqrt(np.mean(std**2, axis=-1)) if std.ndim == 3 else std
        extra.append((f"std/{item.out_stem}.png", lambda p, m=std_map: nio.write_image(p, m * STD_PNG_SCALE, 16)))
        extra.append((f"std/{item.out_stem}.npy",
                      lambda p, s=std: nio.atomic_write_bytes(p, npy_bytes(s.astype(np.float32)))))
        if save_samples:
            for j in range(samples):
                a = to_numpy(res.samples[j, i:i + 1])
                extra.append((f"samples/{item.out_stem}_{j}.png",
                              lambda p, a=a: nio.write_image(p, a, bit_depth, alpha)))
    if getattr(res, "lower", None) is not None:  # the calibrated interval, beside the restoration
        for end, bound in (("lower", res.lower), ("upper", res.upper)):
            extra.append((f"{item.out_stem}_{end}.png",
                          lambda p, a=to_numpy(bound[i:i + 1]): nio.write_image(p, np.clip(a, 0, 1), 16)))
    if getattr(res, "kernel", None) is not None:  # a blind blur's estimate: reusable with --kernel
        k = np.asarray(res.kernel[i] if res.kernel.ndim == 3 else res.kernel, dtype=np.float32)
        if k.ndim != 2:
            raise ValueError(f"estimated kernel of shape {k.shape}: expected one (s, s) kernel per image")
        extra.append((f"kernels/{item.out_stem}.npy", lambda p, k=k: nio.atomic_write_bytes(p, npy_bytes(k))))
        extra.append((f"kernels/{item.out_stem}.png", lambda p, k=k: nio.write_image(p, k / k.max(), 16)))
    # write the extras first: the main image appearing last marks a complete set
    for rel, write in extra:
        write(out / rel)
        outputs.append(rel)
    nio.write_image(out / f"{item.out_stem}.png", image, bit_depth, alpha)
    row.update(nfe=int(res.nfe), seconds=round(float(res.seconds) / batch, 3), size=f"{image.shape[0]}x{image.shape[1]}")
    sigma = res.noise_sigma[i] if isinstance(res.noise_sigma, list) else res.noise_sigma
    row["noise_sigma"] = "" if sigma is None else f"{sigma:.5g}"  # the level restored with (estimated with auto)
    model = res.noise[i] if isinstance(res.noise, list) else res.noise
    row["noise"] = "" if model is None or sigma is not None else noise_spec(model)  # a non-Gaussian model's
    return {"input": item.name, "outputs": outputs, "seed": item.seed, "nfe": int(res.nfe),
            "seconds": row["seconds"], "size": row["size"], "alpha": row["alpha"], "noise_sigma": row["noise_sigma"],
            "noise": row["noise"], "bit_depth": bit_depth, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def noise_spec(model: Any) -> str:
    """A noise model as results.csv records it: its spec, each value to 5 significant digits."""
    record = model.record()
    return f"{record['kind']}:" + ",".join(f"{v:.5g}" for k, v in record.items() if k != "kind")


def estimate_note(row: dict[str, Any]) -> str:
    """The console's line on an image's estimated noise: its results.csv row's level or model."""
    if row.get("noise"):
        return f"noise estimated at {row['noise']} (peak: photons at a clean value of 1; sigma in [0, 1] units)"
    return f"noise level estimated at {row['noise_sigma']} ([0, 1] units)"


#: results.csv's ``scored`` of a restoration scored in full
WHOLE_IMAGE = "whole image"


def measured_frame(operator: Any, y: np.ndarray) -> list[int] | None:
    """[top, left, height, width] of the region of the restoration of measurement ``y``
    ((h, w[, C])) that the measurement lies over, when that is not the whole restoration (a blur
    with boundary 'valid'); else None."""
    frame_of = getattr(operator, "measured_frame", None)
    if frame_of is None:
        return None
    h, w = y.shape[:2]
    frame = frame_of(operator.image_shape((1, 1 if y.ndim == 2 else y.shape[-1], h, w)))
    return [int(v) for v in frame] if frame is not None else None


def _frame(value: Any) -> list[int] | None:
    """A manifest entry's ``measured_frame`` if it is one ([top, left, height, width], sizes >= 1)."""
    ok = isinstance(value, list) and len(value) == 4 and all(isinstance(v, int) and v >= 0 for v in value)
    return value if ok and min(value[2:]) >= 1 else None


def add_ground_truth_metrics(row: dict[str, Any], item: Item, gt_dir: Path | None, out: Path,
                             rotation_twin: bool = False, frame: Any = None) -> None:
    """PSNR / SSIM of the row's output in ``out`` against the ground truth of ``item`` in ``gt_dir``
    (same name, or same stem); a missing, unreadable or differently sized one is the row's error.
    ``rotation_twin``: the output rotated by 180 degrees is as good an answer (phase retrieval):
    the better of the two is scored. ``frame`` (:func:`measured_frame`): only the region the
    measurement saw is scored, in a truth of the restoration's size or in one of the frame's own
    size; the row's ``scored`` names the region."""
    if gt_dir is None:
        return
    frame = _frame(frame)
    try:
        gt_path = match_file(gt_dir, item.name, nio.IMAGE_EXTENSIONS)
    except OSError as e:  # the folder became unreadable during the run
        row["error"] = f"ground truth: cannot read {gt_dir} ({e.strerror or e})"
        return
    if gt_path is None:
        row["error"] = f"no ground truth for {item.name} in {gt_dir}"
        return
    try:
        gt, _ = nio.read_image(gt_path)
        x, _ = nio.read_image(out / row["output"])
    except (nio.ImageReadError, OSError) as e:
        row["error"] = f"ground truth: {e}"
        return
    if gt.ndim == 3 and x.ndim == 2:
        gt = gt.mean(-1)
    scored = WHOLE_IMAGE
    if frame is not None:
        top, left, fh, fw = frame
        # the restoration and the truth are each the whole scene (the frame, the band above and left of
        # it, and as wide a band or one pixel more below and right) or the photo's frame
        def on_frame(a: np.ndarray) -> np.ndarray | None:
            if a.shape[:2] == (fh, fw):
                return a
            scene = a.shape[0] - fh - top in (top, top + 1) and a.shape[1] - fw - left in (left, left + 1)
            return a[top:top + fh, left:left + fw] if scene else None

        x_frame, gt_frame = on_frame(x), on_frame(gt)
        if x_frame is not None and gt_frame is not None:
            x, gt = x_frame, gt_frame
            scored = f"measured frame {fh}x{fw} at row {top}, column {left}"
    if gt.shape != x.shape:
        row["error"] = f"ground truth {gt_path.name} is {gt.shape}, the restoration {x.shape}"
        return
    if rotation_twin:  # the estimate or its 180-degree rotation, whichever is nearer the truth
        aligned = rotation_twin_aligned(torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None] if x.ndim == 3
                                        else torch.from_numpy(np.ascontiguousarray(x))[None, None],
                                        torch.from_numpy(np.ascontiguousarray(gt)).permute(2, 0, 1)[None] if gt.ndim == 3
                                        else torch.from_numpy(np.ascontiguousarray(gt))[None, None])
        x = aligned[0].permute(1, 2, 0).numpy() if x.ndim == 3 else aligned[0, 0].numpy()
    row["psnr"], row["ssim"] = image_metrics(x, gt)
    row["scored"] = scored

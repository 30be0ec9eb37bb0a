"""The inputs of every row: the protocol's images (:func:`load_images`) and the measurement
store (:func:`measurement`): the operator (kernel or mask), the noise, y and the ground truth of a
(task, image), generated once from derived seeds and saved under OUT/measurements/TASK/IMAGE.{npz,json};
every method reads the same y, and a rerun reuses the files (a changed specification is an error)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..io import atomic_write_bytes, atomic_write_text
from ..operators import BlurOperator, Denoising, Inpainting, build_operator
from ..priors.training_data import HELDOUT_IMAGES, load_skimage_image
from ..restore_inputs import stable_seed
from .instruments import save_png
from .spec import BenchSpec, TaskSpec, seed_name


def _center_crop_zoom(img: np.ndarray, size: int, zoom: int) -> np.ndarray:
    """Centre crop of side size*zoom (clamped to the image), area-averaged down to size x size."""
    h, w = img.shape[:2]
    side = min(size * zoom, h, w)
    t, l = (h - side) // 2, (w - side) // 2
    crop = img[t:t + side, l:l + side]
    if side == size:
        return np.ascontiguousarray(crop)
    from PIL import Image

    chans = [np.asarray(Image.fromarray(crop[..., c].astype(np.float32), mode="F").resize((size, size), Image.BOX))
             for c in range(crop.shape[2])]
    return np.ascontiguousarray(np.stack(chans, -1))


def _load_folder(folder: Path, size: int) -> list[tuple[str, np.ndarray]]:
    """Images of a folder (sorted), shorter side resized to ``size`` (PIL bicubic, antialiased
    when shrinking), then centre-cropped to size x size (DAPS's loader)."""
    from PIL import Image

    exts = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in exts)
    if not files:
        raise FileNotFoundError(f"no images ({', '.join(sorted(exts))}) in {folder}")
    out = []
    for p in files:
        im = Image.open(p).convert("RGB")
        w, h = im.size
        s = size / min(w, h)
        im = im.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BICUBIC)
        w, h = im.size
        l, t = (w - size) // 2, (h - size) // 2
        arr = np.asarray(im.crop((l, t, l + size, t + size)), dtype=np.float32) / 255.0
        out.append((p.stem, arr))
    return out


def load_images(spec: BenchSpec) -> list[tuple[str, np.ndarray]]:
    """[(name, (H, W, 3) float32 in [0, 1])] for the protocol."""
    if spec.images:
        imgs = _load_folder(Path(spec.images), spec.size)
    elif spec.protocol == "paper" and not spec.image_names:
        raise ValueError("the paper protocol needs --images DIR (e.g. FFHQ 256 validation images) or "
                         "--image-names (scikit-image photographs, e.g. the held-out astronaut,coffee,chelsea,camera)")
    else:
        names = spec.image_names or HELDOUT_IMAGES
        imgs = [(n, _center_crop_zoom(load_skimage_image(n), spec.size, spec.zoom)) for n in names]
    if spec.num_images:
        imgs = imgs[: spec.num_images]
    return imgs


def _operator_from_arrays(task: TaskSpec, size: int, arrays: dict[str, np.ndarray]):
    """The operator of a saved measurement: its kernel or mask when saved, else rebuilt from the task."""
    if "kernel" in arrays:
        return BlurOperator(torch.from_numpy(arrays["kernel"]), task.params.get("boundary", "circular"))
    if "mask" in arrays:
        return Inpainting(torch.from_numpy(arrays["mask"]))
    if task.name == "denoise":
        return Denoising()
    return build_operator(task.name, size, 0, **task.params)


def measurement(spec: BenchSpec, task: TaskSpec, image: str, img: np.ndarray) -> tuple[Any, Tensor, Tensor, dict]:
    """(operator, x (1, C, H, W), y (1, C, h, w), meta): loaded from OUT/measurements if there,
    otherwise generated from the derived seeds and saved (npz + json)."""
    folder = spec.out / "measurements" / task.name
    npz, js = folder / f"{image}.npz", folder / f"{image}.json"
    meta = {"task": task.name, "params": task.params, "image": image,
            "size": spec.size, "zoom": spec.zoom, "sigma_y": spec.recorded_sigma(), "protocol": spec.protocol,
            "operator_seed": stable_seed(spec.seed, "operator", seed_name(task.name), image),
            "noise_seed": stable_seed(spec.seed, "noise", seed_name(task.name), image),
            "sampler_seed": stable_seed(spec.seed, "sampler", seed_name(task.name), image)}
    if spec.noise.gaussian_sigma is None:  # Gaussian measurements keep the record they had
        meta["noise"] = str(spec.noise)
    if npz.is_file() and js.is_file():
        saved = json.loads(js.read_text())
        if {k: saved.get(k) for k in meta} != json.loads(json.dumps(meta)):
            diff = sorted(k for k in meta if saved.get(k) != json.loads(json.dumps(meta))[k])
            raise ValueError(f"{js}: saved measurement differs from this run's specification in {diff}; "
                             f"use another --out (or delete {folder})")
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
        current = np.moveaxis(np.asarray(img, np.float32), -1, 0)
        # another image, not a decoder's or resampler's rounding (which stays well below one 8-bit level)
        if arrays["x"].shape != current.shape or float(np.abs(arrays["x"] - current).max()) > 1 / 255:
            raise ValueError(f"{npz}: the saved ground truth of {image!r} is not this run's image of that name "
                             f"(another --images folder, or the file changed); use another --out")
        op = _operator_from_arrays(task, spec.size, arrays)
        return op, torch.from_numpy(arrays["x"])[None], torch.from_numpy(arrays["y"])[None], saved
    op = build_operator(task.name, spec.size, meta["operator_seed"], **task.params)
    x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(img, -1, 0)))[None].float()
    gen = torch.Generator().manual_seed(meta["noise_seed"])
    y = op.measure(x, noise=spec.noise, generator=gen)
    arrays = {"x": x[0].numpy(), "y": y[0].numpy()}
    if op.blur_kernel() is not None:
        arrays["kernel"] = op.blur_kernel().numpy()
    if op.pixel_mask() is not None:
        arrays["mask"] = op.pixel_mask().numpy()
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(npz, buf.getvalue())
    atomic_write_text(js, json.dumps(meta, indent=1, sort_keys=True))
    if spec.save_images:
        save_png(spec.out / "images" / task.name / image / "gt.png", x[0])
        save_png(spec.out / "images" / task.name / image / "measurement.png", _measurement_view(op, y)[0])
    return op, x, y, meta


def _measurement_view(op, y: Tensor) -> Tensor:
    """y shown at the image size (nearest upsampling for SR)."""
    f = op.downsampling_factor
    if f:
        return y.repeat_interleave(f, -2).repeat_interleave(f, -1).clamp(0, 1)
    return y.clamp(0, 1)

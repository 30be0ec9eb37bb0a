"""Benchmark harness: PSNR/SSIM tables against the peers and classical baselines, NFE curves,
timing and memory, the Gaussian-oracle table, a per-NFE profile, and sharding over processes.

    python scripts/benchmark.py --protocol local --budgets 20,50,100 --out runs/bench/local
    python scripts/benchmark.py --protocol oracle --out runs/bench/oracle
    python scripts/benchmark.py --profile --size 256 --out runs/bench/profile
    python scripts/benchmark.py --protocol paper --images DIR --prior DIR --out runs/bench/paper
    torchrun --nproc_per_node=K scripts/benchmark.py ...          # shards (task, image) jobs

Grid: tasks x images x methods x NFE budgets, fixed seeds. Every seed is derived from
(--seed, task, image) alone (:func:`stable_seed`), so a row's numbers do not depend on which
process ran it, in which order, or with which other jobs.

Measurements (the kernel or mask, the noise, y and the ground truth) are generated once per
(task, image) and saved under OUT/measurements/TASK/IMAGE.{npz,json}; every method reads the
same y and a rerun reuses the files (a changed specification is an error, not a silent reuse).

Outputs (written atomically): results.csv (one row per task x image x method x estimator x
budget), summary.md (mean +- std tables, PSNR vs NFE, timing, memory, notes), config.json, the
restored images (OUT/images), and when matplotlib is installed psnr_vs_nfe.png and bars.png;
grid.png (one image across methods, every task) needs only PIL. Metrics are computed on
outputs clipped to [0, 1] (never rescaled); PSNR with data_range 1, SSIM with scikit-image's
conventions (:mod:`nfc_dps.metrics`). LPIPS only when the ``lpips`` package and its AlexNet
weights are on disk (nothing is downloaded); otherwise the column is empty.

Resumable: a rerun skips rows already in results.csv (or in a part file left by an interrupted
run). Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) the (task, image) jobs are sharded
round-robin over ranks (gloo on CPU, NCCL on GPUs); each rank appends its rows to
OUT/parts/rank{r}.csv, and after a barrier rank 0 merges them into results.csv in a canonical
order: the file equals a single-process run's except the timing and memory columns.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import dataclasses
import datetime
import hashlib
import io
import json
import math
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .api import stable_seed  # re-exported: the benchmark's seeds come from it

__all__ = ["build_parser", "main", "run", "BenchSpec", "stable_seed", "task_specs", "load_results",
           "COLUMNS", "DIFFUSION_METHODS", "CLASSICAL_METHODS"]

DIFFUSION_METHODS = ("nfc", "daps", "dps", "diffpir", "ddnm", "ddrm", "dpir")
CLASSICAL_METHODS = ("wiener", "tv", "bicubic", "biharmonic")
DEFAULT_METHODS = DIFFUSION_METHODS + CLASSICAL_METHODS
PROTOCOLS = ("local", "paper", "oracle", "mixture")
COLUMNS = ["protocol", "task", "image", "method", "estimator", "budget", "nfe", "psnr", "ssim", "mse", "lpips",
           "seconds", "peak_mem_mb", "seed", "note"]
KEY = ("task", "image", "method", "estimator", "budget")
#: columns that legitimately differ between runs (wall time and memory)
VOLATILE = ("seconds", "peak_mem_mb")
FORMAT_VERSION = 1


# =============================================================================== small helpers

def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


def _save_png(path: Path, img: Tensor | np.ndarray) -> None:
    """(C, H, W) tensor or (H, W[, C]) array in [0, 1] -> 8-bit PNG, atomically."""
    from PIL import Image

    a = img.detach().cpu().float().numpy() if isinstance(img, Tensor) else np.asarray(img, dtype=np.float32)
    if isinstance(img, Tensor):
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    buf = io.BytesIO()
    Image.fromarray((np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)).save(buf, format="PNG")
    _atomic_write_bytes(path, buf.getvalue())


def _fmt(v: float | None, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "" if v is None else str(v)
    return format(v, spec)


def machine_description() -> dict[str, Any]:
    """nproc, CPU model, RAM, torch version, GPU (if any)."""
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
    with contextlib.suppress(AttributeError):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


class PeakMemory:
    """Peak memory of a block in MB. CUDA: torch.cuda.max_memory_allocated (allocator peak,
    minus the allocation at entry). CPU: peak resident set size above the level at entry, by
    polling /proc/self/statm every 5 ms (falls back to the ru_maxrss delta elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mb: float | None = None

    @staticmethod
    def _rss() -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self._rss()
        self._peak = self._base or 0
        self._stop = threading.Event()
        if self._base is None:
            import resource

            self._maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return self

        def poll() -> None:
            while not self._stop.wait(0.005):
                r = self._rss()
                if r is not None and r > self._peak:
                    self._peak = r

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return
        if self._base is None:
            import resource

            self.mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self._maxrss0) / 1024
            return
        self._stop.set()
        self._thread.join()
        r = self._rss()
        if r is not None:
            self._peak = max(self._peak, r)
        self.mb = max(0.0, (self._peak - self._base) / 2**20)


# =============================================================================== LPIPS (optional)

_LPIPS_CACHE: dict[str, Any] = {}


def lpips_status() -> tuple[bool, str]:
    """(available, why): LPIPS needs the ``lpips`` package and AlexNet weights already on disk."""
    import importlib.util

    for mod in ("lpips", "torchvision"):
        if importlib.util.find_spec(mod) is None:
            return False, f"LPIPS not computed: {mod} is not installed (optional; nothing is downloaded)"
    import lpips as _lp

    lin = Path(_lp.__file__).parent / "weights" / "v0.1" / "alex.pth"
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    backbone = sorted(hub.glob("alexnet-*.pth")) if hub.is_dir() else []
    if not lin.is_file() or not backbone:
        return False, f"LPIPS not computed: AlexNet weights not on disk (expected {lin} and {hub}/alexnet-*.pth)"
    return True, "LPIPS (AlexNet, lpips package) on [-1, 1] images"


def _lpips(x: Tensor, ref: Tensor) -> float | None:
    ok, _ = lpips_status()
    if not ok:
        return None
    key = str(x.device)
    if key not in _LPIPS_CACHE:
        import lpips

        _LPIPS_CACHE[key] = lpips.LPIPS(net="alex", verbose=False).to(x.device).eval()
    with torch.no_grad():
        return float(_LPIPS_CACHE[key](x.float() * 2 - 1, ref.float() * 2 - 1).mean())


# =============================================================================== protocol specs

@dataclass(frozen=True)
class TaskSpec:
    """A benchmark task: a short name and the operator factory's task and parameters."""

    name: str
    factory_task: str
    params: dict[str, Any]


def task_specs(protocol: str, size: int, boundary: str) -> dict[str, TaskSpec]:
    """The tasks of a protocol at image size ``size`` (see module doc and docs/benchmarks.md).

    local: SR x4 bicubic; box inpainting, box size/2 with margin size/16; random inpainting 70%;
    Gaussian blur 25x25 std 2; motion blur 25x25 intensity 0.5 (seeded per image); denoising.
    paper (DPS/DAPS at 256): SR x4 bicubic; 128x128 box (size/2) with margin 16 (size/16);
    70% random; Gaussian 61/3.0; motion 61/0.5.
    """
    blur = {"boundary": boundary}
    box = {"box_size": max(1, size // 2), "margin": max(0, size // 16)}
    if protocol == "paper":
        gk, mk = {"kernel_size": 61, "kernel_std": 3.0}, {"kernel_size": 61, "intensity": 0.5}
    else:
        gk, mk = {"kernel_size": 25, "kernel_std": 2.0}, {"kernel_size": 25, "intensity": 0.5}
    specs = [
        TaskSpec("sr4", "sr_bicubic", {"factor": 4}),
        TaskSpec("inpaint_box", "inpaint_box", box),
        TaskSpec("inpaint_random", "inpaint_random", {"missing_fraction": 0.7}),
        TaskSpec("deblur_gaussian", "deblur_gaussian", {**gk, **blur}),
        TaskSpec("deblur_motion", "deblur_motion", {**mk, **blur}),
        TaskSpec("denoise", "denoise", {}),
    ]
    return {s.name: s for s in specs}


DEFAULT_TASKS = ("sr4", "inpaint_box", "inpaint_random", "deblur_gaussian", "deblur_motion")


@dataclass
class BenchSpec:
    """Everything a benchmark run needs (built from the command line by :func:`spec_from_args`)."""

    protocol: str = "local"
    out: Path = Path("runs/bench/local")
    prior: str | None = None
    images: str | None = None
    image_names: tuple[str, ...] = ()
    num_images: int | None = None
    size: int = 64
    zoom: int = 2
    tasks: tuple[str, ...] = DEFAULT_TASKS
    methods: tuple[str, ...] = DEFAULT_METHODS
    budgets: tuple[int, ...] = ()
    preset: str = "fast"
    samples: int = 1
    sigma_y: float = 0.025
    seed: int = 0
    boundary: str = "circular"
    device: str = "cpu"
    precision: str = "auto"
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    plots: bool = True
    save_images: bool = True
    label: str = ""
    oracle_alpha: float = 2.0
    oracle_pixel_std: float = 0.5

    def fingerprint(self) -> dict[str, Any]:
        """The settings that change a row's numbers (an existing OUT must agree on them)."""
        return {"protocol": self.protocol, "size": self.size, "zoom": self.zoom, "preset": self.preset,
                "samples": self.samples, "sigma_y": self.sigma_y, "seed": self.seed, "boundary": self.boundary,
                "overrides": self.overrides, "format": FORMAT_VERSION}


# =============================================================================== images

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
    elif spec.protocol == "paper":
        raise ValueError("the paper protocol needs --images DIR (e.g. FFHQ 256 validation images)")
    else:
        from .priors.training_data import HELDOUT_IMAGES, load_skimage_image

        names = spec.image_names or HELDOUT_IMAGES
        imgs = [(n, _center_crop_zoom(load_skimage_image(n), spec.size, spec.zoom)) for n in names]
    if spec.num_images:
        imgs = imgs[: spec.num_images]
    return imgs


# =============================================================================== measurements

def _operator_from_arrays(task: TaskSpec, size: int, arrays: dict[str, np.ndarray]):
    from .operators import BlurOperator, Denoising, Inpainting, build_operator

    if "kernel" in arrays:
        return BlurOperator(torch.from_numpy(arrays["kernel"]), task.params.get("boundary", "circular"))
    if "mask" in arrays:
        return Inpainting(torch.from_numpy(arrays["mask"]))
    if task.factory_task == "denoise":
        return Denoising()
    return build_operator(task.factory_task, size, 0, **task.params)


def measurement(spec: BenchSpec, task: TaskSpec, image: str, img: np.ndarray) -> tuple[Any, Tensor, Tensor, dict]:
    """(operator, x (1, C, H, W), y (1, C, h, w), meta): loaded from OUT/measurements if there,
    otherwise generated from the derived seeds and saved (npz + json)."""
    from .operators import build_operator

    folder = spec.out / "measurements" / task.name
    npz, js = folder / f"{image}.npz", folder / f"{image}.json"
    meta = {"task": task.name, "factory_task": task.factory_task, "params": task.params, "image": image,
            "size": spec.size, "zoom": spec.zoom, "sigma_y": spec.sigma_y, "protocol": spec.protocol,
            "operator_seed": stable_seed(spec.seed, "operator", task.name, image),
            "noise_seed": stable_seed(spec.seed, "noise", task.name, image),
            "sampler_seed": stable_seed(spec.seed, "sampler", task.name, image)}
    if npz.is_file() and js.is_file():
        saved = json.loads(js.read_text())
        if {k: saved.get(k) for k in meta} != json.loads(json.dumps(meta)):
            diff = sorted(k for k in meta if saved.get(k) != json.loads(json.dumps(meta))[k])
            raise ValueError(f"{js}: saved measurement differs from this run's specification in {diff}; "
                             f"use another --out (or delete {folder})")
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
        op = _operator_from_arrays(task, spec.size, arrays)
        return op, torch.from_numpy(arrays["x"])[None], torch.from_numpy(arrays["y"])[None], saved
    op = build_operator(task.factory_task, spec.size, meta["operator_seed"], **task.params)
    x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(img, -1, 0)))[None].float()
    y = op.measure(x, spec.sigma_y, torch.Generator().manual_seed(meta["noise_seed"]))
    arrays = {"x": x[0].numpy(), "y": y[0].numpy()}
    if getattr(op, "kernel", None) is not None:
        arrays["kernel"] = op.kernel.numpy()
    if getattr(op, "mask", None) is not None:
        arrays["mask"] = op.mask[0, 0].numpy()
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    _atomic_write_bytes(npz, buf.getvalue())
    _atomic_write_text(js, json.dumps(meta, indent=1, sort_keys=True))
    if spec.save_images:
        _save_png(spec.out / "images" / task.name / image / "gt.png", x[0])
        _save_png(spec.out / "images" / task.name / image / "measurement.png", _measurement_view(op, y)[0])
    return op, x, y, meta


def _measurement_view(op, y: Tensor) -> Tensor:
    """y shown at the image size (nearest upsampling for SR)."""
    f = getattr(op, "factor", None)
    if f:
        return y.repeat_interleave(f, -2).repeat_interleave(f, -1).clamp(0, 1)
    return y.clamp(0, 1)


# =============================================================================== methods

@dataclass(frozen=True)
class MethodRun:
    """One column of the grid: a method (at a preset other than the run's, when ``preset`` is
    set: ``--methods nfc:deterministic``) at a budget (None = classical)."""

    method: str
    budget: int | None
    config: Any = None
    preset: str | None = None

    @property
    def label(self) -> str:
        """The ``method`` column of the results: ``nfc`` or ``nfc:deterministic``."""
        return self.method if self.preset is None else f"{self.method}:{self.preset}"


def _nested(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'band.blend_start': 0.2, 'inner': 'exact'} -> {'band': {'blend_start': 0.2}, 'inner': 'exact'}."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            out.setdefault(head, {})
            if not isinstance(out[head], dict):
                raise ValueError(f"config key {head!r} set both as a value and as {key!r}")
            out[head].update(_nested({rest: value}))
        else:
            out[key] = value
    return out


def method_config(method: str, preset: str, budget: int | None, overrides: dict[str, Any] | None = None) -> Any:
    """The sampler config of ``method`` at ``preset`` with NFE ``budget``.

    NFC/DAPS: ode_steps = the largest divisor of the budget not above the preset's ode_steps,
    num_levels = budget / ode_steps (so NFE = budget exactly: 20 -> 4 x 5, 2 -> 1 x 2).
    Peers: num_steps = budget. ``budget=None`` keeps the preset.
    """
    from .samplers import get_config

    cfg = get_config(method, preset, **_nested(overrides or {}))
    if budget is None:
        return cfg
    if budget < 1:
        raise ValueError(f"NFE budgets must be >= 1, got {budget}")
    if hasattr(cfg, "ode_steps"):
        steps = max(d for d in range(1, min(cfg.ode_steps, budget) + 1) if budget % d == 0)
        return dataclasses.replace(cfg, ode_steps=steps, num_levels=budget // steps)
    return dataclasses.replace(cfg, num_steps=budget)


def method_runs(spec: BenchSpec) -> list[MethodRun]:
    runs = []
    for entry in spec.methods:
        m, _, preset = entry.partition(":")
        if m in CLASSICAL_METHODS and not preset:
            runs.append(MethodRun(m, None))
        elif m in DIFFUSION_METHODS:
            overrides = {**spec.overrides.get(m, {}), **(spec.overrides.get(entry, {}) if preset else {})}
            for b in spec.budgets or (None,):
                cfg = method_config(m, preset or spec.preset, b, overrides)
                runs.append(MethodRun(m, int(cfg.nfe), cfg, preset or None))
        else:
            raise ValueError(f"unknown method {entry!r}; choose from {', '.join(DEFAULT_METHODS)} "
                             f"(a diffusion method may name its preset: nfc:deterministic)")
    return runs


def not_applicable(run: MethodRun, op) -> str | None:
    from .baselines import applicable

    if run.method in CLASSICAL_METHODS:
        return applicable(run.method, op)
    if run.method == "ddrm" and not (getattr(op, "is_circulant", False) or getattr(op, "mask", None) is not None):
        return f"DDRM needs a diagonalisable operator (circulant blur, inpainting, denoising); {type(op).__name__}" \
               f"{' (' + op.boundary + ' boundary)' if hasattr(op, 'boundary') else ''} is not"
    return None


def _estimators(run: MethodRun, samples: int) -> list[str]:
    if run.method in CLASSICAL_METHODS or getattr(run.config, "is_deterministic", False):
        return ["deterministic"]
    return ["sample"] + ([f"mean{samples}"] if samples > 1 else [])


def _budget_str(run: MethodRun) -> str:
    return "0" if run.budget is None else str(run.budget)


# =============================================================================== results files

def load_results(path: Path) -> list[dict[str, str]]:
    """Rows of a results CSV (missing file: [])."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def _key(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(str(row[k]) for k in KEY)


def _csv_text(rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in COLUMNS})
    return buf.getvalue()


class PartWriter:
    """Appends rows to OUT/parts/rank{r}.csv, flushed row by row (an interrupted run keeps them)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.is_file() or self.path.stat().st_size == 0
        self._f = open(self.path, "a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        if new:
            self._w.writeheader()
            self._f.flush()

    def write(self, row: dict[str, str]) -> None:
        self._w.writerow({c: row.get(c, "") for c in COLUMNS})
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _all_rows(out: Path) -> list[dict[str, str]]:
    rows = load_results(out / "results.csv")
    for part in sorted((out / "parts").glob("rank*.csv")) if (out / "parts").is_dir() else []:
        rows += load_results(part)
    return rows


def _order(spec: BenchSpec, image_names: Sequence[str]) -> Callable[[dict[str, str]], tuple]:
    tasks = {t: i for i, t in enumerate(spec.tasks)}
    images = {n: i for i, n in enumerate(image_names)}
    methods = {m: i for i, m in enumerate(spec.methods)}

    def est_rank(e: str) -> tuple[int, str]:
        return (0, e) if e in ("sample", "deterministic") else (1, e)

    def key(r: dict[str, str]) -> tuple:
        return (tasks.get(r["task"], len(tasks)), r["task"], images.get(r["image"], len(images)), r["image"],
                methods.get(r["method"], len(methods)), r["method"], est_rank(r["estimator"]), int(r["budget"] or 0))

    return key


def merge_results(spec: BenchSpec, image_names: Sequence[str]) -> list[dict[str, str]]:
    """results.csv + part files -> one deduplicated, canonically ordered results.csv; parts removed."""
    seen: dict[tuple, dict[str, str]] = {}
    for r in _all_rows(spec.out):
        seen.setdefault(_key(r), r)
    rows = sorted(seen.values(), key=_order(spec, image_names))
    _atomic_write_text(spec.out / "results.csv", _csv_text(rows))
    parts = spec.out / "parts"
    if parts.is_dir():
        for p in parts.glob("rank*.csv"):
            p.unlink()
        with contextlib.suppress(OSError):
            parts.rmdir()
    return rows


# =============================================================================== running one job

def _prior_fingerprint(path: str | None) -> dict[str, Any]:
    from .priors.default import default_prior_path

    folder = Path(path) if path else default_prior_path()
    info: dict[str, Any] = {"path": str(folder), "embedded_default": path is None}
    h = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    for p in files:
        if p.suffix in (".safetensors", ".bin", ".json"):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    if files:
        info["sha256"] = h.hexdigest()[:16]
        info["modified"] = datetime.datetime.fromtimestamp(max(p.stat().st_mtime for p in files)).isoformat(timespec="seconds")
    return info


def _load_prior(spec: BenchSpec, device: torch.device):
    from .priors.default import load_prior

    try:
        return load_prior(spec.prior, device=device, precision=spec.precision)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}\nPass --prior DIR (e.g. runs/prior/export, the training job's export).") from e


def _row(spec: BenchSpec, task: str, image: str, run: MethodRun, estimator: str, **vals: Any) -> dict[str, str]:
    return {"protocol": spec.protocol, "task": task, "image": image, "method": run.label, "estimator": estimator,
            "budget": _budget_str(run), "nfe": str(vals.get("nfe", 0)), "psnr": _fmt(vals.get("psnr"), ".4f"),
            "ssim": _fmt(vals.get("ssim"), ".5f"), "mse": _fmt(vals.get("mse"), ".6e"),
            "lpips": _fmt(vals.get("lpips"), ".4f"), "seconds": _fmt(vals.get("seconds"), ".3f"),
            "peak_mem_mb": _fmt(vals.get("peak_mem_mb"), ".1f"), "seed": str(vals.get("seed", "")),
            "note": str(vals.get("note", ""))}


def _metrics(x: Tensor, ref: Tensor, clip: bool = True) -> dict[str, float]:
    from .metrics import mse, psnr, ssim

    x = x.detach().cpu().double()
    ref = ref.detach().cpu().double()
    if clip:
        x = x.clamp(0, 1)
    out = {"psnr": float(psnr(x, ref)[0]), "mse": float(mse(x, ref)[0])}
    out["ssim"] = float(ssim(x, ref)[0]) if min(x.shape[-2:]) >= 7 else None
    out["lpips"] = _lpips(x.float(), ref.float())
    return out


def run_job(spec: BenchSpec, task: TaskSpec, image: str, img: np.ndarray, runs: list[MethodRun], prior, device,
            done: set[tuple], writer: PartWriter, notes: list[str], log: Callable[[str], None]) -> None:
    """All methods of one (task, image): measurement once, then every missing row."""
    from .api import restore
    from .baselines import restore_classical

    op, x, y, meta = measurement(spec, task, image, img)
    seed = meta["sampler_seed"]
    dev_op = None
    for run in runs:
        ests = _estimators(run, spec.samples)
        keys = [(task.name, image, run.label, e, _budget_str(run)) for e in ests]
        if all(k in done for k in keys):
            continue
        reason = not_applicable(run, op)
        if reason is not None:
            notes.append(f"{task.name} / {run.label}: skipped, {reason}")
            continue
        label = f"{task.name}/{image}/{run.label}" + ("" if run.budget is None else f"@{run.budget}")
        try:
            if run.method in CLASSICAL_METHODS:
                with PeakMemory(torch.device("cpu")) as mem:
                    t0 = time.perf_counter()
                    xr = restore_classical(run.method, op, y, spec.sigma_y)
                    secs = time.perf_counter() - t0
                outs = {"deterministic": (xr, 0)}
            else:
                if dev_op is None:
                    dev_op = op if device.type == "cpu" else copy.deepcopy(op).to(device)
                with PeakMemory(device) as mem:
                    t0 = time.perf_counter()
                    res = restore(y.to(device), dev_op, prior=prior, method=run.method, config=run.config,
                                  sigma_y=spec.sigma_y, seed=seed, progress=False,
                                  num_samples=1 if ests == ["deterministic"] else spec.samples)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    secs = time.perf_counter() - t0
                if ests == ["deterministic"]:
                    outs = {"deterministic": (res.image, res.nfe)}
                elif spec.samples > 1:
                    outs = {"sample": (res.samples[0], res.nfe), f"mean{spec.samples}": (res.image, res.nfe)}
                else:
                    outs = {"sample": (res.image, res.nfe)}
            for est, (xr, nfe) in outs.items():
                if (task.name, image, run.label, est, _budget_str(run)) in done:
                    continue
                met = _metrics(xr, x)
                writer.write(_row(spec, task.name, image, run, est, nfe=nfe, seconds=secs, peak_mem_mb=mem.mb,
                                  seed=seed if run.method not in CLASSICAL_METHODS else "", **met))
                if spec.save_images:
                    _save_png(spec.out / "images" / task.name / image / f"{run.label.replace(':', '-')}-{est}-{_budget_str(run)}.png",
                              xr[0].detach().cpu().clamp(0, 1))
                log(f"{label} [{est}] psnr {met['psnr']:.2f} ssim {met['ssim'] if met['ssim'] is not None else float('nan'):.3f} "
                    f"{secs:.1f}s")
        except Exception as e:  # noqa: BLE001 - a failing method is a row with a note, not a crashed benchmark
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            for est in ests:
                writer.write(_row(spec, task.name, image, run, est, nfe=getattr(run.config, "nfe", 0), note=msg))
            log(f"{label}: FAILED {msg}")


# =============================================================================== distributed

@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    initialised: bool = False

    def barrier(self) -> None:
        if self.initialised:
            import torch.distributed as dist

            dist.barrier()


def init_distributed(device: str) -> Dist:
    """Read RANK / WORLD_SIZE / LOCAL_RANK (torchrun); init gloo (CPU) or NCCL (CUDA) if WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    d = Dist(rank, world, local)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if device.startswith("cuda") else "gloo"
            kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(hours=48)}
            if backend == "nccl":
                torch.cuda.set_device(local)
                kwargs["device_id"] = torch.device("cuda", local)
            try:
                dist.init_process_group(**kwargs)
            except TypeError:  # older torch without device_id
                kwargs.pop("device_id", None)
                dist.init_process_group(**kwargs)
        d.initialised = True
    return d


def _resolve_device(name: str, d: Dist) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but CUDA is not available")
        return torch.device("cuda", d.local_rank % max(1, torch.cuda.device_count()))
    return torch.device(name)


# =============================================================================== summary

def _mean_std(vals: list[float]) -> tuple[float, float]:
    a = np.asarray(vals, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def _group(rows: list[dict[str, str]]) -> dict[tuple[str, str, str, str], list[dict[str, str]]]:
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["method"], r["estimator"], r["budget"]), []).append(r)
    return groups


def _num(rows: list[dict[str, str]], col: str) -> list[float]:
    return [float(r[col]) for r in rows if r.get(col, "") not in ("", None)]


def _label(method: str, est: str, budget: str) -> str:
    lab = method if est in ("sample", "deterministic") else f"{method} ({est.replace('mean', 'mean of ')})"
    return lab if budget in ("0", "") else f"{lab} @{budget}"


def summary_markdown(spec: BenchSpec, rows: list[dict[str, str]], header: dict[str, Any], notes: Sequence[str],
                     plots: Sequence[str]) -> str:
    """summary.md: settings, PSNR and SSIM tables (mean +- std over images), PSNR vs NFE,
    timing and memory, notes."""
    groups = _group(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    order = _order(spec, [])
    cols = sorted({(g[1], g[2], g[3]) for g in groups},
                  key=lambda k: order({"task": "", "image": "", "method": k[0], "estimator": k[1], "budget": k[2]}))
    L = [f"# Benchmark summary ({spec.protocol} protocol)", ""]
    for k, v in header.items():
        L.append(f"- **{k}**: {v}")
    L += ["", "Values: mean ± std over images (std with ddof=1). PSNR in dB and SSIM (scikit-image "
          "conventions) on outputs clipped to [0, 1], data_range 1. A posterior *sample*'s expected squared "
          "error is twice the posterior mean's, so compare single samples with `mean of K` rows and with the "
          "classical (deterministic) baselines accordingly. `@N` = NFE budget; classical rows use no network. "
          "Peak memory: on CPU the growth of the process's resident memory during the call (memory already held "
          "from earlier calls is not counted, so small runs often show ~0); on CUDA the allocator's peak above "
          "its level at entry.", ""]

    for metric, fmt in (("psnr", ".2f"), ("ssim", ".3f")):
        L += [f"## {metric.upper()} (mean ± std)", "", "| method | " + " | ".join(tasks) + " |",
              "|---|" + "---|" * len(tasks)]
        for m, e, b in cols:
            cells = []
            for t in tasks:
                vals = _num(groups.get((t, m, e, b), []), metric)
                cells.append(f"{_mean_std(vals)[0]:{fmt}} ± {_mean_std(vals)[1]:{fmt}}" if vals else "–")
            L.append(f"| {_label(m, e, b)} | " + " | ".join(cells) + " |")
        L.append("")
    if any(r.get("lpips") for r in rows):
        L += ["## LPIPS (mean)", "", "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for m, e, b in cols:
            cells = [f"{np.mean(v):.3f}" if (v := _num(groups.get((t, m, e, b), []), "lpips")) else "–" for t in tasks]
            L.append(f"| {_label(m, e, b)} | " + " | ".join(cells) + " |")
        L.append("")

    budgets = sorted({int(b) for (_, _, _, b) in groups if b not in ("0", "")})
    if len(budgets) > 1:
        L += ["## PSNR vs NFE (mean over images)", ""]
        for t in tasks:
            L += [f"**{t}**", "", "| method | " + " | ".join(str(b) for b in budgets) + " |",
                  "|---|" + "---|" * len(budgets)]
            for m, e in dict.fromkeys((m, e) for (m, e, b) in cols if b != "0"):
                cells = [f"{np.mean(v):.2f}" if (v := _num(groups.get((t, m, e, str(b)), []), "psnr")) else "–"
                         for b in budgets]
                if any(c != "–" for c in cells):
                    L.append(f"| {_label(m, e, '0')} | " + " | ".join(cells) + " |")
            classical = [(m, e) for (m, e, b) in cols if b == "0"]
            for m, e in classical:
                v = _num(groups.get((t, m, e, "0"), []), "psnr")
                if v:
                    L.append(f"| {m} (no network) | " + " | ".join(f"{np.mean(v):.2f}" for _ in budgets) + " |")
            L.append("")

    L += ["## Time and memory per image (mean over images and tasks)", "",
          "| method | NFE | seconds | s / NFE | peak memory MB |", "|---|---|---|---|---|"]
    for m, e, b in cols:
        rs = [r for t in tasks for r in groups.get((t, m, e, b), [])]
        secs, mem, nfe = _num(rs, "seconds"), _num(rs, "peak_mem_mb"), _num(rs, "nfe")
        if not secs:
            continue
        n = np.mean(nfe) if nfe else 0
        per = f"{np.mean(secs) / n:.3f}" if n else "–"
        L.append(f"| {_label(m, e, b)} | {n:.0f} | {np.mean(secs):.2f} | {per} | "
                 f"{f'{np.mean(mem):.0f}' if mem else '–'} |")
    L.append("")
    failed = [r for r in rows if r.get("note")]
    if notes or failed:
        L += ["## Notes", ""]
        L += [f"- {n}" for n in dict.fromkeys(notes)]
        L += [f"- FAILED {r['task']}/{r['image']}/{r['method']}@{r['budget']}: {r['note']}" for r in failed]
        L.append("")
    if plots:
        L += ["## Figures", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(L)


def make_plots(spec: BenchSpec, rows: list[dict[str, str]], image_names: Sequence[str],
               log: Callable[[str], None]) -> list[str]:
    """grid.png (PIL only) and, with matplotlib, psnr_vs_nfe.png and bars.png. Returns file names."""
    made = []
    if spec.save_images:
        with contextlib.suppress(Exception):
            if _visual_grid(spec, rows, image_names):
                made.append("grid.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: skipping psnr_vs_nfe.png and bars.png (pip install 'nfc_dps[bench]'); "
            "results.csv, summary.md and grid.png are written")
        return made
    groups = _group(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not tasks:
        return made
    budgets = sorted({int(b) for (_, _, _, b) in groups if b not in ("0", "")})
    n = len(tasks)
    if len(budgets) > 1:
        fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.4), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            for m in dict.fromkeys(k[1] for k in groups if k[0] == t):
                for est in dict.fromkeys(k[2] for k in groups if k[0] == t and k[1] == m):
                    pts = [(int(b), np.mean(_num(groups[(t, m, est, b)], "psnr")))
                           for (tt, mm, ee, b) in groups if (tt, mm, ee) == (t, m, est) and b != "0"
                           and _num(groups[(t, m, est, b)], "psnr")]
                    lab = m if est == "sample" else f"{m} ({est})"
                    if pts:
                        pts.sort()
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
                    elif (t, m, est, "0") in groups and _num(groups[(t, m, est, "0")], "psnr"):
                        ax.axhline(np.mean(_num(groups[(t, m, est, "0")], "psnr")), ls="--", lw=1, label=lab,
                                   color="gray" if m == "tv" else None)
            ax.set_xscale("log")
            ax.set_title(t)
            ax.set_xlabel("NFE")
            ax.set_ylabel("PSNR (dB)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="best")
        fig.tight_layout()
        _save_fig(fig, spec.out / "psnr_vs_nfe.png")
        plt.close(fig)
        made.append("psnr_vs_nfe.png")
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.6), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        best: dict[str, tuple[int, float, float]] = {}
        for (tt, m, est, b), rs in groups.items():
            v = _num(rs, "psnr")
            if tt != t or not v:
                continue
            lab = m if est in ("sample", "deterministic") else f"{m} {est}"
            if lab not in best or int(b) > best[lab][0]:
                best[lab] = (int(b), *_mean_std(v))
        labs = list(best)
        ax.bar(range(len(labs)), [best[k][1] for k in labs], yerr=[best[k][2] for k in labs], capsize=2)
        ax.set_xticks(range(len(labs)))
        ax.set_xticklabels(labs, rotation=60, ha="right", fontsize=7)
        lo = min(best[k][1] - best[k][2] for k in labs) if labs else 0
        ax.set_ylim(max(0, lo - 2), None)
        ax.set_title(f"{t} (largest budget)")
        ax.set_ylabel("PSNR (dB)")
    fig.tight_layout()
    _save_fig(fig, spec.out / "bars.png")
    plt.close(fig)
    made.append("bars.png")
    return made


def _save_fig(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _atomic_write_bytes(path, buf.getvalue())


def _visual_grid(spec: BenchSpec, rows: list[dict[str, str]], image_names: Sequence[str]) -> bool:
    """grid.png: for the first image, one row per task: ground truth, measurement, every method
    (largest budget, single sample), labelled. PIL only."""
    from PIL import Image, ImageDraw

    if not rows:
        return False
    image = next((n for n in image_names if any(r["image"] == n for r in rows)), rows[0]["image"])
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cols: dict[str, str] = {}
    for r in rows:
        if r["image"] != image or r["estimator"] not in ("sample", "deterministic") or r.get("note"):
            continue
        prev = cols.get(r["method"])
        if prev is None or int(r["budget"]) > int(prev):
            cols[r["method"]] = r["budget"]
    order = {m: i for i, m in enumerate(spec.methods)}
    methods = sorted(cols, key=lambda m: order.get(m, len(order)))
    heads = ["ground truth", "measurement"] + [m + ("" if cols[m] == "0" else f" @{cols[m]}") for m in methods]
    scale = max(1, 128 // spec.size)
    tile, pad, top, left = spec.size * scale, 4, 16, 110
    W = left + len(heads) * (tile + pad)
    H = top + len(tasks) * (tile + pad)
    canvas = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(canvas)
    for j, h in enumerate(heads):
        draw.text((left + j * (tile + pad), 2), h[: max(6, tile // 6)], fill="black")
    for i, t in enumerate(tasks):
        draw.text((2, top + i * (tile + pad) + tile // 2), t, fill="black")
        folder = spec.out / "images" / t / image
        files = ["gt.png", "measurement.png"] + [f"{m}-{'deterministic' if cols[m] == '0' else 'sample'}-{cols[m]}.png"
                                                for m in methods]
        for j, fn in enumerate(files):
            p = folder / fn
            if p.is_file():
                im = Image.open(p).convert("RGB").resize((tile, tile), Image.NEAREST)
                canvas.paste(im, (left + j * (tile + pad), top + i * (tile + pad)))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    _atomic_write_bytes(spec.out / "grid.png", buf.getvalue())
    return True


# =============================================================================== main grid

def run(spec: BenchSpec, log: Callable[[str], None] = print) -> list[dict[str, str]]:
    """Run (or resume) the grid; returns the merged rows on rank 0 (others: [])."""
    t_start = time.perf_counter()
    d = init_distributed(spec.device)
    device = _resolve_device(spec.device, d)
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.json"
    _check_fingerprint(spec, cfg_path)  # every rank: an error on one rank only would leave the others waiting
    d.barrier()
    if d.rank == 0 and not cfg_path.is_file():
        _atomic_write_text(cfg_path, json.dumps({"fingerprint": spec.fingerprint(), "spec": _spec_json(spec)},
                                                indent=1, default=str))
    all_tasks = task_specs(spec.protocol, spec.size, spec.boundary)
    unknown = [t for t in spec.tasks if t not in all_tasks]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(all_tasks)}")
    images = load_images(spec)
    names = [n for n, _ in images]
    runs = method_runs(spec)
    done = {_key(r) for r in _all_rows(out)}
    jobs = [(t, n) for t in spec.tasks for n in names]
    mine = jobs[d.rank::d.world]
    needs_prior = any(r.method in DIFFUSION_METHODS for r in runs)
    prior = None
    notes: list[str] = []
    prefix = f"[rank {d.rank}] " if d.world > 1 else ""
    writer = PartWriter(out / "parts" / f"rank{d.rank}.csv")
    imgs = dict(images)
    try:
        for t, n in mine:
            todo = [r for r in runs for e in _estimators(r, spec.samples)
                    if (t, n, r.label, e, _budget_str(r)) not in done]
            if not todo:
                continue
            if needs_prior and prior is None:
                prior = _load_prior(spec, device)
                with torch.no_grad():  # warm-up call, so that the first timed method pays no set-up cost
                    prior.denoise(torch.zeros(1, prior.channels, spec.size, spec.size, device=device),
                                  torch.ones(1, device=device))
            run_job(spec, all_tasks[t], n, imgs[n], runs, prior, device, done, writer, notes,
                    lambda s: log(prefix + s))
    finally:
        writer.close()
    # applicability notes are cheap to recompute for the summary (jobs of every rank)
    if d.rank == 0:
        from .operators import build_operator

        for t in spec.tasks:
            ts = all_tasks[t]
            op = build_operator(ts.factory_task, spec.size, 0, **ts.params)
            for r in runs:
                why = not_applicable(r, op)
                if why:
                    notes.append(f"{t} / {r.label}: skipped, {why}")
    d.barrier()
    rows: list[dict[str, str]] = []
    if d.rank == 0:
        rows = merge_results(spec, names)
        header = _header(spec, d, device, time.perf_counter() - t_start, names)
        _atomic_write_text(cfg_path, json.dumps({"fingerprint": spec.fingerprint(), "spec": _spec_json(spec),
                                                 "header": header}, indent=1, default=str))
        plots = make_plots(spec, rows, names, log) if spec.plots else []
        _atomic_write_text(out / "summary.md", summary_markdown(spec, rows, header, notes, plots))
        log(f"wrote {out / 'results.csv'} ({len(rows)} rows) and {out / 'summary.md'}")
    d.barrier()
    if d.initialised:
        import torch.distributed as dist

        dist.destroy_process_group()
    return rows


def _check_fingerprint(spec: BenchSpec, cfg_path: Path) -> None:
    """Refuse to mix rows of another configuration into an existing output folder."""
    if not cfg_path.is_file():
        return
    old = json.loads(cfg_path.read_text()).get("fingerprint")
    new = json.loads(json.dumps(spec.fingerprint()))
    if old is not None and old != new:
        diff = sorted(k for k in new if old.get(k) != new[k])
        raise ValueError(f"{spec.out} holds results of another configuration ({cfg_path}: "
                         f"{ {k: old.get(k) for k in diff} } != { {k: new[k] for k in diff} }); use another --out")


def _spec_json(spec: BenchSpec) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(spec).items()}


def _header(spec: BenchSpec, d: Dist, device: torch.device, seconds: float, names: Sequence[str]) -> dict[str, Any]:
    mach = machine_description()
    h: dict[str, Any] = {}
    if spec.label:
        h["label"] = spec.label
    if spec.protocol != "oracle":
        from .priors.diffusers_prior import resolve_precision

        h["prior"] = _prior_fingerprint(spec.prior)
        h["network precision"] = resolve_precision(spec.precision, device)
    h.update({
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "images": f"{len(names)} ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}), {spec.size}x{spec.size}"
                  + (f", centre crop {spec.size * spec.zoom} px area-averaged by {spec.zoom}"
                     if spec.protocol == "local" and not spec.images and spec.zoom > 1 else ""),
        "sigma_y": f"{spec.sigma_y} in [0, 1] units (= {2 * spec.sigma_y:g} in [-1, 1])",
        "preset / budgets": f"{spec.preset} / {', '.join(map(str, spec.budgets)) or 'preset NFE'}",
        "samples per image": spec.samples,
        "seed": spec.seed,
        "blur boundary": spec.boundary,
        "machine": f"{mach.get('cpu', platform.processor())}, nproc {mach['nproc']}, RAM {mach.get('ram_gib', '?')} GiB"
                   + (f", GPU {mach['gpu']}" if "gpu" in mach else ""),
        "device / processes": f"{device} / {d.world}",
        "torch": mach["torch"],
        "wall time of this invocation": f"{seconds / 60:.1f} min",
        "LPIPS": lpips_status()[1],
    })
    if spec.overrides:
        h["overrides"] = spec.overrides
    return h


# =============================================================================== oracle protocol

def oracle_configs(budget: int) -> list[tuple[str, str, Any]]:
    """(label, method, config) of the oracle table at NFE ``budget``: NFC/DAPS with the exact
    inner step, one-step predictor to sigma 1e-5, a posterior *sample* at the last level
    (final_step="sample"), isotropic vs spectral covariance (S from the measurement or the
    prior's true S); NFC with the default final mean step; the peers at their fast presets."""
    from .samplers import get_config

    base = dataclasses.replace(get_config("nfc", "fast"), num_levels=budget, ode_steps=1, ode_sigma_min=1e-5,
                               inner="exact", final_step="sample")
    out = []
    for tag, cov, src in (("iso", "isotropic", "measurement"), ("spec-y", "spectral", "measurement"),
                          ("spec-S", "spectral", "prior")):
        c = dataclasses.replace(base, prior_covariance=cov, spectrum=src)
        out.append((f"daps-{tag}", "daps", c.as_daps()))
        out.append((f"nfc-{tag}", "nfc", c))
    # the toolkit's default last step returns the conditional mean at sigma_min (not a sample)
    out.append(("nfc-spec-y-final-mean", "nfc", dataclasses.replace(base, prior_covariance="spectral",
                                                                    spectrum="measurement", final_step="mean")))
    for m in ("dps", "diffpir", "ddnm", "ddrm"):
        out.append((m, m, dataclasses.replace(get_config(m, "fast"), num_steps=budget)))
    return out


def run_oracle(spec: BenchSpec, log: Callable[[str], None] = print) -> list[dict[str, str]]:
    """Gaussian-oracle table: GaussianSpectralPrior images (gray, alpha 2, pixel std 0.5 model
    units by default: --oracle-alpha, --oracle-pixel-std), circulant Gaussian blur std 1.5 px, sigma_y = 0.05 model units (spec.sigma_y in
    [0, 1] units); each method's PSNR against the exact MMSE and exact-posterior-sample bounds.
    PSNR here is on the *unclipped* estimates (the Gaussian's images leave [0, 1]; the bounds are
    for unclipped estimators). Single process (rank 0 works, the others wait)."""
    from .baselines import tv_restore, wiener
    from .metrics import mse, psnr, ssim
    from .operators import BlurOperator, gaussian_kernel
    from .priors import GaussianSpectralPrior
    from .samplers import counting, get_method
    from .api import image_generators

    t_start = time.perf_counter()
    d = init_distributed(spec.device)
    device = _resolve_device(spec.device, d)
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, str]] = []
    if d.rank == 0:
        n = spec.num_images or 30
        size = spec.size
        prior = GaussianSpectralPrior((size, size), alpha=spec.oracle_alpha, channels=1,
                                      pixel_std=spec.oracle_pixel_std).to(device)
        x_m = prior.sample(n, torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-images")),
                           dtype=torch.float64, device=device)
        x = (x_m + 1) / 2
        std = 1.5
        op = BlurOperator(gaussian_kernel(2 * math.ceil(4 * std) + 1, std), "circular").to(device)
        y = op.measure(x, spec.sigma_y, torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-noise")))
        sig_m = 2 * spec.sigma_y
        H = op.transfer_function(size, size, dtype=torch.float64, device=device)
        mmse_m = prior.mmse(H, sig_m)
        bound_mmse = -10 * math.log10(mmse_m / 4)
        bound_sample = -10 * math.log10(2 * mmse_m / 4)
        names = [f"g{i:02d}" for i in range(n)]
        seeds = [stable_seed(spec.seed, "oracle-sampler", nm) for nm in names]
        task = f"gauss_blur{std:g}"
        done = {_key(r) for r in _all_rows(out)}
        writer = PartWriter(out / "parts" / "rank0.csv")

        def emit(label: str, est: str, budget: str, xr: Tensor, secs: float, nfe: int, note: str = "") -> None:
            xr = xr.detach().double()
            p, e = psnr(xr, x.double()), mse(xr, x.double())
            s = ssim(xr, x.double())
            for i, nm in enumerate(names):
                writer.write({"protocol": "oracle", "task": task, "image": nm, "method": label, "estimator": est,
                              "budget": budget, "nfe": str(nfe), "psnr": _fmt(float(p[i]), ".4f"),
                              "ssim": _fmt(float(s[i]), ".5f"), "mse": _fmt(float(e[i]), ".6e"), "lpips": "",
                              "seconds": _fmt(secs / n, ".4f"), "peak_mem_mb": "", "seed": str(seeds[i]), "note": note})
            log(f"oracle {label} @{budget} [{est}]: PSNR(mean MSE) {-10 * math.log10(float(e.mean())):.2f} dB "
                f"(sample bound {bound_sample:.2f}, MMSE bound {bound_mmse:.2f}) {secs:.1f}s")

        try:
            y_m = 2 * y - 1
            if (task, names[0], "exact-mmse", "deterministic", "0") not in done:
                t0 = time.perf_counter()
                xm = (prior.posterior_mean(y_m, H, sig_m) + 1) / 2
                emit("exact-mmse", "deterministic", "0", xm, time.perf_counter() - t0, 0)
            if (task, names[0], "exact-sample", "sample", "0") not in done:
                t0 = time.perf_counter()
                g = torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-exact-sample"))
                xs = (prior.posterior_sample(y_m, H, sig_m, g) + 1) / 2
                emit("exact-sample", "sample", "0", xs, time.perf_counter() - t0, 0)
            for label, fn in (("wiener", wiener), ("tv", tv_restore)):
                if label in spec.methods and (task, names[0], label, "deterministic", "0") not in done:
                    t0 = time.perf_counter()
                    xr = fn(op.cpu(), y.cpu(), spec.sigma_y).to(device)
                    op.to(device)
                    emit(label, "deterministic", "0", xr, time.perf_counter() - t0, 0)
            for b in spec.budgets or (50, 200):
                for label, method, cfg in oracle_configs(b):
                    if method not in spec.methods:
                        continue
                    if (task, names[0], label, "sample", str(b)) in done:
                        continue
                    t0 = time.perf_counter()
                    try:
                        counted = counting(prior)
                        gens = image_generators(seeds, 1, device=device)
                        xr = get_method(method).sample(counted, op, y, spec.sigma_y, tuple(x.shape), cfg, gens, None)
                        if not torch.isfinite(xr).all():
                            raise FloatingPointError("NaN/Inf in the output")
                        emit(label, "sample", str(b), xr, time.perf_counter() - t0, counted.nfe)
                    except Exception as e:  # noqa: BLE001 - a failing config is a noted row
                        msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                        for i, nm in enumerate(names):
                            writer.write({"protocol": "oracle", "task": task, "image": nm, "method": label,
                                          "estimator": "sample", "budget": str(b), "nfe": str(cfg.nfe), "note": msg,
                                          "seed": str(seeds[i])})
                        log(f"oracle {label} @{b}: FAILED {msg}")
        finally:
            writer.close()
        oracle_spec = dataclasses.replace(spec, methods=tuple(dict.fromkeys(
            ["exact-mmse", "exact-sample", "wiener", "tv"] + [l for l, _, _ in oracle_configs(1)])))
        rows = merge_results(oracle_spec, names)
        header = {"label": spec.label} if spec.label else {}
        header.update({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "prior": f"GaussianSpectralPrior {size}x{size} gray, alpha {spec.oracle_alpha:g}, "
                                f"pixel std {spec.oracle_pixel_std:g} (model units)",
                       "images": n, "operator": f"circulant Gaussian blur std {std} px ({op.kernel.shape[-1]}x{op.kernel.shape[-1]})",
                       "sigma_y": f"{sig_m:g} model units ({spec.sigma_y} in [0, 1])",
                       "machine": machine_description().get("cpu", ""),
                       "wall time of this invocation": f"{(time.perf_counter() - t_start) / 60:.1f} min"})
        _atomic_write_text(out / "summary.md", oracle_markdown(rows, header, bound_mmse, bound_sample))
        _atomic_write_text(out / "config.json", json.dumps({"spec": _spec_json(spec), "header": header,
                                                            "bound_mmse_db": bound_mmse,
                                                            "bound_sample_db": bound_sample}, indent=1, default=str))
        log(f"wrote {out / 'results.csv'} and {out / 'summary.md'}")
    d.barrier()
    if d.initialised:
        import torch.distributed as dist

        dist.destroy_process_group()
    return rows


def oracle_markdown(rows: list[dict[str, str]], header: dict[str, Any], bound_mmse: float, bound_sample: float) -> str:
    L = ["# Gaussian-oracle table", ""] + [f"- **{k}**: {v}" for k, v in header.items()]
    L += ["", f"Exact bounds (closed form): posterior mean (MMSE) **{bound_mmse:.2f} dB**, exact posterior "
          f"sample (2 x MMSE) **{bound_sample:.2f} dB**. `PSNR(mean MSE)` = -10 log10 of the MSE averaged over "
          "images (comparable with the bounds); per-image PSNR mean ± std beside it. Unclipped estimates. "
          "A sampler is judged against the *sample* bound, a deterministic estimator against the MMSE bound.", "",
          "| method | NFE | PSNR(mean MSE) | per-image PSNR | to sample bound | to MMSE bound | s / image |",
          "|---|---|---|---|---|---|---|"]
    for (task, m, est, b), rs in _group(rows).items():
        mses = _num(rs, "mse")
        if not mses:
            L.append(f"| {m} | {b} | failed: {rs[0].get('note', '')[:80]} | | | | |")
            continue
        p = -10 * math.log10(float(np.mean(mses)))
        mu, sd = _mean_std(_num(rs, "psnr"))
        secs = _num(rs, "seconds")
        L.append(f"| {m} | {b} | {p:.2f} | {mu:.2f} ± {sd:.2f} | {p - bound_sample:+.2f} | {p - bound_mmse:+.2f} | "
                 f"{(np.mean(secs) if secs else float('nan')):.3f} |")
    return "\n".join(L) + "\n"


# =============================================================================== profile

@contextlib.contextmanager
def _phase_timers(device: torch.device, totals: dict[str, float]):
    """Wrap NFC's building blocks (module attributes of nfc_dps.samplers.nfc) with timers."""
    from .samplers import nfc as nfc_mod

    phases = {"predictor": "pf_ode_predict", "inner (exact)": "gaussian_conditional",
              "inner (langevin)": "langevin_refine", "band mask (FFT)": "band_weight", "haar fuse": "haar_fuse",
              "spectrum fit": "_spectrum", "re-noise": "randn_per_image"}
    saved = {}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    active = [0]  # nested phases (e.g. noise drawn inside the Langevin loop) count for the outer one

    def wrap(phase: str, fn: Callable) -> Callable:
        def timed(*a, **k):
            if active[0]:
                return fn(*a, **k)
            sync()
            active[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                sync()
                active[0] -= 1
                totals[phase] = totals.get(phase, 0.0) + time.perf_counter() - t0
        return timed

    try:
        for phase, attr in phases.items():
            saved[attr] = getattr(nfc_mod, attr)
            setattr(nfc_mod, attr, wrap(phase, saved[attr]))
        yield totals
    finally:
        for attr, fn in saved.items():
            setattr(nfc_mod, attr, fn)


def _timed_prior(inner, device: torch.device, totals: dict[str, float]):
    """A prior wrapper accumulating the wall time of its denoise calls (the network) in totals["network"]."""
    from .priors.base import Prior

    class TimedPrior(Prior):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.channels, self.sigma_min, self.sigma_max = inner.channels, inner.sigma_min, inner.sigma_max
            self.size_multiple = getattr(inner, "size_multiple", 1)

        def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = self.inner.denoise(x, sigma)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            totals["network"] = totals.get("network", 0.0) + time.perf_counter() - t0
            return out

    return TimedPrior()


def run_profile(spec: BenchSpec, log: Callable[[str], None] = print, reps: int = 5) -> dict[str, Any]:
    """Per-NFE cost of each diffusion method against the bare network forward (target <= 1.1x),
    with a phase breakdown for NFC/DAPS. Writes profile.md and profile.json (rank 0 only)."""
    d = init_distributed(spec.device)
    device = _resolve_device(spec.device, d)
    try:
        return _profile(spec, d, device, log, reps) if d.rank == 0 else {}
    finally:
        if d.initialised:
            import torch.distributed as dist

            dist.destroy_process_group()


def _profile(spec: BenchSpec, d: Dist, device: torch.device, log: Callable[[str], None], reps: int) -> dict[str, Any]:
    from .api import restore

    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    prior = _load_prior(spec, device)
    task = task_specs(spec.protocol, spec.size, spec.boundary)[spec.tasks[0]]
    images = load_images(spec)
    name, img = images[0]
    pspec = dataclasses.replace(spec, save_images=False)
    op, x, y, _ = measurement(pspec, task, name, img)
    op = op.to(device)
    y = y.to(device)
    xm = (2 * x - 1).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def forward_time(sigma: float) -> float:
        sv = torch.full((1,), sigma, device=device)
        noisy = xm + sigma * torch.randn_like(xm)
        sync()
        t0 = time.perf_counter()
        prior.denoise(noisy, sv)
        sync()
        return time.perf_counter() - t0

    with torch.no_grad():
        for _ in range(2):
            forward_time(1.0)
        bare = float(np.median([forward_time(1.0) for _ in range(reps)]))
        # a tiled prior's cost depends on sigma (its tile grid shifts with sigma): average a sweep
        sweep = float(np.mean([forward_time(float(s)) for s in np.geomspace(0.01, 80.0, 2 * reps)]))
    log(f"bare network forward ({spec.size}x{spec.size}, 1 image): {bare * 1000:.1f} ms at sigma 1 (median of {reps}), "
        f"{sweep * 1000:.1f} ms mean over a sigma sweep")
    result: dict[str, Any] = {"size": spec.size, "task": task.name, "device": str(device), "bare_forward_s": bare,
                              "bare_forward_sweep_s": sweep, "machine": machine_description(),
                              "prior": _prior_fingerprint(spec.prior), "precision": prior.precision, "methods": {}}
    budget = spec.budgets[0] if spec.budgets else None
    for m in [m for m in spec.methods if m in DIFFUSION_METHODS]:
        cfg = method_config(m, spec.preset, budget, spec.overrides.get(m))
        totals: dict[str, float] = {}
        timed = _timed_prior(prior, device, totals)
        try:
            with _phase_timers(device, totals):
                sync()
                t0 = time.perf_counter()
                res = restore(y, op, prior=timed, method=m, config=cfg, sigma_y=spec.sigma_y, seed=0, progress=False)
                sync()
                total = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            result["methods"][m] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{m}: FAILED {e}")
            continue
        per = total / max(1, res.nfe)
        phases = dict(totals)
        net = phases.get("network", 0.0)
        if "predictor" in phases:
            phases["predictor (non-network)"] = phases.pop("predictor") - net
        phases["other"] = total - sum(v for v in phases.values())
        result["methods"][m] = {"nfe": res.nfe, "total_s": total, "per_nfe_s": per,
                                "network_per_call_s": net / max(1, res.nfe), "overhead_ratio": total / max(net, 1e-12),
                                "ratio": per / sweep, "phases_s": phases, "config": dataclasses.asdict(cfg)}
        log(f"{m}: {res.nfe} NFE in {total:.2f}s, {per * 1000:.1f} ms/NFE; total / network time {total / max(net, 1e-12):.3f}x; "
            f"{per / sweep:.2f}x the bare forward (sweep)")
    _atomic_write_text(out / "profile.json", json.dumps(result, indent=1, default=str))
    _atomic_write_text(out / "profile.md", profile_markdown(result))
    log(f"wrote {out / 'profile.md'}")
    return result


def profile_markdown(result: dict[str, Any]) -> str:
    mach = result["machine"]
    L = ["# Profile: time per network evaluation", "",
         f"- image {result['size']}x{result['size']}, task {result['task']}, device {result['device']}, "
         f"{mach.get('cpu', '')} (nproc {mach.get('nproc')})",
         f"- prior: {result['prior'].get('path')} (sha256 {result['prior'].get('sha256', '?')})",
         f"- bare network forward (the prior's denoise, batch 1): {result['bare_forward_s'] * 1000:.1f} ms at sigma 1 "
         f"(median); **{result['bare_forward_sweep_s'] * 1000:.1f} ms** mean over a sigma sweep 0.01..80 (a tiled "
         "prior's cost varies with sigma: its tile grid shifts)",
         "", "Target: time per NFE <= 1.1 x the bare forward. `total / network` divides the run's wall time by the "
         "time spent inside the network calls of that same run (the sampler's own overhead, independent of tiling); "
         "`vs bare` divides the time per NFE by the sweep's mean forward.", "",
         "| method | NFE | total s | ms / NFE | network ms / call (in run) | total / network | vs bare |",
         "|---|---|---|---|---|---|---|"]
    for m, r in result["methods"].items():
        if "error" in r:
            L.append(f"| {m} | – | failed: {r['error'][:80]} | | | | |")
            continue
        L.append(f"| {m} | {r['nfe']} | {r['total_s']:.2f} | {r['per_nfe_s'] * 1000:.1f} | "
                 f"{r['network_per_call_s'] * 1000:.1f} | **{r['overhead_ratio']:.3f}x** | {r['ratio']:.2f}x |")
    L += ["", "Breakdown (seconds, whole run; the network is timed inside the predictor; for DPS 'other' is mostly "
          "the backward pass through the network):", "",
          "| method | " + " | ".join(["network", "predictor (non-network)", "inner (exact)", "inner (langevin)",
                                      "band mask (FFT)", "haar fuse", "spectrum fit", "re-noise", "other"]) + " |",
          "|---|" + "---|" * 9]
    for m, r in result["methods"].items():
        if "error" in r:
            continue
        ph = r["phases_s"]
        L.append(f"| {m} | " + " | ".join(f"{ph.get(k, 0.0):.3f}" for k in
                                           ["network", "predictor (non-network)", "inner (exact)", "inner (langevin)",
                                            "band mask (FFT)", "haar fuse", "spectrum fit", "re-noise", "other"]) + " |")
    return "\n".join(L) + "\n"


# =============================================================================== command line

def _int_list(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.split(",") if v.strip()) if s else ()


def _str_list(s: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in s.split(",") if v.strip()) if s else ()


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The benchmark's arguments (added to ``parser`` when given, e.g. an `nfc-dps bench` subparser)."""
    from .priors.diffusers_prior import PRECISIONS

    p = parser or argparse.ArgumentParser(
        prog="benchmark", description="PSNR/SSIM tables against the peers and classical baselines, NFE curves, "
                                      "timing, the Gaussian oracle and a per-NFE profile (see docs/benchmarks.md).")
    p.add_argument("--protocol", choices=PROTOCOLS, default="local",
                   help="local: embedded prior, 4 held-out scikit-image crops; paper: 256 px, --images and --prior "
                        "(DPS/DAPS operators); oracle: Gaussian prior with exact bounds; mixture: Gaussian-mixture "
                        "prior, exact multimodal posterior (nfc_dps.bench.mixture; --tasks picks its settings)")
    p.add_argument("--profile", action="store_true", help="time per NFE vs the bare network forward, with a breakdown")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/bench/<protocol>)")
    p.add_argument("--prior", default=None, help="diffusers prior folder (default: the embedded prior)")
    p.add_argument("--images", default=None, help="folder of images (paper protocol; optional for local)")
    p.add_argument("--image-names", default="", help="comma list of scikit-image names (local; default held-out four)")
    p.add_argument("--num-images", type=int, default=None, help="use the first N images (oracle: N images, default 30)")
    p.add_argument("--size", type=int, default=None, help="image size (local 64, paper 256, oracle 64, profile 256)")
    p.add_argument("--zoom", type=int, default=2, help="local: centre crop of size*zoom px area-averaged by zoom")
    p.add_argument("--tasks", default="", help=f"comma list (default {','.join(DEFAULT_TASKS)}; also: denoise)")
    p.add_argument("--methods", default="", help=f"comma list (default {','.join(DEFAULT_METHODS)})")
    p.add_argument("--budgets", default="", help="comma list of NFE budgets, e.g. 20,50,100 (default: preset NFE)")
    p.add_argument("--preset", default=None, help="sampler preset (local/oracle/profile: fast; paper: paper)")
    p.add_argument("--samples", type=int, default=1, help="K posterior samples per image; K > 1 adds a 'mean of K' row")
    p.add_argument("--sigma-y", type=float, default=0.025, help="noise std in [0, 1] units (0.025 = DPS's 0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--boundary", choices=("circular", "reflect"), default=None,
                   help="blur boundary (local: circular; paper: reflect, as DPS)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="prior network compute precision (auto: bfloat16 where the hardware has it natively)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="config override, e.g. nfc.inner=langevin or nfc.band.blend_start=0.2 (repeatable)")
    p.add_argument("--oracle-alpha", type=float, default=2.0, help="oracle: power-law exponent of the Gaussian prior")
    p.add_argument("--oracle-pixel-std", type=float, default=0.5, help="oracle: per-pixel std of the prior (model units)")
    p.add_argument("--label", default="", help="free text recorded in the summary (e.g. the checkpoint step)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.add_argument("--no-images", action="store_true", help="do not save restored images (and no grid.png)")
    return p


def _parse_overrides(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, val = item.partition("=")
        method, dot, field_ = key.strip().partition(".")
        if not eq or not dot or not field_:
            raise ValueError(f"--set expects METHOD.KEY=VALUE, got {item!r}")
        out.setdefault(method, {})[field_] = yaml.safe_load(val)
    return out


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    protocol = args.protocol
    default_size = 256 if (protocol == "paper" or args.profile) else 32 if protocol == "mixture" else 64
    if args.profile and not (args.out):
        args.out = Path("runs/bench/profile")
    tasks = _str_list(args.tasks) or (("deblur_gaussian",) if args.profile else DEFAULT_TASKS)
    methods = _str_list(args.methods) or (("nfc", "daps") if args.profile else DEFAULT_METHODS)
    if protocol == "oracle" and not _str_list(args.methods):
        methods = ("nfc", "daps", "dps", "diffpir", "ddnm", "ddrm", "wiener", "tv")
    if protocol == "mixture":  # empty: every setting and every registered sampler (nfc_dps.bench.mixture)
        tasks, methods = _str_list(args.tasks), _str_list(args.methods)
    return BenchSpec(
        protocol=protocol, out=Path(args.out or f"runs/bench/{protocol}"), prior=args.prior, images=args.images,
        image_names=_str_list(args.image_names), num_images=args.num_images, size=args.size or default_size,
        zoom=max(1, args.zoom), tasks=tasks, methods=methods, budgets=_int_list(args.budgets),
        preset=args.preset or ("paper" if protocol == "paper" else "fast"), samples=max(1, args.samples),
        sigma_y=args.sigma_y, seed=args.seed, boundary=args.boundary or ("reflect" if protocol == "paper" else "circular"),
        device=args.device, precision=args.precision, overrides=_parse_overrides(args.overrides), plots=not args.no_plots,
        save_images=not args.no_images, label=args.label, oracle_alpha=args.oracle_alpha,
        oracle_pixel_std=args.oracle_pixel_std)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        spec = spec_from_args(args)
        if args.profile:
            run_profile(spec)
        elif spec.protocol == "oracle":
            run_oracle(spec)
        elif spec.protocol == "mixture":
            from .bench.mixture import run_mixture

            run_mixture(spec)
        else:
            run(spec)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"benchmark: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

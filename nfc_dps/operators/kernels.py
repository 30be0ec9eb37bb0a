"""Blur kernels: Gaussian, random camera-shake (motion) and kernels read from files.

Every maker returns a float32 torch tensor of shape (size, size) (``load_kernel``: the file's
shape) that sums to 1. Randomness comes only from the ``generator`` argument (an int seed or a
``numpy.random.Generator``), never from a global RNG, so a seed fixes the kernel.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import scipy.ndimage as ndi
import torch
from torch import Tensor

__all__ = ["gaussian_kernel", "motion_kernel", "shake_kernel", "load_kernel", "normalize_kernel", "as_numpy_rng"]


def as_numpy_rng(generator: int | np.random.Generator | None, what: str = "generator") -> np.random.Generator:
    """An int seed or a numpy Generator -> numpy Generator (never the global RNG)."""
    if isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"{what} seed must be >= 0, got {generator}")
        return np.random.default_rng(int(generator))
    raise TypeError(f"{what} must be an int seed or a numpy.random.Generator, got {type(generator).__name__}")


def _check_size(size: int, name: str = "size") -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"{name} must be a positive int, got {size!r}")
    return int(size)


def normalize_kernel(kernel: np.ndarray | Tensor, source: str = "kernel") -> Tensor:
    """Check a 2-D kernel (finite, positive sum) and return it as float32 normalised to sum 1.

    ``source`` names the kernel (e.g. a file path) in error messages.
    """
    k = kernel.detach().cpu().numpy() if isinstance(kernel, Tensor) else np.asarray(kernel)
    if k.dtype == object or not (np.issubdtype(k.dtype, np.number) or k.dtype == bool):
        raise TypeError(f"{source}: kernel must be numeric, got dtype {k.dtype}")
    k = k.astype(np.float64)
    if k.ndim != 2:
        raise ValueError(f"{source}: kernel must be 2-D (kh, kw), got shape {k.shape}")
    if k.size == 0:
        raise ValueError(f"{source}: kernel is empty, shape {k.shape}")
    if not np.isfinite(k).all():
        raise ValueError(f"{source}: kernel contains NaN or Inf")
    total = float(k.sum())
    if not total > 0:
        raise ValueError(f"{source}: kernel must sum to a positive number, got sum {total!r}")
    return torch.from_numpy(k / total).to(torch.float32)


def gaussian_kernel(size: int = 61, std: float = 3.0) -> Tensor:
    """Centred (size, size) Gaussian blur kernel, normalised to sum 1.

    Built like DPS (REFERENCE 5.2): a delta at (size // 2, size // 2) filtered by
    ``scipy.ndimage.gaussian_filter(sigma=std)`` (default truncation at 4 std) with zero
    boundary, then normalised. ``std = 0`` gives the delta (identity blur).
    """
    size = _check_size(size)
    if not (isinstance(std, (int, float, np.floating, np.integer)) and math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    delta = np.zeros((size, size))
    delta[size // 2, size // 2] = 1.0
    k = ndi.gaussian_filter(delta, sigma=float(std), mode="constant") if std > 0 else delta
    return normalize_kernel(k, f"gaussian_kernel(size={size}, std={std})")


def _camera_path(rng: np.random.Generator, diagonal: float, intensity: float) -> np.ndarray:
    """Random camera path (complex points, centre of mass at 0) of the DPS/DAPS family."""
    eps = 0.1
    max_path_len = 0.75 * diagonal * (rng.uniform() + rng.uniform(0.0, intensity**2))
    # Beta(1, 30) steps, kept only when shorter than the whole path, until the path is long enough.
    steps: list[float] = []
    total = 0.0
    while total < max_path_len:
        step = rng.beta(1, 30) * (1.0 - intensity + eps) * diagonal
        if step < max_path_len:
            steps.append(step)
            total += step
    n = len(steps)
    # Directions: the first uniform in [-max_angle, max_angle]; each next one a triangular draw
    # (mode intensity * max_angle) whose sign flips with probability `jitter`.
    max_angle = rng.uniform(0.0, intensity * math.pi)
    jitter = rng.beta(2, 20)
    angles = np.empty(n)
    angles[0] = rng.uniform(-max_angle, max_angle)
    sign = 1.0 if angles[0] >= 0 else -1.0
    for i in range(1, n):
        a = abs(rng.triangular(0.0, intensity * max_angle, max_angle + eps))
        if rng.uniform() < jitter:
            sign = -sign
        angles[i] = sign * a
    increments = np.asarray(steps) * np.exp(1j * angles)
    path = np.concatenate([[0.0 + 0.0j], np.cumsum(increments)])
    path = path - path.mean()
    return path * np.exp(1j * rng.uniform(0.0, math.pi))


def _rasterise(path: np.ndarray, grid: int, centre: float, spacing: float = 0.25) -> np.ndarray:
    """Anti-aliased polyline: points every ``spacing`` px along each segment, splatted bilinearly."""
    img = np.zeros((grid, grid))
    pts = path + centre * (1 + 1j)
    xs, ys, ws = [], [], []
    for a, b in zip(pts[:-1], pts[1:]):
        length = abs(b - a)
        m = max(int(math.ceil(length / spacing)), 1)
        t = (np.arange(m) + 0.5) / m
        p = a + (b - a) * t
        xs.append(p.real)
        ys.append(p.imag)
        ws.append(np.full(m, length / m if length > 0 else 1.0))
    if not xs:  # a single point
        xs, ys, ws = [pts.real], [pts.imag], [np.ones(len(pts))]
    x, y, w = np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = x - x0, y - y0
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            cx, cy = (x0 + dx).astype(np.int64), (y0 + dy).astype(np.int64)
            inside = (cx >= 0) & (cx < grid) & (cy >= 0) & (cy < grid)
            np.add.at(img, (cy[inside], cx[inside]), (w * wx * wy)[inside])
    return img


def motion_kernel(size: int = 61, intensity: float = 0.5, generator: int | np.random.Generator = 0) -> Tensor:
    """Random camera-shake kernel (size, size), float32, sum 1.

    Our own generator of the family used by DPS/DAPS (REFERENCE 5.1): on a 2x supersampled grid
    a path of Beta(1, 30)-distributed steps with jittered directions (its length and angular
    spread grow with ``intensity`` in [0, 1]) is centred, randomly rotated, rasterised with
    bilinear anti-aliasing, blurred by a Gaussian (std 1 supersampled px), averaged down 2x2 to
    (size, size) and normalised. The path's centre of mass lands on pixel (size//2, size//2).
    ``generator``: int seed or numpy Generator (the default seed 0 makes the default kernel
    reproducible; pass other seeds for other kernels). Not bit-identical to the
    ``motionblur`` package (different RNG and rasteriser), the same family of kernels.
    """
    size = _check_size(size)
    if not (isinstance(intensity, (int, float, np.floating, np.integer)) and 0 <= intensity <= 1):
        raise ValueError(f"intensity must be a number in [0, 1], got {intensity!r}")
    rng = as_numpy_rng(generator)
    grid = 2 * size
    diagonal = math.hypot(grid, grid)
    path = _camera_path(rng, diagonal, float(intensity))
    # supersampled pixel i covers coarse pixel i // 2, whose centre is at 2 * c + 0.5
    img = _rasterise(path, grid, centre=2 * (size // 2) + 0.5)
    img = ndi.gaussian_filter(img, sigma=1.0, mode="constant")
    small = img.reshape(size, 2, size, 2).mean(axis=(1, 3))
    if not small.sum() > 0:  # pathological: everything fell off the grid
        small = np.zeros((size, size))
        small[size // 2, size // 2] = 1.0
    return normalize_kernel(small, f"motion_kernel(size={size}, intensity={intensity})")


def shake_kernel(size: int = 31, generator: int | np.random.Generator = 0) -> Tensor:
    """Random hand-shake kernel (size, size), float32, sum 1: a second family beside
    :func:`motion_kernel`, after Boracchi and Foi's trajectories (2012).

    A camera path of 2000 steps of constant speed (60 px in all) whose velocity turns by Gaussian
    jitter, a pull back towards the start (the hand correcting) and rare abrupt jerks, their
    strengths drawn per kernel as Boracchi and Foi draw them; the path is scaled so that its longer
    extent spans 40-90 % of the support, centred on its centre of mass, rasterised with bilinear
    anti-aliasing, blurred by a Gaussian of std 0.5 px and normalised. ``generator``: int seed or numpy Generator.
    """
    size = _check_size(size)
    rng = as_numpy_rng(generator)
    steps, length = 2000, 60.0
    step = length / (steps - 1)
    anxiety, pull, jerks, jitter = rng.uniform(0, 0.1), rng.uniform(0, 0.7), rng.uniform(0, 0.2), rng.uniform(0, 10)
    v = np.exp(1j * rng.uniform(0, 2 * np.pi)) * step
    path = np.zeros(steps, complex)
    for t in range(steps - 1):
        jerk = 2 * v * np.exp(1j * (np.pi + rng.uniform(-0.5, 0.5))) if rng.random() < jerks * anxiety else 0
        v = v + jerk + anxiety * (jitter * complex(*rng.standard_normal(2)) - pull * path[t]) * step
        v = v / abs(v) * step if abs(v) > 0 else np.exp(1j * rng.uniform(0, 2 * np.pi)) * step
        path[t + 1] = path[t] + v
    extent = max(np.ptp(path.real), np.ptp(path.imag), 1e-6)
    path = (path - path.mean()) * (rng.uniform(0.4, 0.9) * (size - 1) / extent)
    img = _rasterise(path, size, centre=size // 2, spacing=0.25)
    img = ndi.gaussian_filter(img, sigma=0.5, mode="constant")
    return normalize_kernel(img, f"shake_kernel(size={size})")


def read_array(path: str | Path, what: str) -> np.ndarray:
    """Read a .npy array or an image file (PNG, JPEG, TIFF, ...) as float64.

    Images are turned upright by their EXIF orientation (as input images are), converted to gray
    and scaled to [0, 1] by their integer range (8/16-bit); .npy arrays are returned as stored.
    Errors name the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {str(path)!r}")
    if path.suffix.lower() == ".npy":
        try:
            with open(path, "rb") as f:
                magic = f.read(6)
        except OSError as exc:
            raise ValueError(f"cannot read {what} from {str(path)!r}: {exc.strerror or exc}") from exc
        if magic != b"\x93NUMPY":
            raise ValueError(f"{what} file {str(path)!r} is not a NumPy .npy file (no .npy header: text or another "
                             f"format?); save the array with numpy.save, or give a gray image file")
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - re-raised with the file name
            raise ValueError(f"cannot read {what} from {str(path)!r}: {exc}") from exc
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{what} file {str(path)!r} holds non-numeric data of dtype {arr.dtype}")
        if np.iscomplexobj(arr):
            raise ValueError(f"{what} file {str(path)!r} holds complex numbers (dtype {arr.dtype}); a {what} is "
                             f"real: save its real part (numpy.real) if that is what you mean")
        return arr.astype(np.float64)
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            opened.load()
            # the EXIF orientation, as for input images (nfc_dps.io.read_image): a mask must lie
            # on the image the way the image is read
            img = ImageOps.exif_transpose(opened)
            if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
                arr = np.asarray(img).astype(np.float64)
                scale = 65535.0 if img.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
                if img.mode == "F":
                    scale = 1.0
                return arr / scale
            if img.mode in ("LA", "RGBA", "PA"):
                img = img.convert("RGBA").convert("RGB")
            return np.asarray(img.convert("L")).astype(np.float64) / 255.0
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"cannot read {what} from {str(path)!r}: not a .npy file or a readable image ({exc})") from exc


def squeeze_to_2d(arr: np.ndarray) -> np.ndarray:
    """Drop leading singleton axes and a trailing singleton channel, never the 2-D axes
    themselves (a 1 x n kernel stays 1 x n)."""
    while arr.ndim > 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return arr


def load_kernel(path: str | Path) -> Tensor:
    """Blur kernel from a .npy file (2-D array) or a gray image, as float32 normalised to sum 1."""
    arr = squeeze_to_2d(read_array(path, "kernel"))
    if arr.ndim != 2:
        raise ValueError(f"kernel file {str(path)!r} must hold a 2-D array, got shape {arr.shape}")
    return normalize_kernel(arr, f"kernel file {str(path)!r}")

"""Training data for ``nfc-dps train-prior``: image pools, a held-out split and device-side crops.

Images are float32 (H, W, C) arrays in [0, 1] (C = 1 or 3), read with :func:`nfc_dps.io.read_image`
(any size, gray or RGB, 8- or 16-bit; alpha dropped). Two sources:

* a user folder (``--images DIR``, scanned recursively): a file is held out for evaluation when a
  hash of its path relative to the folder falls below the held-out fraction (when none does,
  the file with the lowest hash), so adding or removing files never moves another file between
  the splits; a resumed run keeps every file it has seen on its side;
* the built-in set (nfc_dps/priors/training_data.py): scikit-image's ``TRAIN_IMAGES`` for
  training, ``HELDOUT_IMAGES`` for evaluation (never trained on), plus procedural images
  (:class:`DeadLeaves`: flat dead leaves, or textured ones from :mod:`nfc_dps.training.leaves`).

:class:`CropSampler` keeps every training image (at each scale) in one flat tensor on the
training device and draws a batch with a single gather: image indices (area-weighted), crop
offsets and one of the 8 flips/90-degree rotations are sampled as tensors from a
``torch.Generator``, so no per-sample Python loop runs and a GPU is not starved.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from .. import io as nio
from ..priors.training_data import HELDOUT_IMAGES, TRAIN_IMAGES, load_skimage_image
from .leaves import DEFAULT_SYNTHETIC, SYNTHETIC, synthetic_image

BUILTIN = "builtin"
DEFAULT_SCALES = (1.0, 0.75, 0.5)
#: fraction of dead-leaves crops in the built-in set (user folders: 0 unless asked)
BUILTIN_DEAD_LEAVES = 0.25
LEAVES_COUNT, LEAVES_SIZE, LEAVES_REFRESH = 16, 256, 50
#: ITU-R BT.601 luma weights, for RGB images trained as gray
LUMA = np.array([0.299, 0.587, 0.114], np.float32)


class TrainingError(ValueError):
    """A problem with the training inputs or the work folder; the message names the file, flag or key."""


@dataclass
class TrainingData:
    """Training and held-out images of one source (arrays (H, W, C) float32 in [0, 1])."""

    source: str
    channels: int
    train: list[tuple[str, np.ndarray]]
    heldout: list[tuple[str, np.ndarray]]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)


def to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """(H, W) or (H, W, 1|3) in [0, 1] -> (H, W, channels) float32 (gray replicated; RGB -> BT.601 luma)."""
    img = np.asarray(img, np.float32)
    if img.ndim == 2:
        img = img[..., None]
    if img.shape[2] == channels:
        return np.ascontiguousarray(img)
    if channels == 3:
        return np.ascontiguousarray(np.repeat(img[..., :1], 3, axis=2))
    return np.ascontiguousarray((img[..., :3] @ LUMA)[..., None])


def heldout_score(relative: str) -> float:
    """A stable number in [0, 1) from a file's relative path (sha256); below the fraction = held out."""
    return int(hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest()[:12], 16) / 16**12


def unreadable_subfolders(folder: Path, exclude: Sequence[Path] = ()) -> list[tuple[Path, str]]:
    """(subfolder, reason) for each non-hidden folder under ``folder`` that cannot be listed (the
    recursive image scan passes over those without a word); folders under ``exclude`` and
    symbolic links to folders (which the scan does not follow) are not visited."""
    skip = {os.path.realpath(p) for p in exclude}
    found: list[tuple[Path, str]] = []

    def failed(e: OSError) -> None:
        if e.filename is not None and Path(e.filename) != folder:
            found.append((Path(e.filename), f"cannot read the folder ({e.strerror or e})"))

    for top, dirs, _ in os.walk(folder, onerror=failed):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(top, d)) not in skip)
    return sorted(found)


def load_folder(folder: str | Path, channels: int | None, crop: int, holdout: float,
                exclude: Sequence[Path] = (), log: Callable[[str], None] = print,
                previous: dict | None = None) -> TrainingData:
    """Read a user folder (see the module docstring). channels None: 1 when every image is gray, else 3.

    Unreadable files and folders, training images smaller than ``crop`` and held-out images
    smaller than ``crop`` (too few pixels for a PSNR) are skipped and named (in ``skipped`` and
    through ``log``); an unreadable ``folder`` or no usable training image is a :class:`TrainingError`.
    ``previous``: the split of the run being resumed, ``{"train": [...], "heldout": [...]}``
    (relative paths): those files keep their side, whatever was added or removed since; only new
    files are split by their hash.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TrainingError(f"--images {folder}: not a folder")
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as e:
        raise TrainingError(f"--images {folder}: cannot read the folder ({e.strerror or e})") from e
    skipped: list[tuple[str, str]] = []
    for sub, reason in unreadable_subfolders(folder, exclude):
        skipped.append((str(sub), reason))
        log(f"skipped the folder {sub}: {reason}; its images are not used")
    files, others = nio.scan_images(folder, exclude)
    if not files:
        raise TrainingError(f"--images {folder}: no image files found (searched recursively for "
                            f"{', '.join(nio.IMAGE_EXTENSIONS)}" + (f"; {len(others)} other file(s) ignored" if others else "")
                            + (f"; {len(skipped)} unreadable folder(s): {skipped[0][0]}" if skipped else "") + ")")
    if others:
        log(f"ignored {len(others)} file(s) that are not images: " + ", ".join(str(p) for p in others[:5])
            + (" ..." if len(others) > 5 else ""))
    read: list[tuple[str, np.ndarray]] = []
    for p in files:
        try:
            img, _ = nio.read_image(p)
        except nio.ImageReadError as e:
            skipped.append((str(p), e.reason))
            log(f"skipped {p}: {e.reason}")
            continue
        read.append((p.relative_to(folder).as_posix(), img))
    if not read:
        raise TrainingError(f"--images {folder}: none of the {len(files)} image file(s) could be read "
                            f"(first: {skipped[0][0]}: {skipped[0][1]})")
    if channels is None:
        channels = 1 if all(img.ndim == 2 for _, img in read) else 3
    scores = {name: heldout_score(name) for name, _ in read}
    held = {n for n in scores if scores[n] < holdout} if len(read) > 1 else set()
    if previous is not None:  # a resumed run: a file trained on is never evaluated on, and vice versa
        before_train, before_held = set(previous.get("train", ())), set(previous.get("heldout", ()))
        held = {n for n in scores if n in before_held or (n not in before_train and n in held)}
    elif holdout > 0 and len(read) > 1 and not held:
        held = {min(scores, key=scores.get)}
    if len(held) == len(read):
        held.discard(max(held, key=scores.get))
    if holdout > 0 and len(read) == 1:
        log(f"only one readable image in {folder}: no held-out split, so no held-out PSNR")
    train, heldout = [], []
    for name, img in read:
        img = to_channels(img, channels)
        if name in held and min(img.shape[:2]) < crop:  # a PSNR of a few pixels says nothing
            reason = (f"{img.shape[1]}x{img.shape[0]} pixels is smaller than the {crop}x{crop} crop: held out, "
                      f"but too small for the held-out PSNR")
            skipped.append((str(folder / name), reason))
            log(f"skipped {folder / name}: {reason}")
        elif name in held:
            heldout.append((name, img))
        elif min(img.shape[:2]) < crop:
            reason = f"{img.shape[1]}x{img.shape[0]} pixels is smaller than the {crop}x{crop} crop"
            skipped.append((str(folder / name), reason))
            log(f"skipped {folder / name}: {reason}")
        else:
            train.append((name, img))
    if not train:
        raise TrainingError(f"--images {folder}: no training image of at least {crop}x{crop} pixels "
                            f"({len(heldout)} held out, {len(skipped)} skipped; lower --crop or add images)")
    return TrainingData(str(folder.resolve()), channels, train, heldout, skipped)


def load_builtin(channels: int | None) -> TrainingData:
    """The package photos: TRAIN_IMAGES for training, HELDOUT_IMAGES held out (channels None: 3)."""
    channels = channels or 3
    train = [(n, to_channels(load_skimage_image(n), channels)) for n in TRAIN_IMAGES]
    heldout = [(n, to_channels(load_skimage_image(n), channels)) for n in HELDOUT_IMAGES]
    return TrainingData(BUILTIN, channels, train, heldout)


def multiscale(images: Sequence[np.ndarray], scales: Sequence[float], crop: int) -> list[np.ndarray]:
    """Each image at each scale (anti-aliased ``skimage.transform.rescale``), kept when >= crop."""
    from skimage.transform import rescale

    out = []
    for img in images:
        for s in scales:
            im = img if s == 1.0 else rescale(img, s, channel_axis=2, anti_aliasing=True).astype(np.float32)
            if min(im.shape[:2]) >= crop:
                out.append(np.ascontiguousarray(im))
    return out


class DeadLeaves:
    """A deterministic schedule of procedural images: ``count`` slots, one replaced (round robin)
    every ``refresh_every`` steps; generation g is ``dead_leaves(size, default_rng([seed, 1, g]))``
    for ``kind`` "dead_leaves" (flat disks), ``textured_leaves(size, default_rng([seed, 2, g]))``
    for "textured" (:mod:`nfc_dps.training.leaves`).

    So the images in use at any step are a function of (seed, step): a resumed run rebuilds them.
    """

    def __init__(self, seed: int, channels: int, count: int = LEAVES_COUNT, size: int = LEAVES_SIZE,
                 refresh_every: int = LEAVES_REFRESH, kind: str = DEFAULT_SYNTHETIC) -> None:
        if kind not in SYNTHETIC:
            raise TrainingError(f"--synthetic must be one of {', '.join(SYNTHETIC)}, got {kind!r}")
        self.seed, self.channels, self.count, self.size, self.refresh_every = seed, channels, count, size, refresh_every
        self.kind = kind

    def image(self, generation: int) -> np.ndarray:
        stream = 2 if self.kind == "textured" else 1
        rng = np.random.default_rng([self.seed, stream, generation])
        return to_channels(synthetic_image(self.kind, self.size, rng), self.channels)

    def generations(self, step: int) -> list[int]:
        """The generation held by each slot after ``step`` completed steps."""
        m = step // self.refresh_every  # refreshes so far; refresh k >= 1 puts generation count+k-1 in slot (k-1) % count
        out = []
        for j in range(self.count):
            if m > j:
                k = j + 1 + self.count * ((m - 1 - j) // self.count)
                out.append(self.count + k - 1)
            else:
                out.append(j)
        return out


class CropSampler:
    """Random crops with flips and rotations, drawn on ``device`` from a pool held there.

    ``batch(n, gen)`` -> (n, C, crop, crop) float32 in [-1, 1]. An image is drawn with
    probability proportional to its area (dead-leaves images share ``leaves_fraction``), its
    crop offset uniformly, and one of the 8 dihedral transforms uniformly, all from ``gen``.
    """

    def __init__(self, images: Sequence[np.ndarray], crop: int, device: torch.device | str,
                 leaves: DeadLeaves | None = None, leaves_fraction: float = 0.0) -> None:
        if not images:
            raise TrainingError("no training image at least as large as the crop")
        self.crop, self.device = int(crop), torch.device(device)
        self.channels = images[0].shape[2]
        self.leaves = leaves if leaves_fraction > 0 else None
        shapes = [im.shape[:2] for im in images]
        if self.leaves is not None:
            if self.leaves.size < crop:
                raise TrainingError(f"dead-leaves size {self.leaves.size} is smaller than the crop {crop}")
            shapes += [(self.leaves.size, self.leaves.size)] * self.leaves.count
        sizes = [h * w * self.channels for h, w in shapes]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.flat = torch.empty(int(sum(sizes)), dtype=torch.float32, device=self.device)
        for off, im in zip(offsets, images):
            self.flat[off : off + im.size] = torch.from_numpy(im.transpose(2, 0, 1).reshape(-1)).to(self.device)
        self.offsets = torch.as_tensor(offsets, device=self.device)
        self.h = torch.as_tensor([s[0] for s in shapes], device=self.device)
        self.w = torch.as_tensor([s[1] for s in shapes], device=self.device)
        area = torch.as_tensor([float(im.shape[0] * im.shape[1]) for im in images], dtype=torch.float64)
        probs = area / area.sum() * (1.0 - (leaves_fraction if self.leaves else 0.0))
        if self.leaves is not None:
            probs = torch.cat([probs, torch.full((self.leaves.count,), leaves_fraction / self.leaves.count,
                                                 dtype=torch.float64)])
        self.probs = probs.float().to(self.device)
        self.n_images = len(images)
        self.slot_generation = [-1] * (self.leaves.count if self.leaves else 0)
        c = self.crop
        i, j = torch.meshgrid(torch.arange(c), torch.arange(c), indexing="ij")
        r_i, r_j = c - 1 - i, c - 1 - j
        # output pixel (i, j) reads crop pixel (dy, dx): the 4 rotations, then the 4 mirrored ones
        self.dy = torch.stack([i, j, r_i, r_j, i, r_j, r_i, j]).to(self.device)
        self.dx = torch.stack([j, r_i, r_j, i, r_j, r_i, j, i]).to(self.device)
        self.chan = torch.arange(self.channels, device=self.device).view(1, -1, 1, 1)

    def sync_leaves(self, step: int) -> None:
        """Make the dead-leaves slots hold the images of ``step`` (only changed slots are redrawn)."""
        if self.leaves is None:
            return
        for j, g in enumerate(self.leaves.generations(step)):
            if self.slot_generation[j] != g:
                im = self.leaves.image(g)
                off = int(self.offsets[self.n_images + j])
                self.flat[off : off + im.size] = torch.from_numpy(im.transpose(2, 0, 1).reshape(-1)).to(self.device)
                self.slot_generation[j] = g

    def batch(self, n: int, gen: torch.Generator) -> torch.Tensor:
        c, dev = self.crop, self.device
        idx = torch.multinomial(self.probs, n, replacement=True, generator=gen)
        h, w, off = self.h[idx], self.w[idx], self.offsets[idx]
        y = (torch.rand(n, generator=gen, device=dev) * (h - c + 1)).long().clamp_max(h - c)
        x = (torch.rand(n, generator=gen, device=dev) * (w - c + 1)).long().clamp_max(w - c)
        d = torch.randint(8, (n,), generator=gen, device=dev)
        pix = (y.view(-1, 1, 1) + self.dy[d]) * w.view(-1, 1, 1) + x.view(-1, 1, 1) + self.dx[d]  # (n, c, c)
        index = off.view(-1, 1, 1, 1) + self.chan * (h * w).view(-1, 1, 1, 1) + pix[:, None]  # (n, C, c, c)
        return self.flat[index].mul_(2).sub_(1)

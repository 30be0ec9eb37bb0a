"""Blind deblurring on the held-out photos (``--protocol blind``): the kernel unknown to the method.

Each held-out photo (the centre 256 px: ``--size``) is the scene; a kernel per (family, image) blurs it with the
scene going on past the frame (boundary "valid": the photo is 256 - s + 1 px), noise σ 0.01. Kernel
families: ``motion61``, the paper protocol's 61-px camera-shake kernels (:func:`motion_kernel`,
intensity 0.5), and ``shake31``, 31-px hand-shake trajectories of a second generator
(:func:`shake_kernel`, after Boracchi and Foi). Methods:

- ``nfc-blind``: NFC's default on :class:`~nfc_dps.operators.blind.BlindBlur` (the kernel estimated
  from the photo, re-estimated from the restoration twice);
- ``nfc-true``: NFC's default with the true kernel (the bound the error ratio is taken against);
- ``nfc-gaussian``: NFC's default with a Gaussian guess of the kernel's size (std size / 10);
- ``classical``: the classical blind method, the kernel from the photo alone (L0 coarse to fine,
  :func:`~nfc_dps.operators.kernel_estimation.estimate_kernel`), then TV with it;
- ``dpir-blind``: DPIR on the same blind operator (its restorations refine the kernel);
- ``photo``: the blurred photo as it came (no restoration), scored the same way.

Scores are on the photo's own frame and, as Levin et al. compare blind results, up to an integer
shift of at most ``MAX_SHIFT`` px (a kernel is estimated up to a shift, which moves the image).

Rows (results.csv): family, image, method, psnr, ssim, kernel_error (up to a shift, relative L2),
nfe, seconds, note.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch

from ..api import restore
from ..baselines import restore_classical
from ..metrics import psnr, ssim
from ..noise import GaussianNoise
from ..operators import BlindBlur, BlurOperator, gaussian_kernel, motion_kernel, shake_kernel
from ..operators.kernel_estimation import estimate_kernel, kernel_error
from ..restore_inputs import stable_seed
from .runner import Case, Protocol, Row, Table, folder_record, load_bench_prior, prior_record
from .tables import fmt
from .tier_tables import cell_number, committed_rows, source_note, write_summary

RESULTS = Table("results.csv", ("family", "image", "method", "psnr", "ssim", "kernel_error", "nfe", "seconds", "note"),
                ("family", "image", "method"), ("family",))
#: kernel family -> (size, its generator (size, seed) -> kernel, what the page calls it)
FAMILIES: dict[str, tuple[int, Callable[[int, int], torch.Tensor], str]] = {
    "motion61": (61, lambda size, seed: motion_kernel(size, 0.5, seed), "61-px camera shake (paper protocol)"),
    "shake31": (31, shake_kernel, "31-px hand-shake trajectories (second generator)"),
}
METHODS = ("nfc-blind", "nfc-true", "nfc-gaussian", "classical", "dpir-blind", "photo")
SIGMA = 0.01
NOISE = GaussianNoise(SIGMA)
#: the largest integer shift the scores are taken up to, px
MAX_SHIFT = 3


def shift_scores(image: torch.Tensor, truth: torch.Tensor, frame: tuple[int, int, int, int]) -> tuple[float, float]:
    """(PSNR, SSIM) of ``image`` against ``truth`` ((1, C, H, W), the scene) on the photo's ``frame``
    (top, left, h, w), at the integer shift of at most MAX_SHIFT px that gives the best PSNR."""
    top, left, h, w = frame
    ref = truth[..., top:top + h, left:left + w].double()
    best = (-np.inf, 0, 0)
    for dy in range(-MAX_SHIFT, MAX_SHIFT + 1):
        for dx in range(-MAX_SHIFT, MAX_SHIFT + 1):
            t, l = top + dy, left + dx
            if t < 0 or l < 0 or t + h > image.shape[-2] or l + w > image.shape[-1]:
                continue
            score = float(psnr(image[..., t:t + h, l:l + w].double().clamp(0, 1), ref))
            best = max(best, (score, dy, dx))
    score, dy, dx = best
    part = image[..., top + dy:top + dy + h, left + dx:left + dx + w].double().clamp(0, 1)
    return score, float(ssim(part, ref))


class BlindTier(Protocol):
    """Per kernel family a group of photos; per photo every method's restoration."""

    tables = (RESULTS,)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.families = self.chosen(spec.tasks, list(FAMILIES), "--tasks", "kernel families")
        self.methods = self.chosen(spec.methods, METHODS, "--methods", "methods")
        self.names = self.photo_names()
        self.prior = load_bench_prior(spec, device)
        self.prior_info = prior_record(spec.prior)

    def record(self) -> dict[str, Any]:
        return folder_record(self.spec, {}, self.prior_info, self.prior.precision)

    def cases(self) -> list[Case]:
        return [Case((f,), f, tuple((f, n, m) for n in self.names for m in self.methods)) for f in self.families]

    def row_labels(self, rows: Sequence[Row]) -> set[str]:
        return {r["method"] for r in rows}

    def setup(self, group: Hashable, log: Callable[[str], None] = print) -> SimpleNamespace:
        """The family's truths x (N, 3, size, size), kernels and seeded photos y (valid blur)."""
        family = group
        size, draw, _ = FAMILIES[family]
        x = self.photo_truths(self.names, 1).cpu()
        kernels = [draw(size, stable_seed(self.spec.seed, "blind-kernel", family, n)) for n in self.names]
        ys = [BlurOperator(k, "valid").measure(x[i:i + 1], SIGMA, torch.Generator().manual_seed(
            stable_seed(self.spec.seed, "blind-noise", family, n))) for i, (k, n) in enumerate(zip(kernels, self.names))]
        # the photo's frame in the scene (the same for every kernel of the family's size)
        frame = BlurOperator(kernels[0], "valid").measured_frame(tuple(x.shape))
        return SimpleNamespace(family=family, size=size, x=x, kernels=kernels, y=ys, frame=frame)

    def _restored(self, c: SimpleNamespace, i: int, name: str, method: str) -> tuple[torch.Tensor, Any, int]:
        """(the scene restored (1, C, H, W), the kernel the method estimated or None, network calls)."""
        y, size, seed = c.y[i].to(self.device), c.size, stable_seed(self.spec.seed, "blind-restore", c.family, name)
        if method == "photo":  # on the scene's grid, at the frame it lies over
            top, left, h, w = c.frame
            canvas = torch.zeros_like(c.x[i:i + 1])
            canvas[..., top:top + h, left:left + w] = c.y[i].clamp(0, 1)
            return canvas, None, 0
        if method == "classical":
            kernel = estimate_kernel(y[0].cpu(), size)
            return restore_classical("tv", BlurOperator(kernel.float(), "valid").to(self.device), y, NOISE).cpu(), kernel, 0
        kernels = {"nfc-true": c.kernels[i], "nfc-gaussian": gaussian_kernel(size, size / 10)}
        operator = BlurOperator(kernels[method], "valid") if method in kernels else BlindBlur(size)
        out = restore(y, operator.to(self.device), prior=self.prior, method="dpir" if method == "dpir-blind" else "nfc",
                      noise=NOISE, seed=seed, progress=False)
        return out.image.cpu(), out.kernel, out.nfe

    def measure(self, c: SimpleNamespace, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        for i, name in enumerate(self.names):
            for method in self.methods:
                key = (c.family, name, method)
                if key in done:
                    continue
                t0 = time.perf_counter()
                row: Row = {"family": c.family, "image": name, "method": method, "psnr": "", "ssim": "",
                            "kernel_error": "", "nfe": "", "note": ""}
                try:
                    image, kernel, nfe = self._restored(c, i, name, method)
                    score, similarity = shift_scores(image, c.x[i:i + 1], c.frame)
                    row.update(psnr=round(score, 4), ssim=round(similarity, 4), nfe=nfe,
                               kernel_error="" if kernel is None else round(kernel_error(kernel, c.kernels[i]), 4))
                except Exception as e:  # noqa: BLE001 - a failing method is a noted row
                    row["note"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                row["seconds"] = round(time.perf_counter() - t0, 2)
                log(f"{c.family} {name} {method}: {row['psnr'] or row['note']}")
                yield RESULTS.file, row

    def header(self) -> dict[str, Any]:
        return {"images": f"{', '.join(self.names)} ({self.spec.size} px scenes, valid blur, noise σ {SIGMA})",
                "prior": self.prior_info, "families": "; ".join(f"{f}: {FAMILIES[f][2]}" for f in self.families),
                "scores": f"on the photo's frame, up to an integer shift of at most {MAX_SHIFT} px"}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        write_summary(self.spec.out, "Blind deblurring", header, blind_table(tables[RESULTS.file]))
        return {}


def blind_table(rows: list[Row]) -> str:
    """Per kernel family and method: mean PSNR and SSIM, the error ratio against NFC with the true
    kernel (MSE ratio, mean and worst over the images), the kernel's error, network calls and
    seconds per image; failed images are counted in the row, never left out silently."""
    families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    L = ["| kernels | method | PSNR | SSIM | error ratio (mean / worst) | kernel error | NFE | s / image |",
         "|---|---|---|---|---|---|---|---|"]
    for f in families:
        mine = [r for r in rows if r["family"] == f]
        bound = {r["image"]: cell_number(r, "psnr") for r in mine if r["method"] == "nfc-true"}
        for m in [m for m in METHODS if any(r["method"] == m for r in mine)]:
            rs = [r for r in mine if r["method"] == m]
            ok = [r for r in rs if cell_number(r, "psnr") is not None]
            failed = len(rs) - len(ok)
            if not ok:
                L.append(f"| {f} | {m} | failed on {failed} of {len(rs)} | | | | | |")
                continue
            ratios = [10 ** ((bound[r["image"]] - cell_number(r, "psnr")) / 10) for r in ok if bound.get(r["image"]) is not None]
            errors = [e for e in (cell_number(r, "kernel_error") for r in ok) if e is not None]
            cells = [fmt(float(np.mean([cell_number(r, "psnr") for r in ok])), ".2f"),
                     fmt(float(np.mean([cell_number(r, "ssim") for r in ok])), ".3f"),
                     f"{fmt(float(np.mean(ratios)), '.2f')} / {fmt(max(ratios), '.2f')}" if ratios else "–",
                     fmt(float(np.mean(errors)), ".2f") if errors else "–",
                     str(int(np.mean([float(r["nfe"] or 0) for r in ok]))),
                     fmt(float(np.mean([float(r["seconds"]) for r in ok])), ".1f")]
            label = m + (f" (failed on {failed} of {len(rs)})" if failed else "")
            L.append(f"| {f} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(L)


def blind_doc_table(folder: Path, link: str) -> str:
    """The table from a committed run folder (results.csv, summary.md's header) with its source line."""
    rows, h, name = committed_rows(folder, RESULTS.file, RESULTS.columns, ("psnr", "ssim", "kernel_error", "nfe"))
    return blind_table(rows) + "\n\n" + source_note(name, link, h, h.get("images", "?"), f"scores {h.get('scores', '?')}")

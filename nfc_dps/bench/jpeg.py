"""JPEG restoration on the held-out photos (``--protocol jpeg``): real JPEG files in, restorations out.

Each held-out photo (the centre ``--size`` px, 256 by default) is written by Pillow as a real JPEG file
at quality 10, 20 and 40 (4:2:0 chroma subsampling; ``--tasks q10,q20,q40`` picks them), kept in
OUT/files/, and read back as a measurement (:func:`~nfc_dps.operators.jpeg.jpeg_measurement`: the file's
tables, subsampling and stored integers). Methods (rows):

- ``decoded``: the JPEG as a viewer shows it (no restoration);
- ``qcs_tv``: the classical deblocking, TV alternated with the projection onto the quantisation cells
  (:func:`~nfc_dps.baselines.qcs_tv`, through :func:`~nfc_dps.baselines.restore_classical`);
- ``dpir``: DPIR on the file's :class:`~nfc_dps.operators.jpeg.JpegOperator`, its noise the file's
  quantisation and its result projected onto the cells (both by :func:`nfc_dps.restore`);
- ``nfc``: NFC's default (deterministic) the same way.

Rows (results.csv): quality, image, method, psnr, ssim, nfe, seconds, note.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch

from ..api import restore
from ..baselines import CLASSICAL, restore_classical
from ..io.jpeg import write_jpeg
from ..metrics import psnr, ssim
from ..operators.jpeg import jpeg_measurement
from ..restore_inputs import stable_seed
from .runner import Case, Protocol, Row, Table, folder_record, load_bench_prior, prior_record
from .tables import fmt
from .tier_tables import cell_number, committed_rows, source_note, write_summary

RESULTS = Table("results.csv", ("quality", "image", "method", "psnr", "ssim", "nfe", "seconds", "note"),
                ("quality", "image", "method"), ("quality",))
#: --tasks name -> JPEG quality
QUALITIES = {"q10": 10, "q20": 20, "q40": 40}
METHODS = ("decoded", "qcs_tv", "dpir", "nfc")
SUBSAMPLING = "4:2:0"
#: what the table calls each row
LABELS = {"decoded": "decoded JPEG", "qcs_tv": f"{CLASSICAL['qcs_tv'].label} (classical)", "dpir": "DPIR + projection",
          "nfc": "NFC default + projection"}


class JpegTier(Protocol):
    """Per quality a group of JPEG files; per file every method's restoration."""

    tables = (RESULTS,)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.qualities = self.chosen(spec.tasks, list(QUALITIES), "--tasks", "qualities")
        self.methods = self.chosen(spec.methods, METHODS, "--methods", "methods")
        self.names = self.photo_names()
        needs_prior = any(m in ("dpir", "nfc") for m in self.methods)
        self.prior = load_bench_prior(spec, device) if needs_prior else None
        self.prior_info = prior_record(spec.prior) if needs_prior else None

    def record(self) -> dict[str, Any]:
        return folder_record(self.spec, {}, self.prior_info, self.prior.precision if self.prior else None)

    def cases(self) -> list[Case]:
        return [Case((q,), q, tuple((q, n, m) for n in self.names for m in self.methods)) for q in self.qualities]

    def row_labels(self, rows: Sequence[Row]) -> set[str]:
        return {r["method"] for r in rows}

    def setup(self, group: Hashable, log: Callable[[str], None] = print) -> SimpleNamespace:
        """The truths x (N, 3, size, size) and each photo's JPEG file at the group's quality, read back."""
        quality = QUALITIES[str(group)]
        x = self.photo_truths(self.names, 1).cpu()
        files = self.spec.out / "files"
        measured = []
        for i, name in enumerate(self.names):
            path = files / f"{name}_q{quality}.jpg"
            write_jpeg(path, x[i].permute(1, 2, 0).numpy(), quality, SUBSAMPLING)
            measured.append(jpeg_measurement(path))
        return SimpleNamespace(quality=group, x=x, measured=measured)

    def _restored(self, c: SimpleNamespace, i: int, name: str, method: str) -> tuple[torch.Tensor, int]:
        """(the restoration (1, C, H, W), network calls)."""
        m = c.measured[i]
        if method == "decoded":
            return m.decoded, 0
        op, y = m.operator.to(self.device), m.y.to(self.device)
        if method == "qcs_tv":
            return restore_classical("qcs_tv", op, y, op.measurement_noise()).cpu(), 0
        out = restore(y, op, prior=self.prior, method=method, seed=stable_seed(self.spec.seed, "jpeg", c.quality, name),
                      progress=False)
        return out.image.cpu(), out.nfe

    def measure(self, c: SimpleNamespace, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        for i, name in enumerate(self.names):
            for method in self.methods:
                key = (c.quality, name, method)
                if key in done:
                    continue
                t0 = time.perf_counter()
                row: Row = {"quality": c.quality, "image": name, "method": method, "psnr": "", "ssim": "", "nfe": "",
                            "note": ""}
                try:
                    image, nfe = self._restored(c, i, name, method)
                    truth = c.x[i:i + 1].double()
                    image = image.double().clamp(0, 1)
                    row.update(psnr=round(float(psnr(image, truth)), 4), ssim=round(float(ssim(image, truth)), 4), nfe=nfe)
                except Exception as e:  # noqa: BLE001 - a failing method is a noted row
                    row["note"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                row["seconds"] = round(time.perf_counter() - t0, 2)
                log(f"{c.quality} {name} {method}: {row['psnr'] or row['note']}")
                yield RESULTS.file, row

    def header(self) -> dict[str, Any]:
        return {"images": f"{', '.join(self.names)} ({self.spec.size} px centre crops, real JPEG files written by "
                          f"Pillow, {SUBSAMPLING})",
                "prior": self.prior_info, "qualities": ", ".join(str(QUALITIES[q]) for q in self.qualities),
                "scores": "PSNR and SSIM on the whole image against the photo before compression"}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        write_summary(self.spec.out, "JPEG restoration", header, jpeg_table(tables[RESULTS.file]))
        return {}


def jpeg_table(rows: list[Row]) -> str:
    """Per quality and method: mean PSNR and SSIM, the PSNR gain over the decoded JPEG and over QCS + TV
    (mean over the images both scored), network calls and seconds per image; failed images are
    counted in the row, never left out silently."""
    qualities = [q for q in QUALITIES if any(str(r["quality"]) == q for r in rows)]
    L = ["| quality | method | PSNR | SSIM | vs decoded | vs QCS + TV | NFE | s / image |",
         "|---|---|---|---|---|---|---|---|"]
    for q in qualities:
        mine = [r for r in rows if str(r["quality"]) == q]
        ref = {m: {r["image"]: cell_number(r, "psnr") for r in mine if r["method"] == m} for m in ("decoded", "qcs_tv")}
        for m in [m for m in METHODS if any(r["method"] == m for r in mine)]:
            rs = [r for r in mine if r["method"] == m]
            ok = [r for r in rs if cell_number(r, "psnr") is not None]
            failed = len(rs) - len(ok)
            if not ok:
                L.append(f"| {QUALITIES[q]} | {m} | failed on {failed} of {len(rs)} | | | | | |")
                continue

            def gain(against: str) -> str:
                if m == against:
                    return "–"
                d = [cell_number(r, "psnr") - ref[against][r["image"]] for r in ok if ref[against].get(r["image"]) is not None]
                return f"{np.mean(d):+.2f}" if d else "–"

            cells = [fmt(float(np.mean([cell_number(r, "psnr") for r in ok])), ".2f"),
                     fmt(float(np.mean([cell_number(r, "ssim") for r in ok])), ".3f"), gain("decoded"), gain("qcs_tv"),
                     str(int(np.mean([float(r["nfe"] or 0) for r in ok]))),
                     fmt(float(np.mean([float(r["seconds"]) for r in ok])), ".1f")]
            label = LABELS[m] + (f" (failed on {failed} of {len(rs)})" if failed else "")
            L.append(f"| {QUALITIES[q]} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(L)


def jpeg_doc_table(folder: Path, link: str) -> str:
    """The table from a committed run folder (results.csv, summary.md's header) with its source line."""
    rows, h, name = committed_rows(folder, RESULTS.file, RESULTS.columns, ("psnr", "ssim", "nfe"),
                                   lambda r: r["quality"] in QUALITIES and r["method"] in METHODS)
    return jpeg_table(rows) + "\n\n" + source_note(name, link, h, h.get("images", "?"))

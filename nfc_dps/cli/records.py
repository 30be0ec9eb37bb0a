"""The records a ``restore`` run keeps in its output folder: manifest.json (the finished images,
each with its key and outputs: a rerun skips them), results.csv (one row per image) and
summary.json (counts, mean metrics, failures, every row), all written atomically."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import io as nio
from ..config import package_versions
from .common import Log
from .outputs import OutputError

MANIFEST = "manifest.json"
RESULTS_CSV = "results.csv"
SUMMARY_JSON = "summary.json"
RESULT_FIELDS = ["index", "name", "status", "output", "seed", "psnr", "ssim", "nfe", "seconds",
                 "size", "alpha", "error"]


def outputs_ok(out: Path, entry: dict[str, Any], main_output: str) -> bool:
    """The manifest entry's outputs exist and open, and its main image is ``main_output``."""
    if entry.get("outputs", [None])[0] != main_output:
        return False
    for rel in entry["outputs"]:
        p = out / rel
        if not p.is_file():
            return False
        if p.suffix.lower() in nio.IMAGE_EXTENSIONS and not nio.image_opens(p):
            return False
    return bool(entry.get("outputs"))


class RunRecords:
    """manifest.json, results.csv and summary.json of the run in ``out``.

    ``about``: the run's settings, in summary.json after "command" and "complete" (input, output,
    task, method, ...); ``std_png_scale``: recorded when std maps are written (else None);
    ``overwrite``: start from an empty manifest. ``images`` maps an input's name to its manifest
    entry; ``rows`` are the results rows (done, skipped or failed), in any order.
    """

    def __init__(self, out: Path, log: Log, about: dict[str, Any], std_png_scale: float | None,
                 overwrite: bool) -> None:
        self.out, self.log, self.about, self.std_png_scale = out, log, about, std_png_scale
        self.t0 = time.perf_counter()
        self.manifest_path = out / MANIFEST
        self.manifest = self._load_manifest(overwrite)
        self.rows: list[dict[str, Any]] = []
        self._next_save = 0.0

    @property
    def images(self) -> dict[str, Any]:
        return self.manifest["images"]

    def _load_manifest(self, overwrite: bool) -> dict[str, Any]:
        empty = {"kind": "nfc_dps.manifest", "images": {}}
        if overwrite or not self.manifest_path.is_file():
            return empty
        try:
            data = json.loads(self.manifest_path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
                raise ValueError("no 'images' mapping")
        except (OSError, ValueError) as e:
            self.log.error(f"warning: ignoring unreadable {self.manifest_path} ({e}); redoing every image")
            return empty
        for name, entry in list(data["images"].items()):
            outputs = entry.get("outputs") if isinstance(entry, dict) else None
            if not (isinstance(outputs, list) and outputs and all(isinstance(o, str) for o in outputs)):
                self.log.error(f"warning: {self.manifest_path}: ignoring entry {name!r} (not a record of finished "
                               f"outputs: {type(entry).__name__}); redoing that image")
                del data["images"][name]
        return data

    def save(self, final: bool = False) -> None:
        """Rewrite manifest, results.csv and summary.json (atomically). Their size grows with the
        folder, so between images they are rewritten only when the last rewrite cost < 5% of the
        time since: a crash then redoes at most a few images (same seeds, same results)."""
        now = time.perf_counter()
        if not final and now < self._next_save:
            return
        try:
            self.write(final)
        except OSError as e:
            raise OutputError(e) from e
        self._next_save = time.perf_counter() + 20 * (time.perf_counter() - now)

    def write(self, final: bool) -> None:
        """manifest.json, results.csv, summary.json; an OSError (full disk) propagates naming the file."""
        nio.write_json(self.manifest_path, self.manifest)
        rows = sorted(self.rows, key=lambda r: (r["index"] if isinstance(r["index"], int) else 1 << 30, r["name"]))
        nio.write_csv(self.out / RESULTS_CSV, rows, RESULT_FIELDS)
        nio.write_json(self.out / SUMMARY_JSON, self.summary(rows, final))

    def summary(self, rows: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        """summary.json's content for the sorted ``rows``; ``final``: the run has finished."""
        done = [r for r in rows if r["status"] in ("done", "skipped")]
        failed = [r for r in rows if r["status"] == "failed"]

        def mean(key):
            vals = [r[key] for r in done if isinstance(r.get(key), float) and math.isfinite(r[key])]
            return float(np.mean(vals)) if vals else None

        alpha = [f"{r['name']}: {r['alpha']}" for r in rows if r.get("alpha")]
        return {
            "command": "restore", "complete": final,
            **self.about,
            "counts": {"images": len(rows), "restored": sum(r["status"] == "done" for r in rows),
                       "skipped_done_before": sum(r["status"] == "skipped" for r in rows),
                       "failed": len(failed)},
            "mean_psnr": mean("psnr"), "mean_ssim": mean("ssim"),
            "metrics_images": sum(isinstance(r.get("psnr"), float) for r in done),
            "failures": [{"name": r["name"], "error": r["error"]} for r in failed],
            "problems": [{"name": r["name"], "error": r["error"]} for r in done if r.get("error")],
            "alpha": alpha,
            "seconds": round(time.perf_counter() - self.t0, 3),
            "std_png_scale": self.std_png_scale,
            "versions": package_versions(),
            "images": rows,
        }

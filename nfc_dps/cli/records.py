"""The records a ``restore`` run keeps in its output folder: manifest.json (the finished images,
each with its key and outputs: a rerun skips them), results.csv (one row per image) and
summary.json (counts, mean metrics, failures, every row), all written atomically.

Under ``torchrun`` each rank restores its share of the files and keeps its progress in
``.shards/rank<r>.json`` (the manifest entries of its files and its rows); at the end rank 0
merges every shard into the three files and removes the shards. A run killed before that leaves
its shards: the next run merges them into manifest.json first (:func:`merge_leftover_shards`), so
what was finished is skipped.

Before its first image a run lists its output stems under ``unfinished`` in manifest.json, and the
last save keeps only those of images left without an entry whose files remain: files of these
names are a run's own even when it was killed before its manifest listed them. What the folder
records (:func:`earlier_runs`) decides which files a run may replace."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .. import io as nio
from ..run_record import package_versions
from .common import RESOLVED_JSON, Log, UsageError
from .outputs import OutputError, existing_files

MANIFEST = "manifest.json"
RESULTS_CSV = "results.csv"
SUMMARY_JSON = "summary.json"
SHARD_DIR = ".shards"
#: manifest.json's list of the output stems of images a run started and no entry lists yet
UNFINISHED = "unfinished"
#: the files of a run's records (a restore output folder's own, beside the images)
RECORD_FILES = (MANIFEST, RESULTS_CSV, SUMMARY_JSON, RESOLVED_JSON)
#: the subfolders that hold outputs named after an image's stem
STEM_FOLDERS = ("std", "samples", "kernels")
RESULT_FIELDS = ["index", "name", "status", "output", "seed", "psnr", "ssim", "scored", "nfe", "seconds",
                 "size", "extent", "alpha", "noise_sigma", "noise", "error"]


def scored_regions(rows: list[dict[str, Any]]) -> str | None:
    """Which region the PSNR / SSIM of ``rows`` scored: 'whole image', 'measured frame' (a valid-boundary
    blur's restoration without its band beyond the frame), 'mixed', or None when none was scored."""
    kinds = {"measured frame" if str(r.get("scored", "")).startswith("measured frame") else "whole image"
             for r in rows if isinstance(r.get("psnr"), float)}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


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


def finished_outputs(entry: Any) -> list[str] | None:
    """A manifest entry's outputs (paths relative to the folder, the main image first), or None
    when the entry is not a record of finished outputs."""
    outputs = entry.get("outputs") if isinstance(entry, dict) else None
    ok = isinstance(outputs, list) and outputs and all(isinstance(o, str) for o in outputs)
    return outputs if ok else None


def recorded_stems(out: Path) -> dict[str, str]:
    """Input name -> the stem of the main output that ``out``'s manifest.json records for it, where
    that output still exists (an unreadable manifest records none: :class:`RunRecords` then says so
    and redoes every image)."""
    try:
        images = json.loads((out / MANIFEST).read_text()).get("images")
    except (OSError, ValueError, AttributeError):
        return {}
    stems = {}
    for name, entry in (images.items() if isinstance(images, dict) else ()):
        outputs = finished_outputs(entry)
        if outputs and "/" not in outputs[0] and (out / outputs[0]).is_file():  # a name whose output is gone is free
            stems[name] = Path(outputs[0]).stem
    return stems


def stem_candidates(rel: str) -> list[str]:
    """The output stems whose image may have written ``rel`` (a path relative to the output folder):
    <s>.png, <s>_lower.png, <s>_upper.png, std/<s>.png|.npy, kernels/<s>.npy|.png, samples/<s>_<j>.png."""
    path = PurePosixPath(rel)
    stem, folder = path.stem, str(path.parent)
    if folder == "samples":
        m = re.fullmatch(r"(.+)_\d+", stem)
        return [m.group(1)] if m else []
    if folder in ("std", "kernels"):
        return [stem]
    if folder != ".":
        return []
    return [stem] + [stem[:-len(end)] for end in ("_lower", "_upper") if stem.endswith(end) and len(stem) > len(end)]


def output_kind(rel: str, stem: str) -> str:
    """What ``rel`` is of the image whose output stem is ``stem``, in words."""
    if rel.casefold() == f"{stem}.png".casefold():
        return "restoration"
    for end in ("lower", "upper"):
        if rel.casefold() == f"{stem}_{end}.png".casefold():
            return f"{end} interval bound"
    return {"std": "std map", "samples": "sample", "kernels": "estimated kernel"}.get(str(PurePosixPath(rel).parent),
                                                                                     "output")


@dataclass
class EarlierRuns:
    """What earlier ``restore`` runs recorded in an output folder (:func:`earlier_runs`).

    ``known``: the folder holds a restore run's records (a manifest, or resolved_config.json of
    restore); ``unreadable``: its manifest.json cannot be read, so which file is whose is not
    known; ``entries``: the inputs the manifest has an entry for (``unlisted``: those whose entry
    lists no outputs, so which files are theirs is not known); ``owners``: each output a
    finished entry lists (in lower case) -> (its input, what it is of it); ``unfinished``: the
    output stems (in lower case) of images a run started and no entry lists."""

    known: bool = False
    unreadable: bool = False
    entries: set[str] = field(default_factory=set)
    unlisted: set[str] = field(default_factory=set)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    unfinished: set[str] = field(default_factory=set)

    def wrote(self, rel: str) -> bool:
        """An earlier restore run wrote ``rel`` (relative to the folder), as far as its records tell."""
        if self.known and self.unreadable:
            return True
        key = rel.casefold()
        if key in self.owners or (self.known and key in {f.casefold() for f in RECORD_FILES}):
            return True
        return any(s.casefold() in self.unfinished for s in stem_candidates(rel))


def _read_json(path: Path) -> Any:
    """``path``'s JSON; None when it does not exist, ValueError when it cannot be read as JSON."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(str(e)) from e


def _stems(value: Any) -> list[str]:
    """The stems of a manifest's ``unfinished`` (nothing for another type)."""
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def earlier_runs(out: Path) -> EarlierRuns:
    """What the records of earlier restore runs in ``out`` say (see :class:`EarlierRuns`)."""
    runs = EarlierRuns()
    try:
        config = _read_json(out / RESOLVED_JSON)
    except ValueError:
        config = None
    runs.known = isinstance(config, dict) and config.get("command") == "restore"
    runs.known |= (out / SHARD_DIR).is_dir() and any((out / SHARD_DIR).glob("rank*.json"))
    try:
        manifest = _read_json(out / MANIFEST)
    except ValueError:
        manifest = []
    if manifest is None:
        return runs
    images = manifest.get("images") if isinstance(manifest, dict) else None
    if not isinstance(images, dict):
        runs.unreadable = True
        return runs
    runs.known = True
    runs.unfinished = {s.casefold() for s in _stems(manifest.get(UNFINISHED))}
    for name, entry in images.items():
        runs.entries.add(name)
        outputs = finished_outputs(entry)
        if not outputs:
            runs.unlisted.add(name)
        stem = PurePosixPath(outputs[0]).stem if outputs else ""
        for rel in outputs or ():
            runs.owners.setdefault(rel.casefold(), (name, output_kind(rel, stem)))
    return runs


class RunRecords:
    """manifest.json, results.csv and summary.json of the run in ``out``.

    ``about``: the run's settings, in summary.json after "command" and "complete" (input, output,
    task, method, ...); ``std_png_scale``: recorded when std maps are written (else None);
    ``overwrite``: redo every image (the restore loop skips none); the manifest's entries stay until
    each image is redone, so an interrupted ``--overwrite`` run loses no output name. ``images``
    maps an input's name to its manifest entry; ``rows`` are the results rows (done, skipped or failed), in any order. ``shard``: this
    rank's number under torchrun, its progress then goes to ``.shards/rank<shard>.json`` and
    :meth:`merge_shards` (rank 0) writes the folder's files; ``shard_names``: the inputs it owns.
    """

    def __init__(self, out: Path, log: Log, about: dict[str, Any], std_png_scale: float | None,
                 overwrite: bool, shard: int | None = None, shard_names: list[str] | None = None) -> None:
        self.out, self.log, self.about, self.std_png_scale = out, log, about, std_png_scale
        self.t0 = time.perf_counter()
        self.manifest_path = out / MANIFEST
        self.overwrite = overwrite
        self.manifest = self._load_manifest()
        self.rows: list[dict[str, Any]] = []
        self._next_save = 0.0
        self.shard, self.shard_names = shard, list(shard_names or [])

    @property
    def images(self) -> dict[str, Any]:
        return self.manifest["images"]

    def _load_manifest(self) -> dict[str, Any]:
        empty = {"kind": "nfc_dps.manifest", "images": {}}
        if not self.manifest_path.is_file():
            return empty
        try:
            data = json.loads(self.manifest_path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
                raise ValueError("no 'images' mapping")
        except (OSError, ValueError) as e:
            self.log.error(f"warning: ignoring unreadable {self.manifest_path} ({e}); redoing every image")
            return empty
        for name, entry in list(data["images"].items()):
            if finished_outputs(entry) is None:
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

    def forget_before_replacing(self, name: str, key: str) -> list[str]:
        """Before the outputs of input ``name`` are written for a run whose resume key is ``key``:
        an entry of other settings leaves the manifest on disk now (not at the next throttled save),
        so a run killed while it replaces those outputs is never taken for the earlier one. Returns
        the outputs the earlier entry listed (for :meth:`remove_unlisted`)."""
        earlier = self.images.get(name)
        outputs = finished_outputs(earlier) or []
        if earlier is not None and earlier.get("key") != key:
            del self.images[name]
            try:
                self.write_manifest()
            except OSError as e:
                raise OutputError(e) from e
        return list(outputs)

    def remove_unlisted(self, earlier: list[str], outputs: list[str], keep: set[str] = frozenset()) -> None:
        """Remove the files an earlier entry listed (std maps, samples) that the new outputs of the
        same image do not: a rerun with fewer or no samples leaves no stale ones beside its own.
        ``keep``: the run's own output names (another input may own a name an earlier entry listed)."""
        for rel in set(earlier) - set(outputs) - set(keep):
            path = self.out / rel
            if self.out.resolve() in path.resolve().parents and path.is_file():  # only files inside the folder
                path.unlink()

    def begin(self, stems: list[str]) -> None:
        """Before the first image (rank 0): add the run's output ``stems`` to the manifest's
        ``unfinished`` and write manifest.json, so what a run killed before its next save wrote is
        known as its own. OSError propagates."""
        held = _stems(self.manifest.get(UNFINISHED))
        self.manifest[UNFINISHED] = sorted(set(held) | set(stems))
        nio.write_json(self.manifest_path, self.manifest)

    def _settle_unfinished(self) -> None:
        """At the end of a run: ``unfinished`` keeps the stems that no entry lists and whose files remain."""
        held = _stems(self.manifest.pop(UNFINISHED, None))
        if not held:
            return
        listed = {PurePosixPath(o[0]).stem.casefold() for o in map(finished_outputs, self.images.values()) if o}
        try:
            files = existing_files(self.out, STEM_FOLDERS).values()
        except UsageError:  # the folder cannot be listed: keep every stem
            files, listed = [f"{s}.png" for s in held], set()
        present = {s.casefold() for rel in files for s in stem_candidates(rel)}
        keep = [s for s in held if s.casefold() not in listed and s.casefold() in present]
        if keep:
            self.manifest[UNFINISHED] = keep

    def write_manifest(self) -> None:
        """manifest.json alone (or this rank's shard file): what a rerun trusts; OSError propagates."""
        if self.shard is not None:
            self.write(final=False)
        else:
            nio.write_json(self.manifest_path, self.manifest)

    def write(self, final: bool) -> None:
        """manifest.json, results.csv, summary.json (or this rank's shard file); an OSError (full
        disk) propagates naming the file."""
        if self.shard is not None:
            mine = {n: self.images[n] for n in self.shard_names if n in self.images}
            nio.write_json(shard_path(self.out, self.shard), {"names": self.shard_names, "images": mine,
                                                              "rows": self.rows})
            return
        if final:
            self._settle_unfinished()
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
            "scored": scored_regions(done),
            "failures": [{"name": r["name"], "error": r["error"]} for r in failed],
            "problems": [{"name": r["name"], "error": r["error"]} for r in done if r.get("error")],
            "alpha": alpha,
            "seconds": round(time.perf_counter() - self.t0, 3),
            "std_png_scale": self.std_png_scale,
            "versions": package_versions(),
            "images": rows,
        }

    def merge_shards(self, world: int) -> None:
        """Rank 0, after every rank saved its shard: fold the shards' entries and rows into this
        record, write manifest.json, results.csv and summary.json, and remove the shard files."""
        self.shard = None
        self.rows = []
        for rank in range(world):
            data = read_shard(self.out, rank)
            if data is None:
                raise UsageError(f"{shard_path(self.out, rank)} is missing or unreadable: rank {rank} did not finish; "
                                 f"rerun the same command to resume")
            _fold(self.images, data)
            self.rows += data["rows"]
        self.save(final=True)
        for rank in range(world):
            shard_path(self.out, rank).unlink(missing_ok=True)
        _remove_empty(self.out / SHARD_DIR)


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` when it is empty (the shards' folder once merged)."""
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty, or already gone


def shard_path(out: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its progress."""
    return out / SHARD_DIR / f"rank{rank}.json"


def read_shard(out: Path, rank: int) -> dict[str, Any] | None:
    """Rank ``rank``'s shard (see :func:`_read_shard_file`)."""
    return _read_shard_file(shard_path(out, rank))


def _read_shard_file(path: Path) -> dict[str, Any] | None:
    """A shard file's content, or None when it is missing or unreadable (a rank killed mid-write
    leaves the previous, complete version: writes are atomic)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("names"), list) and isinstance(data.get("images"), dict)
    return data if ok else None


def _fold(images: dict[str, Any], shard: dict[str, Any]) -> None:
    """Apply a shard to manifest entries: its names take the shard's entry, or none if it has none."""
    for name in shard["names"]:
        if name in shard["images"]:
            images[name] = shard["images"][name]
        else:
            images.pop(name, None)


def merge_leftover_shards(out: Path, log: Log) -> int:
    """Fold the shards a killed sharded run left in ``out`` into manifest.json and remove them;
    returns how many were merged (0: nothing to do)."""
    folder = out / SHARD_DIR
    files = sorted(folder.glob("rank*.json")) if folder.is_dir() else []
    if not files:
        return 0
    manifest_path = out / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    except (OSError, ValueError):
        manifest = {}
    if not isinstance(manifest, dict) or not isinstance(manifest.get("images"), dict):
        manifest = {"kind": "nfc_dps.manifest", "images": {}}
    merged = 0
    for f in files:
        data = _read_shard_file(f)
        if data is not None:
            _fold(manifest["images"], data)
            merged += 1
        else:
            log.error(f"warning: ignoring unreadable {f} (its images are redone)")
    try:
        nio.write_json(manifest_path, manifest)
        for f in files:
            f.unlink(missing_ok=True)
    except OSError as e:
        raise OutputError(e) from e
    _remove_empty(folder)
    log.info(f"merged the progress of {merged} rank(s) of an interrupted sharded run into {manifest_path}")
    return merged

"""The tables of docs/scale.md, from the JSON files of scripts/restore_scale.py and
scripts/restore_throughput.py (``nfc-dps bench report`` regenerates them with every other table)."""

from __future__ import annotations

import json
from pathlib import Path

from .spec import TASK_LABELS


def _rows(path: Path, keys: tuple[str, ...]) -> list[dict]:
    """The ``rows`` of a JSON result file, each checked for ``keys`` (an error names the file and the key)."""
    rows = json.loads(Path(path).read_text()).get("rows")
    if not rows:
        raise ValueError(f"{path}: no result rows")
    for i, r in enumerate(rows):
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"{path}: row {i} has no {', '.join(missing)}")
    return rows


def _source(path: Path, link: str) -> str:
    return f"Source: [`{Path(path).name}`]({link}{Path(path).name})."


def scale_table(path: Path, link: str) -> str:
    """Per size and task: seconds per NFE, one bare network call, peak and base resident memory (MB)
    and the peak above the base per megapixel."""
    rows = _rows(path, ("size", "task", "s_per_nfe", "forward_s", "peak_mb", "base_mb", "megapixels"))
    L = ["| size | task | s / NFE | forward s | peak MB | base MB | peak − base per megapixel |",
         "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_mp = (r["peak_mb"] - r["base_mb"]) / r["megapixels"]
        L.append(f"| {r['size']}² | {TASK_LABELS.get(r['task'], r['task'])} | {r['s_per_nfe']:.1f} | "
                 f"{r['forward_s']:.1f} | {r['peak_mb']:.0f} | {r['base_mb']:.0f} | {per_mp:.0f} |")
    return "\n".join([*L, "", _source(path, link)])


def throughput_table(path: Path, link: str) -> str:
    """Per ``--batch-size``: seconds for the folder, images per second (and its ratio to the first row),
    the mean PSNR and the largest pixel difference to the first row's outputs."""
    rows = _rows(path, ("batch_size", "images", "seconds", "images_per_s", "mean_psnr", "max_abs_diff_vs_first"))
    n = rows[0]["images"]
    L = [f"| `--batch-size` | seconds for {n} images | images / s | against the first row | mean PSNR "
         "| max pixel difference to the first row |", "|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rows):
        ratio = r["images_per_s"] / rows[0]["images_per_s"]
        diff = "–" if i == 0 else ("0 (8-bit outputs)" if r["max_abs_diff_vs_first"] == 0 else
                                   f"{r['max_abs_diff_vs_first']:.3g}")
        L.append(f"| {r['batch_size']} | {r['seconds']:.1f} | {r['images_per_s']:.2f} | {ratio:.2f}× | "
                 f"{r['mean_psnr']:.2f} dB | {diff} |")
    return "\n".join([*L, "", _source(path, link)])

"""The CSV logs of a ``train-prior`` work folder (loss.csv, heldout.csv): a row appended per log
step, and the rows past the last save dropped when a run resumes."""

from __future__ import annotations

import csv
from pathlib import Path

from .. import io as nio


def keep_rows(path: Path, upto: int) -> None:
    """Drop rows logged after step ``upto`` (a run killed after its last save logged them)."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    kept = [rows[0]] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= upto]
    if len(kept) != len(rows):
        nio.atomic_write_text(path, "".join(",".join(r) + "\n" for r in kept))


def append_row(path: Path, header: list[str], row: list) -> None:
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(header)
        w.writerow(row)


def logged(path: Path, step: int) -> bool:
    """Whether the log at ``path`` holds a row of ``step`` (False where it cannot be read)."""
    try:
        with open(path, newline="") as f:
            return str(step) in [row.get("step") for row in csv.DictReader(f)]
    except OSError:
        return False

"""What the held-out tiers' tables share: a run folder's summary header (:func:`read_header`), its
committed rows checked line by line (:func:`committed_rows`), the source line under a docs table
(:func:`source_note`), the summary file a tier writes (:func:`write_summary`) and a row's number
(:func:`cell_number`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

from ..io import atomic_write_text
from .tables import load_results


def read_header(path: Path) -> dict[str, str]:
    """The ``- **key**: value`` (or ``- key: value``) lines of a summary file; {} if there is none."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"- (?:\*\*)?([^*:]+?)(?:\*\*)?: (.*)$", line)
        if m:
            out.setdefault(m.group(1).strip(), m.group(2).strip())
    return out


def committed_rows(folder: Path, file: str, columns: Sequence[str], numeric: Sequence[str],
                   valid: Callable[[dict[str, str]], bool] = lambda row: True) -> tuple[list[dict[str, str]], dict[str, str], str]:
    """A held-out tier's committed run folder: the rows of its result ``file`` (each one's ``numeric``
    cells parse where not empty and ``valid`` holds, else a ValueError naming the line), the header of
    its summary.md and the markdown link text of the file (``[`FOLDER/FILE`](``, closed by the caller's
    link prefix). FileNotFoundError naming the file where there is none."""
    path = folder / file
    if not path.is_file():
        raise FileNotFoundError(f"result file {path} not found (table sources: nfc_dps/bench/report.py)")
    rows = load_results(path)
    for i, r in enumerate(rows, start=2):
        try:
            [float(r[c]) for c in numeric if r[c] != ""]
            if not valid(r):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}, line {i}: malformed row (columns {', '.join(columns)})") from None
    return rows, read_header(folder / "summary.md"), f"{folder.name}/{file}"


def source_note(name: str, link: str, header: dict[str, str], *details: str) -> str:
    """A table's source line: the committed file ``name`` linked under ``link``, ``details``, the machine
    and the date of the run (from its summary header)."""
    parts = [f"Source: [`{name}`]({link}{name})", *details, header.get("machine", "?"),
             f"measured {header.get('date', '?')[:10]}"]
    return "; ".join(parts) + "."


def write_summary(out: Path, title: str, header: dict[str, Any], *tables: str) -> None:
    """A tier's summary.md: its title, the header's ``- key: value`` lines and its tables."""
    lines = [f"- {k}: {v}" for k, v in header.items()]
    atomic_write_text(out / "summary.md", f"# {title}\n\n" + "\n".join(lines) + "\n\n"
                      + "\n\n".join(t for t in tables if t) + "\n")


def cell_number(row: dict[str, str], column: str) -> float | None:
    """A result row's number in ``column``; None where it is empty or NaN (a failed image)."""
    value = str(row.get(column, ""))
    return None if value in ("", "nan") else float(value)

"""Atomic writes and result records.

Every write goes to a temporary file in the destination folder, then ``os.replace``: a run
killed mid-write leaves either the old file or the new one, never a torn one. Its stray temporary
file (``.<name>.<random>.nfc-dps-tmp``) is removed by :func:`remove_stale_temp_files`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

#: suffix of the temporary files of atomic writes
TEMP_SUFFIX = ".nfc-dps-tmp"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then os.replace).

    An OSError (full disk, quota, read-only folder) leaves any old file as it was and carries
    ``path`` as its ``filename``, so its message names the file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    except OSError as e:
        if e.errno is None:
            raise
        raise _naming(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None:
            raise _naming(e, path) from e
        raise
    return path


def _naming(e: OSError, path: Path) -> OSError:
    """The same error (same errno, so the same OSError subclass) with ``path`` as its file name."""
    return OSError(e.errno, e.strerror, str(path))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``text`` as UTF-8; a file name that is not valid UTF-8 in it (surrogate escapes) is written
    as its escape sequence (``caf\\udce9.png``), so the file stays valid UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite_json(obj: Any) -> Any:
    """NaN/Inf -> None, so the file stays strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomic, indented, strict JSON (NaN/Inf written as null)."""
    text = json.dumps(_finite_json(obj), indent=2, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


#: a text cell starting with one of these is a formula to a spreadsheet (CSV injection, OWASP)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell: floats with 4 decimals, None and NaN/Inf empty, and text that a
    spreadsheet would run as a formula (a file named ``=cmd.png``) prefixed with a single quote."""
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else ""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_csv(path: str | Path, rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]) -> Path:
    """Atomic CSV with a header, each value a :func:`csv_cell`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fieldnames), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return atomic_write_text(path, buf.getvalue())



def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete temporary files that an interrupted atomic write left in ``folder`` (recursively)."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.rglob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def weights_only_refusal(error: BaseException) -> str:
    """What a weights-only ``torch.load`` refused, in nfc-dps' words: the Python object the file
    pickles ("it pickles the Python object __main__.Payload"), not torch's advice to load it with
    ``weights_only=False`` (which would run the file's code), and no terminal escape codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it pickles the Python object {found.group(1)}"
    found = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    if found:
        return found.group(1).strip().rstrip(".")
    lines = [line.strip() for line in text.splitlines() if line.strip() and "weights_only" not in line
             and "Weights only load failed" not in line]
    return lines[0] if lines else type(error).__name__

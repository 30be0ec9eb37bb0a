"""The output folder of a run: created and checked writable (not an input folder), locked for one
run at a time (:func:`folder_lock`), output names that never collide (:func:`output_stems`), no
file replaced that no earlier nfc-dps run recorded (:func:`refuse_unrecorded`), and the errors of a
disk that cannot take more data (:class:`OutputError`)."""

from __future__ import annotations

import contextlib
import io
import os
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .. import io as nio
from .. import locking
from .common import UsageError


def _resolved(path: Path, flag: str) -> Path:
    """``path`` made absolute with its links followed; UsageError naming ``flag`` for a link loop."""
    try:
        return path.expanduser().resolve()
    except (RuntimeError, OSError) as e:  # a symbolic-link loop
        raise UsageError(f"{flag} {path}: cannot follow its symbolic links ({e})") from e


def check_output_folder(output: Path, inputs: Sequence[tuple[str, Path]], writes: Sequence[str] = ()) -> Path:
    """Create the output folder and check it is writable and apart from what the run reads (exit 2
    otherwise). ``inputs``: (flag, path) of each file or folder read, e.g. ("--input", p);
    ``writes``: the subfolders of the output folder the run writes into (e.g. "std", "samples").

    Refused: a folder read that is the output folder, or that is or lies in one of ``writes``; a
    file read that lies directly in the output folder or anywhere in ``writes``. Either could be
    replaced by the run's own outputs. An output folder inside an input folder, or one that holds
    an input elsewhere, is fine: inputs are read from a folder's top level only."""
    out = _resolved(output, "--output")
    written = [out / w for w in writes]
    for flag, inp in inputs:
        path = _resolved(inp, flag)
        folder = path if path.is_dir() else path.parent
        inside = next((w for w in written if folder == w or w in folder.parents), None)
        if folder == out or inside is not None:
            what = "folder" if path.is_dir() else "file"
            where = f"the output folder --output {output}" if inside is None else \
                f"{inside.relative_to(out)}/ of the output folder --output {output}, which this command writes"
            verb = "is" if path.is_dir() and inside is None else "lies in"
            raise UsageError(f"{flag} {inp} ({what}) {verb} {where}; choose an output folder apart from it (its "
                             f"outputs could overwrite what {flag} reads)")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {output} exists and is not a folder")
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        _CREATED.extend(missing)
        _write_probe(out)
    except OSError as e:
        raise UsageError(f"--output {output} is not writable: {e.strerror or e}") from e
    return out


def _write_probe(folder: Path) -> None:
    """Write and remove an empty file in ``folder``: OSError where the command could not write."""
    nio.atomic_write_bytes(folder / f".write-test-{os.getpid()}", b"").unlink()


def check_output_file(path: Path, flag: str) -> None:
    """Refuse (exit 2) a file the command writes at its end that is a folder or cannot be written,
    before the work starts: its folder is created and a probe file written there and removed."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder; name the file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_probe(path.parent)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write ({e.strerror or e})") from e


#: folders :func:`check_output_folder` created in this process (deepest first)
_CREATED: list[Path] = []


def forget_created() -> None:
    """A new command starts: the folders earlier commands of this process created are theirs."""
    _CREATED.clear()


def remove_created_if_empty() -> None:
    """After a refused run: remove the folders :func:`check_output_folder` created that are still
    empty, so a usage error leaves the disk as it was."""
    for folder in _CREATED:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty folder goes
    _CREATED.clear()


@contextlib.contextmanager
def _busy_refused(lock: contextlib.AbstractContextManager):
    """Hold ``lock``, refusing it with a :class:`UsageError` (exit 2) when another run holds it."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(lock)
        except locking.FolderBusy as e:
            raise UsageError(str(e)) from None
        yield


def folder_lock(folder: Path) -> contextlib.AbstractContextManager:
    """:func:`nfc_dps.locking.folder_lock`, refusing a busy folder with a :class:`UsageError` (exit 2)."""
    return _busy_refused(locking.folder_lock(folder))


def file_lock(path: Path) -> contextlib.AbstractContextManager:
    """:func:`nfc_dps.locking.file_lock`, refusing a file another run is writing with a :class:`UsageError`."""
    return _busy_refused(locking.file_lock(path))


def cannot_write(e: OSError) -> str:
    """One line naming the file that could not be written, and why."""
    return f"cannot write {e.filename or 'an output file'}: {e.strerror or e}"


@contextlib.contextmanager
def run_lock(folder: Path, dist):
    """:func:`folder_lock` for a whole torchrun group (``dist``: a :class:`~nfc_dps.distributed.Dist`):
    rank 0 takes the lock and tells the other ranks whether it got it, so a second run is refused
    on every rank alike. Rank 0 holds it until its block ends (after the ranks' final barrier)."""
    if dist.world == 1:
        with folder_lock(folder):
            yield
        return
    with contextlib.ExitStack() as stack:
        error = None
        if dist.rank == 0:
            try:
                stack.enter_context(folder_lock(folder))
            except UsageError as e:
                error = str(e)
        error = dist.broadcast(error)
        if error is not None:
            raise UsageError(error)
        yield


class OutputError(Exception):
    """An output cannot be written for a reason that will not go away with the next image (full
    disk, quota, read-only folder): the run stops, keeping what is done."""

    def __init__(self, error: OSError) -> None:
        self.error = error
        super().__init__(cannot_write(error))


def npy_bytes(a: np.ndarray) -> bytes:
    """``a`` as the bytes of a .npy file (no pickled objects)."""
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def output_stems(paths: Sequence[Path], names: Sequence[str] | None = None,
                 earlier: dict[str, str] | None = None) -> list[str]:
    """Output name stem per input: its stem, or stem_ext (extension in lower case) where inputs
    share a stem (a.png, a.jpg -> a_png, a_jpg). Names are compared ignoring letter case, so an
    output folder also works on case-insensitive disks; inputs whose output names would still
    coincide (a.png and a.PNG; a_png.png beside a.png and a.jpg) are a UsageError naming both:
    no output is ever written twice.

    ``earlier`` maps input names (``names``, one per path) to the stems that earlier runs into the
    same folder gave them: an input keeps its stem, and no input takes another's, so adding a
    file never renames an output nor overwrites one (a.png restored as a.png, then a.jpg added:
    a.jpg becomes a_jpg)."""
    names = [p.name for p in paths] if names is None else list(names)
    earlier = dict(earlier or {})
    held = {stem.casefold(): name for name, stem in earlier.items()}
    counts = Counter(p.stem.casefold() for p in paths)
    stems = []
    for p, name in zip(paths, names):
        if name in earlier:
            stems.append(earlier[name])
            continue
        with_ext = f"{p.stem}_{p.suffix.lstrip('.').lower()}"
        plain = p.stem if counts[p.stem.casefold()] == 1 else with_ext
        stems.append(with_ext if held.get(plain.casefold(), name) != name else plain)
    owner: dict[str, Path] = {}
    for p, name, stem in zip(paths, names, stems):
        first = owner.setdefault(stem.casefold(), p)
        if first is not p:
            raise UsageError(f"{first} and {p} would both be written as {stem}.png (output names ignore letter "
                             f"case); rename one of them")
        other = held.get(stem.casefold(), name)
        if other != name:
            raise UsageError(f"{p} would be written as {stem}.png, which an earlier run wrote for {other}; rename "
                             f"it, or use another --output")
    return stems


def existing_files(out: Path, subfolders: Sequence[str] = ()) -> dict[str, str]:
    """The entries at the top level of ``out`` and of each of its ``subfolders``: their paths
    relative to ``out`` ('/'-separated), keyed by the same in lower case (as a case-insensitive
    disk compares them). UsageError naming a folder that cannot be listed."""
    found: dict[str, str] = {}
    for sub in ("", *subfolders):
        folder = out / sub if sub else out
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    rel = f"{sub}/{entry.name}" if sub else entry.name
                    found.setdefault(rel.casefold(), rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise UsageError(f"--output {folder}: cannot list the folder ({e.strerror or e})") from e
    return found


def refuse_unrecorded(output: Path, out: Path, planned: Iterable[str], recorded: Callable[[str], bool],
                      subfolders: Sequence[str] = ()) -> None:
    """Before any work: a UsageError (exit 2) naming the first file of ``planned`` (paths relative to
    ``out``, the folder ``output`` resolved) that exists and that ``recorded`` says no earlier
    nfc-dps run into the folder wrote; the run would replace it. ``--overwrite`` is the way to
    replace such files."""
    present = existing_files(out, subfolders)
    found = [present[key] for key in dict.fromkeys(p.casefold() for p in planned)
             if key in present and not recorded(present[key])]
    if found:
        more = f" (and {len(found) - 1} more such file(s))" if len(found) > 1 else ""
        raise UsageError(f"--output {output} holds {output / found[0]}{more}, which this run would replace and which "
                         f"no earlier nfc-dps run into that folder wrote; nothing was written: choose another "
                         f"--output folder, or pass --overwrite to replace such files")

"""One run per folder: :func:`folder_lock`, an exclusive lock that the kernel frees when its
holder dies, for every command that writes a folder (restore, simulate, demo, train-prior); one
run per output file: :func:`file_lock` (calibrate's --out)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

#: the lock file inside a locked folder
LOCK_FILE = ".nfc_dps.lock"


class FolderBusy(RuntimeError):
    """The folder is being written by another run, or its lock cannot be taken (the message says which)."""


@contextlib.contextmanager
def folder_lock(folder: Path):
    """One run per folder: an exclusive ``fcntl.flock`` on ``folder/.nfc_dps.lock``, held until the
    block ends. The kernel releases it when the process dies (crash, kill -9), so a lock file left
    behind is free again and no liveness guess is made; two runs that find the same file race for
    the flock, which exactly one wins. The file holds the holder's pid for the refusal's message.
    The holder removes the file before it lets go; a run that locked a file just removed (its
    path now names another file, or none) retries on the new one."""
    with _exclusive(folder / LOCK_FILE, folder):
        yield


@contextlib.contextmanager
def file_lock(path: Path):
    """One run per output file: :func:`folder_lock`'s lock on ``.<name>.lock`` beside ``path``
    (a run writing another file of the folder is not held back)."""
    with _exclusive(path.parent / f".{path.name}.lock", path):
        yield


@contextlib.contextmanager
def _exclusive(lock: Path, target: Path):
    """The exclusive flock on the file ``lock`` for the run writing ``target`` (a folder or a file)."""
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as e:
            raise FolderBusy(f"cannot create the lock file {lock}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            try:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            except OSError:
                pid = ""
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise FolderBusy(f"cannot lock {lock}: {e.strerror or e}") from e
            who = f"another nfc-dps run (pid {pid})" if pid.isdigit() else "another nfc-dps run"
            raise FolderBusy(f"{who} is writing to {target}; wait for it to finish") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed the file after we opened it: lock the new one
    else:
        raise FolderBusy(f"cannot lock {target}: {lock} keeps being replaced")
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as e:
            raise FolderBusy(f"cannot write the lock file {lock}: {e.strerror or e}") from e
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # still holding the flock: a run that opened this file sees it is gone
        os.close(fd)

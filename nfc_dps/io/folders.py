"""Listing the images of a folder, and saying why the other entries are not inputs."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Sequence

from .images import IMAGE_EXTENSIONS


def list_folder(folder: str | Path) -> tuple[list[Path], list[Path]]:
    """(images, others) of a folder's non-hidden entries, each list sorted by name.

    ``images`` are regular files (or links to them) with a supported extension
    (:data:`IMAGE_EXTENSIONS`, any case). ``others`` are what a user may have meant as an input
    but cannot be read as one: files of other types, broken symbolic links, folders named like
    images (``x.png/``) and special files; :func:`unusable_reason` says why. Other subfolders
    are not inputs and are left out.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder")
    images, others = [], []
    for p in sorted(folder.iterdir(), key=lambda q: q.name):
        if p.name.startswith("."):
            continue
        if p.is_file():
            (images if p.suffix.lower() in IMAGE_EXTENSIONS else others).append(p)
        elif not p.is_dir() or p.suffix.lower() in IMAGE_EXTENSIONS:  # broken link, special file, x.png/
            others.append(p)
    return images, others


def scan_images(folder: str | Path, exclude: Sequence[Path] = ()) -> tuple[list[Path], list[Path]]:
    """(images, others) under ``folder``, recursively, sorted by relative path.

    Hidden files and folders are skipped, and so are the folders in ``exclude`` (e.g. a work or
    output folder inside it). ``others`` are files of other types.
    """
    folder, skip = Path(folder), [p.resolve() for p in exclude]
    images, others = [], []
    for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).as_posix()):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        try:
            rp = p.resolve()
        except (RuntimeError, OSError):  # a symbolic-link loop: not an image, said as such
            others.append(p)
            continue
        if any(rp == s or s in rp.parents for s in skip) or p.is_dir():
            continue
        (images if p.suffix.lower() in IMAGE_EXTENSIONS else others).append(p)
    return images, others


def images_in_subfolders(folder: str | Path, exclude: Sequence[Path] = ()) -> int:
    """How many image files lie in ``folder``'s non-hidden subfolders (which :func:`list_folder`
    leaves out), not counting those under ``exclude`` (e.g. an output folder inside it)."""
    folder = Path(folder)
    return sum(len(p.relative_to(folder).parts) > 1 for p in scan_images(folder, exclude)[0])


def unusable_reason(path: str | Path) -> str:
    """Why ``path`` (one of :func:`list_folder`'s ``others``) is not an input image."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            path.resolve(strict=True)
        except RuntimeError:
            return f"symbolic link in a loop (it points to {target}, which leads back to itself)"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"symbolic link in a loop (it points to {target}, which leads back to itself)"
        return f"broken symbolic link (its target {target} does not exist)"
    if path.is_dir():
        return "is a folder, not an image file"
    if not path.is_file():
        return "not a regular file (a pipe, socket or device)"
    return (f"unsupported file type {path.suffix or '(no extension)'!r}; "
            f"supported: {', '.join(IMAGE_EXTENSIONS)}")


def list_images(folder: str | Path) -> list[Path]:
    """The folder's image files (supported extensions, not hidden), sorted by file name."""
    return list_folder(folder)[0]


"""What every subcommand shares: exit codes and file names, :class:`UsageError` (exit 2), the
log, the device / threads / prior set-up, the per-image seeds, array layout and metrics, and the
one-line reason of a failed image."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import io as nio
from ..locking import LOCK_FILE  # noqa: F401 - the lock file's name, for the CLI's users and tests
from ..metrics import restoration_metrics
from ..priors.base import Prior
from ..priors.default import load_prior, prior_identity
from ..restore_inputs import MeasurementRangeError, as_batch, stable_seed

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143

RESOLVED_JSON = "resolved_config.json"
SIMULATION_JSON = "simulation.json"
#: gray value 1.0 of a std-map PNG is a posterior std of 1 / STD_PNG_SCALE
STD_PNG_SCALE = 4.0
#: OSError numbers that mean the output disk cannot take more data: the run stops (exit 2)
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
#: default of --max-batch: chains per sampler call
DEFAULT_MAX_BATCH = 4
#: the most posterior samples per image (--samples K): the std of K samples is known to about
#: 1 / sqrt(2 K) of itself, and each sample is a whole chain of network calls
MAX_SAMPLES = 10_000


class UsageError(Exception):
    """A problem with the command line or the setup: exit 2 with a message, no traceback."""


class Log:
    """Messages on stderr through tqdm (so progress bars stay intact); ``quiet`` silences info only;
    ``results=False`` also a run's final result line (a torchrun rank other than 0)."""

    def __init__(self, quiet: bool, results: bool = True) -> None:
        self.quiet, self.results = quiet, results

    def info(self, msg: str) -> None:
        if not self.quiet:
            from tqdm.auto import tqdm

            tqdm.write(msg, file=sys.stderr)

    def result(self, msg: str) -> None:
        """A run's final line (counts, mean PSNR): shown with --quiet too."""
        if self.results:
            from tqdm.auto import tqdm

            tqdm.write(msg, file=sys.stderr)

    def error(self, msg: str) -> None:
        from tqdm.auto import tqdm

        tqdm.write(msg, file=sys.stderr)


def check_samples(samples: int, config: Any) -> None:
    """UsageError stating the cost when ``--samples`` exceeds :data:`MAX_SAMPLES` (before any work:
    such a run takes hours per image, or more memory than the machine has)."""
    if samples > MAX_SAMPLES:
        nfe = int(getattr(config, "nfe", 1) or 1)
        raise UsageError(f"--samples {samples}: that many chains of {nfe} network calls each is {samples * nfe:,} "
                         f"network calls per image; at most {MAX_SAMPLES:,} samples (the std of K samples is "
                         f"known to about 1/sqrt(2K) of itself: a few hundred already pin it down)")


def check_restarts(restarts: int, config: Any) -> None:
    """UsageError stating the cost when ``--restarts`` exceeds :data:`MAX_SAMPLES`, as ``--samples``
    (before any work: every restart is a whole chain)."""
    if restarts > MAX_SAMPLES:
        nfe = int(getattr(config, "nfe", 1) or 1)
        raise UsageError(f"--restarts {restarts}: that many chains of {nfe} network calls each is "
                         f"{restarts * nfe:,} network calls per image; at most {MAX_SAMPLES:,} restarts (a few keep "
                         f"the chain that fits best; more rarely find a better one)")


def parse_device(name: str | None):
    """The torch device of ``--device`` (None: CPU); UsageError when it is not available here."""
    import torch

    if not name:
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"--device {name!r}: not a torch device ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UsageError(f"--device {name}: MPS is not available on this machine (use --device cpu)")
    return dev


def set_threads(n: int | None) -> None:
    """``--threads``: torch's CPU threads (None keeps torch's choice)."""
    if n is not None:
        import torch

        if n < 1:
            raise UsageError(f"--threads must be >= 1, got {n}")
        torch.set_num_threads(n)


#: ``--prior module:function``: a Python factory that returns a Prior
PRIOR_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def prior_factory(path: str | None) -> tuple[str, str] | None:
    """(module, function) when --prior names a factory ``module:function`` (and no file or folder
    of that name exists), else None."""
    if not path or not PRIOR_FACTORY.match(path) or Path(path).exists():
        return None
    module, function = path.split(":")
    return module, function


@contextlib.contextmanager
def _cwd_importable():
    """The current folder on sys.path for the duration (``nfc-dps`` scripts do not put it there)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _load_factory_prior(path: str, device, precision: str) -> Any:
    """The Prior that ``module:function`` returns (called with no arguments), moved to ``device``."""
    import importlib

    module, function = prior_factory(path)  # type: ignore[misc]
    if precision != "auto":
        raise UsageError(f"--precision {precision}: applies to prior folders; the prior of --prior {path} runs in "
                         f"the precision its factory gives it")
    try:
        with _cwd_importable():
            factory = getattr(importlib.import_module(module), function)
        prior = factory()
    except SystemExit as e:  # sys.exit() or argparse in the user's code: said as such, not a silent exit
        raise UsageError(f"cannot load the prior factory {path}: it called sys.exit({e.code!r}) (a factory must "
                         f"return a Prior)") from e
    except Exception as e:  # noqa: BLE001 - the user's module: any error (SyntaxError too) is named, not a traceback
        raise UsageError(f"cannot load the prior factory {path}: {type(e).__name__}: {e}") from e
    if not isinstance(prior, Prior):
        raise UsageError(f"--prior {path} returned {type(prior).__name__}, not a nfc_dps Prior (wrap a denoiser in "
                         f"nfc_dps.priors.DenoiserPrior)")
    return prior.to(device)


def open_prior(path: str | None, device, precision: str = "auto") -> Any:
    """The prior of --prior: a diffusers folder, a factory ``module:function`` (a module importable
    from the current folder or the Python path, whose function returns a Prior), or None: the
    embedded default; UsageError naming it when it does not load."""
    if prior_factory(path):
        return _load_factory_prior(path, device, precision)  # type: ignore[arg-type]
    try:
        prior = load_prior(path, device=device, precision=precision)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        where = path or "the embedded default prior"
        raise UsageError(f"cannot load {where}: {e}") from e
    return prior  # restore() pads images to the prior's size multiple itself


def prior_key(path: str | None) -> dict[str, Any]:
    """What identifies the prior's weights for resume checks: its resolved folder and each file's
    size and time (:func:`nfc_dps.priors.default.prior_identity`; no file is read); for a factory
    ``module:function``, that name and its module's source file (files its function reads are not
    tracked)."""
    named = prior_factory(path)
    if named:
        import importlib.util

        try:
            with _cwd_importable():
                spec = importlib.util.find_spec(named[0])
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin) if spec is not None and spec.origin and Path(spec.origin).is_file() else None
        stat = origin.stat() if origin else None
        return {"path": path, "files": {str(origin.resolve()): [stat.st_size, stat.st_mtime_ns]} if origin else {}}
    info = prior_identity(path)
    return {"path": info["resolved"], "files": info["files"]}


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of ``obj`` as sorted-key JSON (values JSON cannot hold as str)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def match_file(folder: Path, name: str, extensions: Sequence[str]) -> Path | None:
    """The file in ``folder`` for input ``name``: the same name, else the same stem with one of
    ``extensions`` (in that order of preference)."""
    exact = folder / name
    if exact.is_file():
        return exact
    stem = Path(name).stem
    for ext in extensions:
        for cand in (folder / f"{stem}{ext}", folder / f"{stem}{ext.upper()}"):
            if cand.is_file():
                return cand
    return None


def to_numpy(t) -> np.ndarray:
    """Image 0 of a (B, C, h, w) tensor as a float32 (h, w) or (h, w, C) array."""
    a = t.detach().float().cpu()[0].permute(1, 2, 0).numpy()
    return np.ascontiguousarray(a[..., 0] if a.shape[-1] == 1 else a)


def image_metrics(x: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """PSNR (dB) and SSIM (NaN under 7 px) of float32 (h, w[, C]) images in [0, 1], both clipped,
    with :func:`nfc_dps.metrics.restoration_metrics` (scikit-image conventions)."""
    m = restoration_metrics(as_batch(x)[0], as_batch(np.clip(gt, 0, 1))[0])
    return m["psnr"], (m["ssim"] if m["ssim"] is not None else float("nan"))


def read_inputs(flag: str, inp: Path) -> tuple[list[Path], list[Path]]:
    """(images, others) of the file or folder given as ``flag`` (:func:`nfc_dps.io.list_folder`
    for a folder); UsageError naming it when it cannot be read."""
    if not inp.is_dir():
        return ([inp], []) if inp.suffix.lower() in nio.IMAGE_EXTENSIONS else ([], [inp])
    try:
        return nio.list_folder(inp)
    except OSError as e:
        raise UsageError(f"{flag} {inp}: cannot read the folder ({e.strerror or e})") from e


def check_readable_folder(flag: str, folder: Path) -> None:
    """UsageError naming ``flag`` when ``folder`` is not a folder whose entries can be listed and
    opened (read and search permission)."""
    try:
        is_dir = folder.is_dir()
        if is_dir:
            os.stat(os.path.join(folder, os.curdir))  # needs search permission: the entries' files open
            next(folder.iterdir(), None)
    except OSError as e:
        raise UsageError(f"{flag} {folder}: cannot read the folder ({e.strerror or e})") from e
    if not is_dir:
        raise UsageError(f"{flag} {folder}: not a folder")


def check_input(flag: str, path: Path) -> None:
    """UsageError naming ``flag`` when ``path`` does not exist, lies in a folder that cannot be
    searched, or is a folder that cannot be read (:func:`check_readable_folder`)."""
    try:
        is_dir = stat.S_ISDIR(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise UsageError(f"{flag} {path}: no such file or folder") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{flag} {path}: no such file (a symbolic link in a loop)") from e
        raise UsageError(f"{flag} {path}: cannot read it ({e.strerror or e}; check the permissions of the folder "
                         f"{path.parent})") from e
    if is_dir:
        check_readable_folder(flag, path)


def input_names(images: Sequence[Path], inp: Path) -> list[str]:
    """Each input's name as its seed and records use it: the path relative to the input folder,
    '/'-separated (the file name when the input is one file)."""
    return [p.relative_to(inp).as_posix() if inp.is_dir() else p.name for p in images]


def image_seed(seed: int, name: str) -> int:
    """The seed of input image ``name`` (its path relative to the input folder, '/'-separated) in
    a run with base seed ``seed``: see :data:`nfc_dps.config.PER_IMAGE_SEED`."""
    return stable_seed(int(seed), name)


def noise_seed(seed: int) -> int:
    """The noise seed of an image whose operator seed is ``seed`` (an independent stream)."""
    return int(np.random.SeedSequence([int(seed), 0x5EED]).generate_state(1, dtype=np.uint32)[0])


def failure_reason(e: BaseException) -> str:
    """The one-line reason reported for an image that failed with ``e``."""
    if isinstance(e, nio.ImageReadError):
        return e.reason
    if isinstance(e, FloatingPointError):
        return f"NaN/Inf in the restoration, not saved ({e})"
    if isinstance(e, MeasurementRangeError):  # the command line's flags, not the API's arguments
        return e.cli_reason()
    if isinstance(e, (ValueError, OSError)):
        return str(e)
    return f"{type(e).__name__}: {e}"

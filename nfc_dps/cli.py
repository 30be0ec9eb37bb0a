"""The ``nfc-dps`` command line (also ``python -m nfc_dps``).

    nfc-dps demo                                   # 2 held-out photos x 3 tasks, grid + metrics
    nfc-dps simulate --input clean/ --output sim/ --config configs/deblur_gaussian.yaml
    nfc-dps restore --config sim/simulation.json --output out/         # inputs + GT from sim/
    nfc-dps restore --input y/ --output out/ --task sr_bicubic --gt gt/ --samples 4
    nfc-dps convert-adm ffhq_10m.pt priors/ffhq --preset ffhq256
    nfc-dps train-prior --workdir runs/mine --images photos/ --minutes 60 --export priors/mine
    nfc-dps bench --protocol local                 # nfc_dps.bench (docs/benchmarks.md)

Exit status: 0 all images done; 1 some image failed (each is reported with its file name and the
reason; the others are still restored); 2 usage or setup error (bad flag or config, unreadable
prior, output folder equal to the input or not writable), reported before any work starts, or an
output disk that fills up (the run stops naming the file; finished images are kept); 130
interrupted.

``restore`` treats every input image as the measurement y (for SR the output is ``factor`` times
larger). Each image's seed is a hash of ``--seed`` and its file name (:func:`image_seed`), never
its position in the folder, so adding or removing files changes no other result, a rerun gives
identical images and resumes: images recorded as done in ``manifest.json`` whose outputs still
open are skipped (``--overwrite`` redoes them). Every file is written atomically; a full disk
stops the run with exit 2 naming the file, keeping what is done. See ``restore --help`` for the
output layout.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import io as nio
from .config import (
    DEFAULT_NOISE_SIGMA,
    KIND_SIMULATION,
    PER_IMAGE_SEED,
    ConfigBundle,
    ConfigError,
    SamplerSpec,
    TaskConfig,
    load_config,
    package_versions,
    parse_scalar,
    parse_task,
    resolved_config,
    steps_field,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

MANIFEST = "manifest.json"
RESULTS_CSV = "results.csv"
SUMMARY_JSON = "summary.json"
RESOLVED_JSON = "resolved_config.json"
SIMULATION_JSON = "simulation.json"
LOCK_FILE = ".nfc_dps.lock"
#: gray value 1.0 of a std-map PNG is a posterior std of 1 / STD_PNG_SCALE
STD_PNG_SCALE = 4.0
#: tasks whose operator is drawn at random: restoring real data needs the actual mask / kernel
RANDOM_TASKS = {"inpaint_box": "--mask", "inpaint_random": "--mask", "deblur_motion": "--kernel"}
#: tasks whose operator is read from a file: task -> (its parameter, the flag that sets it, what it is)
FILE_TASKS = {"inpaint_mask": ("mask_path", "--mask", "mask"), "deblur_kernel": ("kernel_path", "--kernel", "kernel")}
#: OSError numbers that mean the output disk cannot take more data: the run stops (exit 2)
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
#: default of --max-batch: chains per sampler call
DEFAULT_MAX_BATCH = 4

RESULT_FIELDS = ["index", "name", "status", "output", "seed", "psnr", "ssim", "nfe", "seconds",
                 "size", "alpha", "error"]


class UsageError(Exception):
    """A problem with the command line or the setup: exit 2 with a message, no traceback."""


class _Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def info(self, msg: str) -> None:
        if not self.quiet:
            from tqdm.auto import tqdm

            tqdm.write(msg, file=sys.stderr)

    def error(self, msg: str) -> None:
        from tqdm.auto import tqdm

        tqdm.write(msg, file=sys.stderr)


# --------------------------------------------------------------------------------------------
# shared setup


def _device(name: str | None):
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


def _threads(n: int | None) -> None:
    if n is not None:
        import torch

        if n < 1:
            raise UsageError(f"--threads must be >= 1, got {n}")
        torch.set_num_threads(n)


def _load_prior(path: str | None, device, precision: str = "auto") -> Any:
    from .priors.default import load_prior

    try:
        prior = load_prior(path, device=device, precision=precision)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        where = path or "the embedded default prior"
        raise UsageError(f"cannot load {where}: {e}") from e
    return prior  # restore() pads images to the prior's size multiple itself


def _prior_id(path: str | None) -> dict[str, Any]:
    """What identifies the prior's weights (folder, file sizes and times) for resume checks."""
    from .priors.default import default_prior_path

    folder = Path(path) if path else default_prior_path()
    files = {}
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                st = p.stat()
                files[str(p.relative_to(folder))] = [st.st_size, st.st_mtime_ns]
    return {"path": str(folder.resolve()), "files": files}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _check_output_folder(output: Path, inputs: Sequence[Path]) -> Path:
    """Create the output folder and check it is writable and not an input folder (exit 2 otherwise)."""
    out = output.expanduser().resolve()
    for inp in inputs:
        folder = inp.resolve() if inp.is_dir() else inp.resolve().parent
        if out == folder:
            raise UsageError(f"--output {output} is the input folder {inp}; choose another folder "
                             f"(outputs would mix with, and could overwrite, the inputs)")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {output} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = nio.atomic_write_bytes(out / f".write-test-{os.getpid()}", b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--output {output} is not writable: {e.strerror or e}") from e
    return out


@contextlib.contextmanager
def _folder_lock(folder: Path):
    """One run per output folder: a lock file holding our pid (stale after a crash: taken over)."""
    lock = folder / LOCK_FILE
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            alive = False
            if pid > 0 and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except PermissionError:
                    alive = True
            if alive:
                raise UsageError(f"another nfc-dps run (pid {pid}) is writing to {folder}; wait for it or "
                                 f"remove {lock} if it is gone") from None
            with contextlib.suppress(OSError):
                lock.unlink()
            continue
        except OSError as e:
            raise UsageError(f"cannot create the lock file {lock}: {e.strerror or e}") from e
        try:
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                lock.unlink()
            raise UsageError(f"cannot write the lock file {lock}: {e.strerror or e}") from e
        break
    else:
        raise UsageError(f"cannot lock {folder} (remove {lock})")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


def _match_file(folder: Path, name: str, extensions: Sequence[str]) -> Path | None:
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


def _to_batch(a: np.ndarray, device):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    t = t[None, None] if t.ndim == 2 else t.permute(2, 0, 1)[None]
    return t.to(device)


def _to_numpy(t) -> np.ndarray:
    a = t.detach().float().cpu()[0].permute(1, 2, 0).numpy()
    return np.ascontiguousarray(a[..., 0] if a.shape[-1] == 1 else a)


def _metrics(x: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """PSNR, SSIM of [0, 1] images (clipped) with nfc_dps.metrics (scikit-image conventions)."""
    import torch

    from .metrics import psnr, ssim

    a, b = (torch.from_numpy(np.clip(v, 0, 1).astype(np.float64)) for v in (x, gt))
    a, b = ((v[None, None] if v.ndim == 2 else v.permute(2, 0, 1)[None]) for v in (a, b))
    p = float(psnr(a, b)[0])
    s = float(ssim(a, b)[0]) if min(a.shape[-2:]) >= 7 else float("nan")
    return p, s


# --------------------------------------------------------------------------------------------
# task resolution shared by restore and simulate


def _resolve_task(args, bundle: ConfigBundle) -> TaskConfig:
    task = bundle.task
    if args.task:
        task = task.with_params(task=args.task) if task is not None else parse_task({"task": args.task}, "--task")
    if task is None:
        raise UsageError("no task: pass --task NAME or --config FILE with 'task: NAME' "
                         "(see configs/*.yaml)")
    params = dict(task.params)
    for item in args.param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        params[key.strip()] = parse_scalar(value)
    noise = task.noise_sigma if args.noise_sigma is None else args.noise_sigma
    if not (isinstance(noise, float) and math.isfinite(noise) and noise >= 0):
        raise UsageError(f"--noise-sigma must be a finite number >= 0 ([0, 1] pixel units), got {noise}")
    source = "--param" if args.param else task.source
    return parse_task({"task": task.task, **params, "noise_sigma": float(noise)}, source)


def _resolve_sampler(args, bundle: ConfigBundle) -> SamplerSpec:
    spec = bundle.sampler
    if getattr(args, "method", None):
        if args.method != spec.method:
            spec = SamplerSpec(method=args.method, preset=spec.preset)
        spec.provenance["method"] = "--method"
    if getattr(args, "preset", None):
        spec.preset = args.preset
        spec.provenance["preset"] = "--preset"
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE (e.g. --set num_levels=10 or --set band.cutoff_start=0.5)")
        spec.set(key.strip(), parse_scalar(value), "--set")
    if getattr(args, "steps", None) is not None:
        name = steps_field(spec.method)
        if name is None:
            raise UsageError(f"--steps is not supported for method {spec.method!r}; use --set FIELD=N")
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {args.steps}")
        spec.set(name, int(args.steps), "--steps")
    spec.build()  # validates: ConfigError names the file / flag and the key
    return spec


class _OperatorSource:
    """Builds the operator of each image: per-image mask / kernel files when the task's
    ``mask_path`` / ``kernel_path`` is a folder, else one file or none."""

    def __init__(self, task: TaskConfig) -> None:
        self.task = task
        self.key = next((k for k in ("mask_path", "kernel_path") if k in task.params), None)
        self.folder = Path(task.params[self.key]) if self.key and Path(task.params[self.key]).is_dir() else None

    def factor(self) -> int:
        return int(self.task.params.get("factor", 4)) if self.task.task.startswith("sr_") else 1

    def files_for(self, name: str) -> Path | None:
        if self.key is None:
            return None
        if self.folder is None:
            return Path(self.task.params[self.key])
        exts = (".npy", ".png", ".tif", ".tiff", ".bmp", ".jpg", ".jpeg")
        found = _match_file(self.folder, name, exts)
        if found is None:
            what = "mask" if self.key == "mask_path" else "kernel"
            raise ValueError(f"no {what} for {name} in {self.folder} (looked for {Path(name).stem}.*)")
        return found

    def build(self, name: str, image_hw: tuple[int, int], seed: int = 0):
        path = self.files_for(name)
        params = dict(self.task.params)
        if path is not None:
            params[self.key] = str(path)
        from .operators import build_operator

        return build_operator(self.task.task, image_size=image_hw, seed=seed, **params), path


def _check_operator_file(task: TaskConfig, flag_value: str | None) -> None:
    """For inpaint_mask / deblur_kernel: the mask / kernel is given and, when it is one file (not
    a folder of per-image files), loads. UsageError naming the flag (or config key) and the file."""
    if task.task not in FILE_TASKS:
        return
    key, flag, what = FILE_TASKS[task.task]
    value = task.params.get(key)
    if not value:
        raise UsageError(f"task {task.task!r} reads its {what} from a file: pass {flag} FILE|DIR "
                         f"(or {key} in the task config)")
    where = flag if flag_value else f"{task.source}: {key}"
    path = Path(value)
    if not path.exists():
        raise UsageError(f"{where} {path}: no such file or folder")
    if path.is_dir():
        return  # per-image files: each is checked, and reported by name, with its image
    from .operators import load_kernel, load_mask

    try:
        (load_mask if key == "mask_path" else load_kernel)(path)
    except (ValueError, TypeError, OSError) as e:
        raise UsageError(f"{where}: {e}") from e


def image_seed(seed: int, name: str) -> int:
    """The seed of input image ``name`` (its path relative to the input folder, '/'-separated) in
    a run with base seed ``seed``: see :data:`nfc_dps.config.PER_IMAGE_SEED`."""
    from .api import stable_seed

    return stable_seed(int(seed), name)


# --------------------------------------------------------------------------------------------
# restore


@dataclass
class _Item:
    index: int
    path: Path
    name: str
    out_stem: str
    seed: int
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Job:
    """An image to restore: its measurement y ((h, w[, C]) in [0, 1]), operator and manifest key.
    Jobs of one ``group`` (measurement shape, operator file) can share a restore() call."""

    item: _Item
    row: dict[str, Any]
    key: str
    y: np.ndarray
    info: nio.ImageInfo
    operator: Any
    group: tuple


def _output_stems(paths: Sequence[Path]) -> list[str]:
    """Output name stem per input: its stem, or stem_ext (extension in lower case) where inputs
    share a stem (a.png, a.jpg -> a_png, a_jpg). Names are compared ignoring letter case, so an
    output folder also works on case-insensitive disks; inputs whose output names would still
    coincide (a.png and a.PNG; a_png.png beside a.png and a.jpg) are a UsageError naming both:
    no output is ever written twice."""
    counts = Counter(p.stem.casefold() for p in paths)
    stems = [f"{p.stem}_{p.suffix.lstrip('.').lower()}" if counts[p.stem.casefold()] > 1 else p.stem for p in paths]
    owner: dict[str, Path] = {}
    for p, stem in zip(paths, stems):
        first = owner.setdefault(stem.casefold(), p)
        if first is not p:
            raise UsageError(f"{first} and {p} would both be written as {stem}.png (output names ignore letter "
                             f"case); rename one of them")
    return stems


def _outputs_ok(out: Path, entry: dict[str, Any], main_output: str) -> bool:
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


def cmd_restore(args) -> int:
    log = _Log(args.quiet)
    configs = list(args.config or [])
    inp = Path(args.input) if args.input else None
    if inp is not None and inp.is_dir() and (inp / SIMULATION_JSON).is_file():
        # the output folder of `nfc-dps simulate`: its record first, its measurements as input
        configs.insert(0, inp / SIMULATION_JSON)
        inp = None
    bundle = load_config(configs)
    sim = bundle.simulation
    if sim is not None and bundle.task is not None and isinstance(sim.get("task"), dict):
        recorded = parse_task(sim["task"], f"{bundle.simulation_dir / SIMULATION_JSON} (task)", bundle.simulation_dir)
        simulated = (sim.get("simulated_task") or {}).get("task")
        requested = args.task or bundle.task.task
        if requested == simulated and requested != recorded.task:  # e.g. deblur_motion -> its kernel files
            log.info(f"using the operator recorded by the simulation ({recorded.task}, files in "
                     f"{bundle.simulation_dir}) for task {requested!r}")
            bundle.task = recorded
            args.task = None
    task = _resolve_task(args, bundle)
    gt_dir = Path(args.gt) if args.gt else None
    if inp is None and sim is not None:
        inp = bundle.simulation_dir / sim.get("measurements", "measurements")
        if gt_dir is None and sim.get("ground_truth"):
            gt_dir = bundle.simulation_dir / sim["ground_truth"]
    if inp is None:
        raise UsageError("--input is required (a measurement image or a folder of them)")
    if not inp.exists():
        raise UsageError(f"--input {inp}: no such file or folder")
    if gt_dir is not None and not gt_dir.is_dir():
        raise UsageError(f"--gt {gt_dir}: not a folder")

    # operator files from the flags replace the random / parametric operator of the task
    if args.kernel:
        if not task.task.startswith("deblur_"):
            raise UsageError(f"--kernel applies to deblurring tasks, not {task.task!r}")
        if not Path(args.kernel).exists():
            raise UsageError(f"--kernel {args.kernel}: no such file or folder")
        task = task.with_params(task="deblur_kernel", kernel_path=str(Path(args.kernel).resolve()))
    if args.mask:
        if not task.task.startswith("inpaint_"):
            raise UsageError(f"--mask applies to inpainting tasks, not {task.task!r}")
        if not Path(args.mask).exists():
            raise UsageError(f"--mask {args.mask}: no such file or folder")
        task = task.with_params(task="inpaint_mask", mask_path=str(Path(args.mask).resolve()))
    if task.task in RANDOM_TASKS:
        flag = RANDOM_TASKS[task.task]
        raise UsageError(f"task {task.task!r} draws its {'mask' if flag == '--mask' else 'kernel'} at random; "
                         f"restoring needs the one the measurements were taken with: pass {flag} FILE|DIR, "
                         f"or --config <simulate output>/{SIMULATION_JSON}")
    for key in ("mask_path", "kernel_path"):
        if key in task.params and not Path(task.params[key]).exists():
            raise UsageError(f"{task.source}: {key} {task.params[key]}: no such file or folder")
    _check_operator_file(task, args.mask if task.task == "inpaint_mask" else args.kernel)
    for flag, value in (("--max-batch", args.max_batch), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.max_batch is None:
        args.max_batch = max(DEFAULT_MAX_BATCH, args.batch_size)
    spec = _resolve_sampler(args, bundle)
    seed = args.seed if args.seed is not None else (bundle.seed or 0)
    samples = args.samples if args.samples is not None else (bundle.num_samples or 1)
    if seed < 0 or samples < 1:
        raise UsageError(f"--seed must be >= 0 and --samples >= 1, got {seed}, {samples}")
    if samples > 1 and getattr(spec.build(), "is_deterministic", False):
        raise UsageError(f"--samples {samples}: {spec.method}/{spec.resolved_preset} is deterministic (every sample "
                         f"would be the same); for posterior samples and a std map add --preset fast")
    out = _check_output_folder(Path(args.output), [inp] + ([gt_dir] if gt_dir else []))
    device = _device(args.device)
    _threads(args.threads)

    with _folder_lock(out):
        nio.remove_stale_temp_files(out)
        if inp.is_dir():
            images, others = nio.list_folder(inp)
        else:
            images, others = ([inp], []) if inp.suffix.lower() in nio.IMAGE_EXTENSIONS else ([], [inp])
        if not images and not others:
            raise UsageError(f"--input {inp}: no files to restore")
        stems = _output_stems(images)
        prior = _load_prior(args.prior, device, args.precision)
        cfg = spec.build()
        record = resolved_config(task, spec, seed, samples, prior=_prior_id(args.prior)["path"],
                                 command="restore", device=str(device), precision=prior.precision, inputs=str(inp.resolve()),
                                 ground_truth=str(gt_dir.resolve()) if gt_dir else None, batch_size=args.batch_size,
                                 max_batch=args.max_batch)
        try:
            nio.write_json(out / RESOLVED_JSON, record)
        except OSError as e:
            raise UsageError(_cannot_write(e)) from e
        run = _RestoreRun(args, log, task, spec, cfg, prior, device, seed, samples, out, inp, gt_dir)
        names = [p.relative_to(inp).as_posix() if inp.is_dir() else p.name for p in images]
        items = [_Item(i, p, names[i], stems[i], image_seed(seed, names[i])) for i, p in enumerate(images)]
        return run.run(items, others)


def _cannot_write(e: OSError) -> str:
    """One line naming the file that could not be written, and why."""
    return f"cannot write {e.filename or 'an output file'}: {e.strerror or e}"


class _OutputError(Exception):
    """An output cannot be written for a reason that will not go away with the next image (full
    disk, quota, read-only folder): the run stops, keeping what is done."""

    def __init__(self, error: OSError) -> None:
        self.error = error
        super().__init__(_cannot_write(error))


class _RestoreRun:
    def __init__(self, args, log, task, spec, cfg, prior, device, seed, samples, out, inp, gt_dir) -> None:
        self.args, self.log, self.task, self.spec, self.cfg = args, log, task, spec, cfg
        self.prior, self.device, self.seed, self.samples = prior, device, seed, samples
        self.out, self.inp, self.gt_dir = out, inp, gt_dir
        self.source = _OperatorSource(task)
        self.config_hash = _sha256_json({
            "task": task.as_dict(), "sampler": _record_sampler(spec, cfg), "samples": samples,
            "prior": _prior_id(args.prior), "bit_depth": args.bit_depth, "save_samples": args.save_samples,
        })
        self.manifest_path = out / MANIFEST
        self.manifest = self._load_manifest()
        self.rows: list[dict[str, Any]] = []
        self.batch_size, self.max_batch = args.batch_size, args.max_batch
        self.bar: Any = None
        self.t0 = time.perf_counter()
        self._next_save = 0.0

    # -- bookkeeping

    def _load_manifest(self) -> dict[str, Any]:
        empty = {"kind": "nfc_dps.manifest", "images": {}}
        if self.args.overwrite or not self.manifest_path.is_file():
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

    def _save(self, final: bool = False) -> None:
        """Rewrite manifest, results.csv and summary.json (atomically). Their size grows with the
        folder, so between images they are rewritten only when the last rewrite cost < 5% of the
        time since: a crash then redoes at most a few images (same seeds, same results)."""
        now = time.perf_counter()
        if not final and now < self._next_save:
            return
        try:
            self._write_records(final)
        except OSError as e:
            raise _OutputError(e) from e
        self._next_save = time.perf_counter() + 20 * (time.perf_counter() - now)

    def _write_records(self, final: bool) -> None:
        """manifest.json, results.csv, summary.json; an OSError (full disk) propagates naming the file."""
        nio.write_json(self.manifest_path, self.manifest)
        rows = sorted(self.rows, key=lambda r: (r["index"] if isinstance(r["index"], int) else 1 << 30, r["name"]))
        nio.write_csv(self.out / RESULTS_CSV, rows, RESULT_FIELDS)
        nio.write_json(self.out / SUMMARY_JSON, self._summary(rows, final))

    def _summary(self, rows, final: bool) -> dict[str, Any]:
        done = [r for r in rows if r["status"] in ("done", "skipped")]
        failed = [r for r in rows if r["status"] == "failed"]

        def mean(key):
            vals = [r[key] for r in done if isinstance(r.get(key), float) and math.isfinite(r[key])]
            return float(np.mean(vals)) if vals else None

        alpha = [f"{r['name']}: {r['alpha']}" for r in rows if r.get("alpha")]
        return {
            "command": "restore", "complete": final,
            "input": str(self.inp.resolve()), "output": str(self.out),
            "task": self.task.as_dict(), "method": self.spec.method, "preset": self.spec.resolved_preset,
            "noise_sigma": self.task.noise_sigma, "seed": self.seed,
            "per_image_seed": PER_IMAGE_SEED,
            "num_samples": self.samples,
            "counts": {"images": len(rows), "restored": sum(r["status"] == "done" for r in rows),
                       "skipped_done_before": sum(r["status"] == "skipped" for r in rows),
                       "failed": len(failed)},
            "mean_psnr": mean("psnr"), "mean_ssim": mean("ssim"),
            "metrics_images": sum(isinstance(r.get("psnr"), float) for r in done),
            "failures": [{"name": r["name"], "error": r["error"]} for r in failed],
            "problems": [{"name": r["name"], "error": r["error"]} for r in done if r.get("error")],
            "alpha": alpha,
            "seconds": round(time.perf_counter() - self.t0, 3),
            "std_png_scale": STD_PNG_SCALE if self.samples > 1 else None,
            "versions": package_versions(),
            "images": rows,
        }

    # -- the loop

    def _record(self, row: dict[str, Any]) -> None:
        """Add a finished image's row (done, skipped or failed) and report a failure or warning."""
        self.rows.append(row)
        self.bar.update(1)
        if row["status"] == "failed":
            self.log.error(f"FAILED {row['name']}: {row['error']}")
        elif row.get("error"):
            self.log.error(f"warning {row['name']}: {row['error']}")

    def run(self, items: list[_Item], others: list[Path]) -> int:
        from tqdm.auto import tqdm

        for p in others:
            self.rows.append({"index": "", "name": p.name, "status": "failed", "seed": "",
                              "error": nio.unusable_reason(p)})
            self.log.error(f"FAILED {p.name}: {self.rows[-1]['error']}")
        self.log.info(f"restoring {len(items)} image(s) from {self.inp} -> {self.out} "
                      f"[{self.task.task}, {self.spec.method}/{self.spec.resolved_preset}, noise_sigma={self.task.noise_sigma}, "
                      f"seed {self.seed} (per image: a hash of it and the file name)]")
        self.bar = tqdm(total=len(items), desc="images", unit="img", disable=self.args.quiet, dynamic_ncols=True)
        pending: dict[tuple, list[_Job]] = {}  # jobs waiting for a full batch, by (measurement shape, operator file)
        try:
            for item in items:
                self.bar.set_postfix_str(item.name, refresh=False)
                job = self._prepare(item)
                if isinstance(job, dict):
                    self._record(job)
                else:
                    group = pending.setdefault(job.group, [])
                    group.append(job)
                    if len(group) == self.batch_size:
                        self._restore_jobs(pending.pop(job.group))
                self._save()
            for group in pending.values():
                self._restore_jobs(group)
                self._save()
            self._save(final=True)
        except _OutputError as e:
            with contextlib.suppress(OSError):  # keep the records of what is done, if they still fit
                self._write_records(final=False)
            done = sum(r["status"] == "done" for r in self.rows)
            raise UsageError(f"{e}; stopped (the {done} image(s) restored so far are kept): free space and rerun "
                             f"the same command to resume") from e
        finally:
            self.bar.close()
        failed = [r for r in self.rows if r["status"] == "failed"]
        problems = [r for r in self.rows if r["status"] != "failed" and r.get("error")]
        summary = json.loads((self.out / SUMMARY_JSON).read_text())
        counts = summary["counts"]
        msg = (f"{counts['restored']} restored, {counts['skipped_done_before']} already done, "
               f"{counts['failed']} failed -> {self.out}")
        if summary["mean_psnr"] is not None:
            msg += f"; mean PSNR {summary['mean_psnr']:.2f} dB, SSIM {summary['mean_ssim'] or float('nan'):.4f} " \
                   f"over {summary['metrics_images']} image(s)"
        self.log.info(msg)
        return EXIT_FAILED if failed or problems else EXIT_OK

    def _prepare(self, item: _Item) -> dict[str, Any] | _Job:
        """The row of an image that needs no restoring (done before, or unusable), else its job:
        the measurement read and its operator built and checked."""
        row = {"index": item.index, "name": item.name, "status": "failed", "seed": item.seed,
               "output": f"{item.out_stem}.png"}
        try:
            input_sha = _sha256_file(item.path)
        except OSError as e:
            row["error"] = f"cannot read: {e.strerror or e}"
            return row
        try:
            op_file = self.source.files_for(item.name)
        except ValueError as e:
            row["error"] = str(e)
            return row
        key = _sha256_json([self.config_hash, input_sha, item.seed,
                            _sha256_file(op_file) if op_file is not None and op_file.is_file() else None])
        entry = self.manifest["images"].get(item.name)
        if entry and entry.get("key") == key and _outputs_ok(self.out, entry, row["output"]):
            row.update(status="skipped", nfe=entry.get("nfe"), seconds=entry.get("seconds"),
                       size=entry.get("size"), alpha=entry.get("alpha", ""))
            self._add_metrics(row, item)
            return row
        try:
            y, info = nio.read_image(item.path)
            factor = self.source.factor()
            h, w = y.shape[:2]
            operator, _ = self.source.build(item.name, (h * factor, w * factor))
            operator = operator.to(self.device)
            expected = tuple(operator.measurement_shape((1, 1, h * factor, w * factor))[-2:])
            if expected != (h, w):
                raise ValueError(f"measurement is {h}x{w} but the operator expects {expected[0]}x{expected[1]}")
        except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
            row["error"] = _reason(e)
            self.manifest["images"].pop(item.name, None)
            return row
        return _Job(item, row, key, y, info, operator, (y.shape, str(op_file) if op_file else None))

    def _restore_jobs(self, jobs: list[_Job]) -> None:
        """Restore same-sized images that share one operator in one restore() call (each image
        has its own seed, so the results are those of one call per image up to float rounding),
        write their outputs and record their rows. A failing call is retried image by image, so
        one bad image fails alone."""
        import torch

        from .api import restore

        try:
            res = restore(torch.cat([_to_batch(j.y, self.device) for j in jobs]), jobs[0].operator,
                          prior=self.prior, method=self.spec.method, sigma_y=self.task.noise_sigma,
                          seed=[j.item.seed for j in jobs], num_samples=self.samples,
                          progress=not self.args.quiet, config=self.cfg, max_batch=self.max_batch)
        except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise _OutputError(e) from e
            if len(jobs) > 1:
                for job in jobs:
                    self._restore_jobs([job])
                return
            self._record(self._failed(jobs[0], e))
            return
        for i, job in enumerate(jobs):
            try:
                entry = self._write_outputs(job, res, i, len(jobs))
            except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
                if isinstance(e, OSError) and e.errno in DISK_FULL:
                    raise _OutputError(e) from e
                self._record(self._failed(job, e))
                continue
            entry["key"] = job.key
            self.manifest["images"][job.item.name] = entry
            job.row["status"] = "done"
            self._add_metrics(job.row, job.item)
            self._record(job.row)

    def _failed(self, job: _Job, error: Exception) -> dict[str, Any]:
        job.row["error"] = _reason(error)
        self.manifest["images"].pop(job.item.name, None)
        return job.row

    def _write_outputs(self, job: _Job, res: Any, i: int, batch: int) -> dict[str, Any]:
        """Write image ``i`` of the restore() result ``res`` of ``batch`` images; its manifest entry."""
        item, row, info = job.item, job.row, job.info
        h, w = job.y.shape[:2]
        image = _to_numpy(res.image[i:i + 1])
        if not np.isfinite(image).all():
            raise FloatingPointError("restoration contains NaN/Inf; not saved")
        bit_depth = self.args.bit_depth or info.output_bit_depth
        same_size = image.shape[:2] == (h, w)
        alpha = info.alpha if (info.has_alpha and same_size) else None
        row["alpha"] = "" if not info.has_alpha else ("re-attached" if same_size else
                                                      "dropped (output size differs from the input)")
        outputs = [f"{item.out_stem}.png"]
        extra: list[tuple[str, Callable[[Path], Any]]] = []
        if res.std is not None:
            std = _to_numpy(res.std[i:i + 1])
            if not np.isfinite(std).all():
                raise FloatingPointError("posterior std contains NaN/Inf; not saved")
            std_map = np.sqrt(np.mean(std**2, axis=-1)) if std.ndim == 3 else std
            extra.append((f"std/{item.out_stem}.png", lambda p, m=std_map: nio.write_image(p, m * STD_PNG_SCALE, 16)))
            extra.append((f"std/{item.out_stem}.npy",
                          lambda p, s=std: nio.atomic_write_bytes(p, _npy_bytes(s.astype(np.float32)))))
            if self.args.save_samples:
                for j in range(self.samples):
                    a = _to_numpy(res.samples[j, i:i + 1])
                    extra.append((f"samples/{item.out_stem}_{j}.png",
                                  lambda p, a=a: nio.write_image(p, a, bit_depth, alpha)))
        # write the extras first: the main image appearing last marks a complete set
        for rel, write in extra:
            write(self.out / rel)
            outputs.append(rel)
        nio.write_image(self.out / f"{item.out_stem}.png", image, bit_depth, alpha)
        row.update(nfe=int(res.nfe), seconds=round(float(res.seconds) / batch, 3), size=f"{image.shape[0]}x{image.shape[1]}")
        return {"input": item.name, "outputs": outputs, "seed": item.seed, "nfe": int(res.nfe),
                "seconds": row["seconds"], "size": row["size"], "alpha": row["alpha"],
                "bit_depth": bit_depth, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def _add_metrics(self, row: dict[str, Any], item: _Item) -> None:
        if self.gt_dir is None:
            return
        gt_path = _match_file(self.gt_dir, item.name, nio.IMAGE_EXTENSIONS)
        if gt_path is None:
            row["error"] = f"no ground truth for {item.name} in {self.gt_dir}"
            return
        try:
            gt, _ = nio.read_image(gt_path)
            x, _ = nio.read_image(self.out / row["output"])
        except nio.ImageReadError as e:
            row["error"] = f"ground truth: {e}"
            return
        if gt.ndim == 3 and x.ndim == 2:
            gt = gt.mean(-1)
        if gt.shape != x.shape:
            row["error"] = f"ground truth {gt_path.name} is {gt.shape}, the restoration {x.shape}"
            return
        row["psnr"], row["ssim"] = _metrics(x, gt)


def _record_sampler(spec: SamplerSpec, cfg: Any) -> dict[str, Any]:
    import dataclasses

    body = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    return {"method": spec.method, "preset": spec.resolved_preset, **body}


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _reason(e: BaseException) -> str:
    if isinstance(e, nio.ImageReadError):
        return e.reason
    if isinstance(e, FloatingPointError):
        return f"NaN/Inf in the restoration, not saved ({e})"
    if isinstance(e, (ValueError, OSError)):
        return str(e)
    return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------
# simulate


def _restore_task_for(task: TaskConfig, has_kernel: bool, has_mask: bool) -> dict[str, Any]:
    """The task config that restores the simulated measurements exactly (kernels / masks from files)."""
    if has_kernel:
        return {"task": "deblur_kernel", "kernel_path": "kernels",
                "boundary": task.params.get("boundary", "circular"), "noise_sigma": task.noise_sigma}
    if has_mask:
        return {"task": "inpaint_mask", "mask_path": "masks", "noise_sigma": task.noise_sigma}
    return task.as_dict()


def noise_seed(seed: int) -> int:
    """The noise seed of an image whose operator seed is ``seed`` (an independent stream)."""
    return int(np.random.SeedSequence([int(seed), 0x5EED]).generate_state(1, dtype=np.uint32)[0])


def cmd_simulate(args) -> int:
    import torch

    log = _Log(args.quiet)
    bundle = load_config(args.config or [])
    task = _resolve_task(args, bundle)
    seed = args.seed if args.seed is not None else (bundle.seed or 0)
    if seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    inp = Path(args.input)
    if not inp.exists():
        raise UsageError(f"--input {inp}: no such file or folder")
    _check_operator_file(task, None)
    out = _check_output_folder(Path(args.output), [inp])
    source = _OperatorSource(task)
    factor = source.factor()
    with _folder_lock(out):
        nio.remove_stale_temp_files(out)
        images, others = nio.list_folder(inp) if inp.is_dir() else (([inp], []) if inp.suffix.lower() in nio.IMAGE_EXTENSIONS else ([], [inp]))
        if not images and not others:
            raise UsageError(f"--input {inp}: no files")
        stems = _output_stems(images)
        failures = [{"name": p.name, "error": nio.unusable_reason(p)} for p in others]
        records = []
        from tqdm.auto import tqdm

        any_kernel = any_mask = False
        for i, path in enumerate(tqdm(images, desc="simulate", unit="img", disable=args.quiet)):
            stem = stems[i]
            try:
                x, info = nio.read_image(path)
                h, w = x.shape[:2]
                ch, cw = h - h % factor, w - w % factor
                crop = None
                if (ch, cw) != (h, w):
                    top, left = (h - ch) // 2, (w - cw) // 2
                    x = x[top:top + ch, left:left + cw]
                    crop = [top, left, ch, cw]
                if min(ch, cw) < 1:
                    raise ValueError(f"image {h}x{w} is smaller than the SR factor {factor}")
                op, _ = source.build(path.name, (ch, cw), seed=seed + i)
                nseed = noise_seed(seed + i)
                y = op.measure(_to_batch(x, "cpu"), task.noise_sigma, torch.Generator().manual_seed(nseed))
                rec = {"index": i, "name": path.name, "measurement": f"measurements/{stem}.png",
                       "ground_truth": f"ground_truth/{stem}.png", "operator_seed": seed + i,
                       "noise_seed": nseed, "crop": crop, "alpha": "dropped" if info.has_alpha else ""}
                nio.write_image(out / rec["ground_truth"], x, info.output_bit_depth)
                nio.write_image(out / rec["measurement"], _to_numpy(y), args.bit_depth)
                kernel = getattr(op, "kernel", None)
                if kernel is not None:
                    k = kernel.detach().cpu().double().numpy()
                    k = k.reshape(k.shape[-2:])
                    nio.atomic_write_bytes(out / f"kernels/{stem}.npy", _npy_bytes(k))
                    nio.write_image(out / f"kernels/{stem}.png", k / k.max(), 16)  # a picture; the .npy is exact
                    rec["kernel"] = f"kernels/{stem}.npy"
                    any_kernel = True
                mask = getattr(op, "mask", None)
                if mask is not None:
                    m = mask.detach().cpu().numpy().reshape(mask.shape[-2:])
                    nio.write_image(out / f"masks/{stem}.png", m, 8)
                    rec["mask"] = f"masks/{stem}.png"
                    any_mask = True
                records.append(rec)
            except Exception as e:  # noqa: BLE001 - report, continue with the others
                failures.append({"name": path.name, "error": _reason(e)})
                log.error(f"FAILED {path.name}: {failures[-1]['error']}")
        sim = {
            "kind": KIND_SIMULATION,
            "task": _restore_task_for(task, any_kernel, any_mask),
            "simulated_task": task.as_dict(),
            "simulation_seed": seed,
            "operator_seed": "simulation_seed + index of the image in the sorted input list",
            "noise_seed": "nfc_dps.cli.noise_seed(simulation_seed + index): SeedSequence([s, 0x5EED]) -> torch.Generator seed",
            "measurements": "measurements", "ground_truth": "ground_truth",
            "units": f"noise_sigma in [0, 1] pixel units (default {DEFAULT_NOISE_SIGMA}); measurements are "
                     f"clipped to [0, 1] and stored as {args.bit_depth}-bit PNG",
            "images": records,
            "command": "simulate", "inputs": str(inp.resolve()),
            "versions": package_versions(),
        }
        if failures:
            sim["note"] = {"failures": failures}
        try:
            nio.write_json(out / SIMULATION_JSON, sim)
        except OSError as e:
            raise UsageError(_cannot_write(e)) from e
    log.info(f"simulated {len(records)} measurement(s) [{task.task}, noise_sigma={task.noise_sigma}] -> {out}\n"
             f"restore them with: nfc-dps restore --config {out / SIMULATION_JSON} --output RESULTS_DIR")
    return EXIT_FAILED if failures else EXIT_OK


# --------------------------------------------------------------------------------------------
# demo


DEMO_IMAGES = ("astronaut", "coffee")


def _demo_tasks(size: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("sr4_bicubic", "sr_bicubic", {"factor": 4}),
        ("inpaint_box", "inpaint_box", {"box_size": size // 2, "margin": max(size // 16, 1)}),
        ("deblur_gaussian", "deblur_gaussian", {"kernel_size": 25, "kernel_std": 2.0}),
    ]


def _demo_image(name: str, size: int) -> np.ndarray:
    from skimage.transform import resize

    from .priors.training_data import HELDOUT_IMAGES, load_skimage_image

    if name not in HELDOUT_IMAGES:
        raise UsageError(f"demo image {name!r} is not held out of the prior's training set")
    img = load_skimage_image(name)
    h, w = img.shape[:2]
    s = min(h, w)
    img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    return np.clip(resize(img, (size, size), order=3, anti_aliasing=True), 0, 1).astype(np.float32)


def _grid(rows: list[list[np.ndarray]], labels_top: list[str], labels_left: list[str], pad: int = 2) -> np.ndarray:
    """Tile equally sized RGB images into a grid with white gaps and text labels."""
    from PIL import Image, ImageDraw

    th, tw = rows[0][0].shape[:2]
    top, left = 26, 96  # two text lines above each column: "image:" then its role
    H = top + len(rows) * (th + pad) + pad
    W = left + len(rows[0]) * (tw + pad) + pad
    canvas = np.ones((H, W, 3), np.float32)
    for r, row in enumerate(rows):
        for c, im in enumerate(row):
            y0, x0 = top + pad + r * (th + pad), left + pad + c * (tw + pad)
            canvas[y0:y0 + th, x0:x0 + tw] = im if im.ndim == 3 else im[..., None]
    pil = Image.fromarray(nio.quantize(canvas, 8))
    draw = ImageDraw.Draw(pil)
    for c, text in enumerate(labels_top):
        draw.text((left + pad + c * (tw + pad) + 2, 1), text.replace(": ", ":\n", 1), fill=(0, 0, 0), spacing=1)
    for r, text in enumerate(labels_left):
        draw.text((2, top + pad + r * (th + pad) + th // 2 - 5), text, fill=(0, 0, 0))
    return np.asarray(pil, np.float32) / 255.0


def cmd_demo(args) -> int:
    import torch

    from .api import restore

    log = _Log(args.quiet)
    device = _device(args.device)
    _threads(args.threads)
    if args.size < 32 or args.size % 16:
        raise UsageError(f"--size must be a multiple of 16, >= 32; got {args.size}")
    spec = SamplerSpec("nfc")  # the default preset: the deterministic continuation
    if args.steps is not None:
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {args.steps}")
        spec.set("num_levels", int(args.steps), "--steps")
    cfg = spec.build()
    out = _check_output_folder(Path(args.output), [])
    prior = _load_prior(args.prior, device, args.precision)
    images = {name: _demo_image(name, args.size) for name in DEMO_IMAGES}
    sigma = DEFAULT_NOISE_SIGMA
    seed = args.seed
    rows_csv, grid_rows, row_labels = [], [], []
    t_start = time.perf_counter()
    with _folder_lock(out):
        nio.remove_stale_temp_files(out)
        for label, task_name, params in _demo_tasks(args.size):
            task = parse_task({"task": task_name, **params, "noise_sigma": sigma}, f"demo {label}")
            op = task.build((args.size, args.size), seed=seed).to(device)
            x = torch.stack([torch.from_numpy(images[n]).permute(2, 0, 1) for n in DEMO_IMAGES]).to(device)
            gens = [torch.Generator().manual_seed(noise_seed(seed + i)) for i in range(len(DEMO_IMAGES))]
            y = torch.cat([op.measure(x[i:i + 1], sigma, gens[i]) for i in range(len(DEMO_IMAGES))])
            log.info(f"{label}: restoring {len(DEMO_IMAGES)} images ({task_name}, {args.size}x{args.size}, "
                     f"noise_sigma={sigma}, nfc/{spec.resolved_preset}, {cfg.num_levels} levels, {cfg.nfe} NFE)")
            res = restore(y, op, prior=prior, method="nfc", sigma_y=sigma, seed=seed,
                          progress=not args.quiet, config=cfg)
            grid_row = []
            for i, name in enumerate(DEMO_IMAGES):
                gt = images[name]
                yi = _to_numpy(y[i:i + 1])
                shown = np.repeat(np.repeat(yi, 4, 0), 4, 1) if task_name.startswith("sr_") else yi
                xi = _to_numpy(res.image[i:i + 1])
                if not np.isfinite(xi).all():
                    raise FloatingPointError(f"{label}/{name}: NaN/Inf in the restoration")
                base = out / label
                nio.write_image(base / f"{name}_measurement.png", np.clip(yi, 0, 1))
                nio.write_image(base / f"{name}_restored.png", xi)
                nio.write_image(base / f"{name}_ground_truth.png", gt)
                p_in, s_in = _metrics(shown, gt)
                p, s = _metrics(xi, gt)
                rows_csv.append({"task": label, "image": name, "psnr_measurement": p_in, "psnr": p,
                                 "ssim_measurement": s_in, "ssim": s, "nfe": int(res.nfe),
                                 "seconds": round(res.seconds / len(DEMO_IMAGES), 2)})
                grid_row += [np.clip(shown, 0, 1), np.clip(xi, 0, 1), gt]
            grid_rows.append(grid_row)
            row_labels.append(label)
        top = [f"{n}: {c}" if c == "measurement" else c for n in DEMO_IMAGES for c in ("measurement", "restored", "truth")]
        nio.write_image(out / "grid.png", _grid(grid_rows, top, row_labels))
        fields = ["task", "image", "psnr_measurement", "psnr", "ssim_measurement", "ssim", "nfe", "seconds"]
        nio.write_csv(out / "metrics.csv", rows_csv, fields)
        nio.write_json(out / RESOLVED_JSON, resolved_config(
            None, spec, seed, 1, prior=_prior_id(args.prior)["path"], command="demo",
            per_image_seed="seed + index of the image in the demo batch",
            device=str(device), images=list(DEMO_IMAGES), note={
                "size": args.size, "noise_sigma": sigma,
                "tasks": {label: {"task": t, **p} for label, t, p in _demo_tasks(args.size)},
                "measurement column": "nearest-neighbour upsampled for SR"}))
    total = time.perf_counter() - t_start
    if not args.quiet:
        print(f"{'task':<16} {'image':<10} {'PSNR in':>8} {'PSNR out':>9} {'SSIM out':>9}")
        for r in rows_csv:
            print(f"{r['task']:<16} {r['image']:<10} {r['psnr_measurement']:>8.2f} {r['psnr']:>9.2f} {r['ssim']:>9.4f}")
        print(f"({total:.0f} s) grid: {out / 'grid.png'}  metrics: {out / 'metrics.csv'}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# convert-adm


def cmd_convert_adm(args) -> int:
    try:
        from .priors import adm
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("nfc_dps"):
            raise UsageError("ADM checkpoint conversion is not available in this installation "
                             "(module nfc_dps.priors.adm is missing)") from e
        raise UsageError(f"ADM checkpoint conversion needs a missing package: {e.name}") from e
    presets = sorted(getattr(adm, "ADM_PRESETS", {"ffhq256": None, "imagenet256": None}))
    if args.preset not in presets:
        raise UsageError(f"--preset {args.preset!r}: choose one of {', '.join(presets)}")
    ckpt = Path(args.checkpoint)
    if not ckpt.is_file():
        raise UsageError(f"checkpoint {ckpt}: no such file")
    log = _Log(args.quiet)
    try:
        out = adm.convert_adm_checkpoint(ckpt, args.out_dir, args.preset, overwrite=args.overwrite)
    except (FileExistsError, NotADirectoryError) as e:
        raise UsageError(str(e)) from e
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        log.error(f"conversion of {ckpt} failed: {e}")
        return EXIT_FAILED
    log.info(f"converted {ckpt} ({args.preset}) -> {out}; use it with --prior {out}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# train-prior (nfc_dps.training owns the options and the run)


def cmd_train_prior(args) -> int:
    from .training import TrainingError, train_prior
    from .training.args import config_from_args

    _threads(args.threads)
    device = _device(args.device)
    log = _Log(args.quiet)
    try:
        train_prior(config_from_args(args, str(device), progress=not args.quiet), log=log.info, warn=log.error)
    except TrainingError as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # an export or log file that cannot be written (full disk, permissions)
        raise UsageError(f"cannot write {e.filename or ''}: {e.strerror or e}; the last saved state is kept") from e
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# bench (nfc_dps.bench owns the options and the run)


def cmd_bench(args) -> int:
    from .bench.cli import run_from_args

    return run_from_args(args)


def _unavailable(command: str, reason: str) -> int:
    raise UsageError(f"{command} is not available in this installation ({reason})")


# --------------------------------------------------------------------------------------------
# argument parsing


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="torch device: cpu (default), cuda, cuda:1, mps")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or info messages (errors still shown)")


def _precision_flag(p: argparse.ArgumentParser) -> None:
    from .priors.diffusers_prior import PRECISIONS

    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="the prior network's compute precision (default auto: bfloat16 where the CPU or GPU has it "
                        "natively, about 2x faster; float32 otherwise)")


def _task_flags(p: argparse.ArgumentParser, seed_help: str) -> None:
    from .operators import TASKS

    p.add_argument("--task", choices=list(TASKS), help="task name (its default parameters), or use --config")
    p.add_argument("--config", "-c", action="append", metavar="FILE",
                   help="YAML/JSON config: a task (configs/deblur_gaussian.yaml), a sampler (configs/nfc_fast.yaml), "
                        "a resolved_config.json or a simulation.json; repeatable, later files win, flags win over files")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="operator parameter, e.g. --param kernel_size=25 (repeatable)")
    p.add_argument("--noise-sigma", type=float, default=None,
                   help=f"measurement noise std in [0, 1] pixel units (default {DEFAULT_NOISE_SIGMA}; "
                        f"DPS/DAPS's 0.05 in [-1, 1] units is 0.025 here)")
    p.add_argument("--seed", type=int, default=None, help=seed_help)


def build_parser() -> argparse.ArgumentParser:
    from .samplers import METHODS

    parser = _Parser(prog="nfc-dps", description="Image restoration with diffusion priors (NFC, DAPS, ...).",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("demo", help="restore 2 held-out photos x 3 tasks; write a grid and metrics",
                       description="Simulate SR x4 (bicubic), box inpainting and Gaussian deblurring (noise_sigma "
                                   "0.025) on two photographs the default prior never saw, restore them with NFC "
                                   "(its default deterministic preset) and write per-task images, grid.png and "
                                   "metrics.csv.")
    d.add_argument("--output", "-o", default="nfc_dps_demo", help="output folder (default ./nfc_dps_demo)")
    d.add_argument("--steps", type=int, default=None, help="NFC levels (default: the deterministic preset's 16; 1 NFE each)")
    d.add_argument("--size", type=int, default=96, help="image size in pixels (default 96)")
    d.add_argument("--prior", default=None, help="diffusers prior folder (default: the embedded prior)")
    _precision_flag(d)
    d.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    _common(d)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser(
        "restore", help="restore measurement images (a file or a folder)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Each input image is the measurement y of the task (for SR the output is factor x larger).\n"
                    "Outputs in --output:\n"
                    "  <name>.png            restoration (mean of the samples with --samples K > 1); input's bit depth;\n"
                    "                        an input's alpha channel is re-attached when the size is unchanged, dropped for SR\n"
                    f"  std/<name>.png|.npy   per-pixel posterior std (K > 1); PNG gray 1.0 = std {1 / STD_PNG_SCALE:g}\n"
                    "  samples/<name>_<j>.png  the K samples (--save-samples)\n"
                    "  results.csv, summary.json  per-image status, seed, PSNR/SSIM (--gt), NFE, time; failures\n"
                    "  resolved_config.json  every setting, seeds and versions (reusable with --config)\n"
                    "  manifest.json         finished images: a rerun skips them (resume); --overwrite redoes them\n"
                    "Each image's seed is a hash of --seed and its file name: adding or removing files changes no\n"
                    "other result. <name> is the input's stem, or stem_ext where inputs share a stem (a_png, a_jpg);\n"
                    "inputs whose output names would coincide (a.png and a.PNG) are refused before any work.")
    r.add_argument("--input", "-i", default=None,
                   help="measurement image or folder (default with a simulation.json config: its measurements)")
    r.add_argument("--output", "-o", required=True, help="output folder (not the input folder)")
    _task_flags(r, "base seed (default 0); each image's seed is a hash of it and the image's file name")
    r.add_argument("--method", choices=sorted(METHODS), default=None, help="sampler (default nfc)")
    r.add_argument("--preset", default=None,
                   help="sampler preset. nfc: deterministic (default: the best estimate per network call, 16 NFE, "
                        "no random draw), fast (posterior samples, 100 NFE: use it with --samples K for a std map "
                        "that measures the posterior spread), fast_psnr, paper (as published, 1000 NFE); "
                        "other methods: fast (default), paper")
    r.add_argument("--steps", type=int, default=None, help="annealing levels / sampler steps (overrides the preset)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="sampler field, e.g. --set inner=langevin --set band.cutoff_start=0.5 (repeatable)")
    r.add_argument("--prior", default=None, help="diffusers prior folder (default: the embedded prior)")
    _precision_flag(r)
    r.add_argument("--kernel", default=None, metavar="FILE|DIR",
                   help="blur kernel (.npy or image) for all inputs, or a folder of kernels matched by file name")
    r.add_argument("--mask", default=None, metavar="FILE|DIR",
                   help="inpainting mask (white = observed) for all inputs, or a folder of masks matched by file name")
    r.add_argument("--samples", type=int, default=None, metavar="K",
                   help="posterior samples per image: writes their mean and a std map (default 1); needs a "
                        "sampling preset, e.g. --preset fast")
    r.add_argument("--save-samples", action="store_true", help="also write each sample (with --samples K)")
    r.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="restore up to B images of the same size (and operator) per sampler call: faster on a GPU; "
                        "each image keeps its own seed, so the results are those of B = 1 (default 1)")
    r.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help=f"at most N sampler chains (images x samples) at once: bounds memory with --samples K "
                        f"(default {DEFAULT_MAX_BATCH}, or B if larger). Results with --batch-size and --max-batch "
                        f"equal those of one image at a time up to float rounding of batched network layers")
    r.add_argument("--gt", default=None, metavar="DIR", help="ground-truth folder (same file names): PSNR/SSIM per image")
    r.add_argument("--bit-depth", type=int, choices=(8, 16), default=None, help="output bit depth (default: the input's)")
    r.add_argument("--overwrite", action="store_true", help="redo images already done in the output folder")
    _common(r)
    r.set_defaults(func=cmd_restore)

    s = sub.add_parser("simulate", help="clean images -> measurements, with kernels, masks and seeds recorded",
                       description="Writes measurements/, ground_truth/ (cropped to a multiple of the SR factor), "
                                   "kernels/<name>.npy|.png, masks/<name>.png and simulation.json, which "
                                   "'restore --config OUT/simulation.json' reads back (operators from the saved files).")
    s.add_argument("--input", "-i", required=True, help="clean image or folder")
    s.add_argument("--output", "-o", required=True, help="output folder (not the input folder)")
    _task_flags(s, "base seed (default 0); image i of the sorted list is simulated with seed + i")
    s.add_argument("--bit-depth", type=int, choices=(8, 16), default=16, help="measurement PNG bit depth (default 16)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bars or info messages")
    s.set_defaults(func=cmd_simulate)

    try:
        from .bench import cli as benchmark
    except Exception as e:  # noqa: BLE001 - a broken optional module must not break the other commands
        bench_error = str(e)
        b = sub.add_parser("bench", help="benchmarks (unavailable in this installation)")
        b.set_defaults(func=lambda a: _unavailable("bench", bench_error))
    else:
        b = sub.add_parser("bench", help="PSNR/SSIM tables vs peers and classical baselines (docs/benchmarks.md)",
                           description="See docs/benchmarks.md; same options as scripts/benchmark.py.")
        benchmark.build_parser(b)
        b.set_defaults(func=cmd_bench)

    from .training.args import EXAMPLES, add_arguments

    t = sub.add_parser("train-prior", help="train a diffusion prior on the package photos or your own images",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
                       description="Train an EDM denoiser (a prior folder for --prior) on CPU or GPU; resumable.")
    add_arguments(t)
    _common(t)
    t.set_defaults(func=cmd_train_prior)

    c = sub.add_parser("convert-adm", help="convert an ADM (guided-diffusion) checkpoint to a diffusers prior folder")
    c.add_argument("checkpoint", help="ADM .pt (e.g. ffhq_10m.pt) or .safetensors state dict")
    c.add_argument("out_dir", help="output folder (then use --prior OUT_DIR)")
    c.add_argument("--preset", required=True, help="ffhq256 or imagenet256")
    c.add_argument("--overwrite", action="store_true", help="replace an existing conversion")
    c.add_argument("--quiet", "-q", action="store_true")
    c.set_defaults(func=cmd_convert_adm)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 some image failed, 2 usage error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except (UsageError, ConfigError) as e:
        print(f"nfc-dps {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"nfc-dps {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

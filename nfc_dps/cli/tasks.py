"""Task, sampler and seed resolution shared by ``restore``, ``simulate`` and ``calibrate``: configs,
then flags (:func:`resolve_task`, :func:`resolve_sampler`, :func:`resolve_seed`), and each image's
operator, with per-image mask / kernel files (:class:`OperatorSource`)."""

from __future__ import annotations

from pathlib import Path

from ..config import (
    AUTO_NOISE_SIGMA,
    DEFAULT_NOISE_SIGMA,
    ConfigBundle,
    ResolvedSampler,
    SamplerSpec,
    TaskConfig,
    file_noise_problem,
    parse_scalar,
    parse_task,
)
from ..noise import EstimatedNoise, NoiseSpecError, parse_noise
from ..operators import TASKS, build_operator, load_kernel, load_mask, noise_sigma_problem, task_reading
from ..samplers import get_method
from .common import UsageError, check_input, match_file

#: tasks whose operator is drawn at random: restoring real data needs the actual mask / kernel (the flag)
RANDOM_TASKS = {name: f"--{t.draws}" for name, t in TASKS.items() if t.draws}
#: tasks whose operator is read from a file: task -> (its parameter, the flag that sets it, what it is)
FILE_TASKS = {name: (t.file_param, f"--{t.reads}", t.reads) for name, t in TASKS.items() if t.reads}


def resolve_task(args, bundle: ConfigBundle, command: str = "restore") -> TaskConfig:
    """The task of --config files, then --task, --param and --noise-sigma (UsageError when none);
    a noise level of ``auto`` only for ``restore`` (it estimates it per image)."""
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
        key, value = key.strip(), parse_scalar(value)
        if key in ("mask_path", "kernel_path") and isinstance(value, str):
            value = str(Path(value).expanduser().resolve())  # as --mask / --kernel: recorded absolute
        params[key] = value
    source = "--param" if args.param else task.source
    if TASKS[task.task].reads_measurement is not None:  # the noise is each file's own
        stated = {flag: value for flag, value in (("--noise-sigma", args.noise_sigma),
                                                   ("--noise", getattr(args, "noise", None))) if value is not None}
        if stated:
            raise UsageError(", ".join(f"{k} {v}" for k, v in stated.items()) + ": "
                             + file_noise_problem(task.task, stated))
        return parse_task({"task": task.task, **params}, source)
    noise = task.noise_sigma if args.noise_sigma is None else args.noise_sigma
    if noise != AUTO_NOISE_SIGMA:
        why = noise_sigma_problem(noise) if isinstance(noise, float) else f"must be a number or 'auto', got {noise!r}"
        if why:
            raise UsageError(f"--noise-sigma {why}")
    spec = task.noise if args.noise_sigma is None else None  # --noise-sigma: Gaussian
    if getattr(args, "noise", None) is not None:
        if args.noise_sigma is not None:
            raise UsageError("pass one of --noise and --noise-sigma (--noise gaussian:S is --noise-sigma S)")
        spec = args.noise  # parse_task turns gaussian:S into noise_sigma S
        _check_noise_flag(spec, command)
        if noise == AUTO_NOISE_SIGMA:  # a file's auto gives way to the flag's model
            noise = DEFAULT_NOISE_SIGMA
    if noise == AUTO_NOISE_SIGMA and command != "restore":
        where = "--noise-sigma" if args.noise_sigma is not None else task.source
        raise UsageError(f"{where}: noise_sigma auto is restore's (it estimates the level of each measurement); "
                         f"{command} needs a stated noise level")
    if spec and command != "restore" and isinstance(parse_noise(spec, estimated=True), EstimatedNoise):
        raise UsageError(f"{task.source}: noise {spec} is restore's (it estimates the noise of each measurement); "
                         f"{command} needs a stated noise, e.g. --noise {spec.partition(':')[0]}:30"
                         f"{',0.01' if spec.startswith('poisson-gaussian') else ''}")
    # --noise is checked above: what parse_task refuses now is the task's parameters (a --param's, or a file's)
    return parse_task({"task": task.task, **params, "noise_sigma": noise if noise == AUTO_NOISE_SIGMA else float(noise),
                       **({"noise": spec} if spec else {})}, source)


def _check_noise_flag(spec: str, command: str) -> None:
    """UsageError naming --noise and its spec once when the spec is not a noise model (or its
    Gaussian sigma is not a noise level), or is one estimated per image (``kind:auto``) for a
    ``command`` other than restore."""
    try:
        model = parse_noise(spec, estimated=command == "restore")
    except NoiseSpecError as e:
        raise UsageError(f"--noise {spec!r}: {e.reason}") from None
    if not isinstance(model, EstimatedNoise) and model.stated_problem():
        raise UsageError(f"--noise {spec!r}: {model.stated_problem()}")


def resolve_seed(args, bundle: ConfigBundle) -> int:
    """The run's base seed: --seed, else the config files', else 0; UsageError when negative."""
    seed = args.seed if args.seed is not None else (bundle.seed or 0)
    if seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    return seed


def resolve_sampler(args, bundle: ConfigBundle) -> ResolvedSampler:
    """The sampler of --config files, then --method, --preset, --set and --steps, resolved (the
    run's one config object); ConfigError naming the file or flag and the key."""
    spec = bundle.sampler
    if getattr(args, "method", None):
        if args.method != spec.method:  # as between config files: nothing of another method carries over
            spec = SamplerSpec(method=args.method)
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
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {args.steps}")
        spec.set(get_method(spec.method).steps_field, int(args.steps), "--steps")
    return spec.resolve()


def with_operator_files(task: TaskConfig, **files: str | None) -> TaskConfig:
    """``task`` switched to the task of its family that reads the given files (``--mask`` /
    ``--kernel``: ``mask=PATH``, ``kernel=PATH``; None: not given), e.g. deblur_motion with a
    kernel -> deblur_kernel. UsageError naming the flag when the family reads no such file."""
    for what, value in files.items():
        if not value:
            continue
        reading = task_reading(TASKS[task.task].family, what)
        if reading is None:
            takers = [t.name for t in TASKS.values() if task_reading(t.family, what)]
            raise UsageError(f"--{what} applies to the tasks {', '.join(takers)}, not {task.task!r}")
        check_input(f"--{what}", Path(value))
        task = task.with_params(task=reading.name, **{reading.file_param: str(Path(value).resolve())})
    return task


class OperatorSource:
    """Builds the operator of each image: per-image mask / kernel files when the task's
    ``mask_path`` / ``kernel_path`` is a folder, else one file or none."""

    def __init__(self, task: TaskConfig) -> None:
        self.task = task
        self.key = TASKS[task.task].file_param
        self.folder = Path(task.params[self.key]) if self.key and Path(task.params[self.key]).is_dir() else None

    def factor(self) -> int:
        return TASKS[self.task.task].upscale(self.task.params)

    def files_for(self, name: str) -> Path | None:
        if self.key is None:
            return None
        if self.folder is None:
            return Path(self.task.params[self.key])
        exts = (".npy", ".png", ".tif", ".tiff", ".bmp", ".jpg", ".jpeg")
        exact_array = self.folder / Path(name).with_suffix(".npy")  # the input's own path, subfolders kept
        if exact_array.is_file():  # before a same-named picture: simulate's kernel PNG is quantised, the .npy exact
            return exact_array
        found = match_file(self.folder, name, exts)
        if found is None:
            what = "mask" if self.key == "mask_path" else "kernel"
            raise ValueError(f"no {what} for {name} in {self.folder} (looked for {Path(name).stem}.*)")
        return found

    def build(self, name: str, image_hw: tuple[int, int], seed: int = 0):
        path = self.files_for(name)
        params = dict(self.task.params)
        if path is not None:
            params[self.key] = str(path)
        return build_operator(self.task.task, image_size=image_hw, seed=seed, **params), path


def check_operator_file(task: TaskConfig, flag_value: str | None) -> None:
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
    check_input(where, path)
    if path.is_dir():
        return  # per-image files: each is checked, and reported by name, with its image
    try:
        (load_mask if key == "mask_path" else load_kernel)(path)
    except (ValueError, TypeError, OSError) as e:
        raise UsageError(f"{where}: {e}") from e

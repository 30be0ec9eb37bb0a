"""What ``restore`` settles before any work: the configs (and a simulation's record), the input
folders, the task's operator files, the sampler and its counts, the calibration file; each
problem a :class:`~nfc_dps.cli.common.UsageError` naming the flag, file or value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ResolvedSampler, load_config, parse_task
from ..conformal import CalibrationError, load_calibration
from ..operators import TASKS
from .common import DEFAULT_MAX_BATCH, SIMULATION_JSON, Log, UsageError, check_input, check_readable_folder, check_restarts, check_samples
from .tasks import RANDOM_TASKS, check_operator_file, resolve_sampler, resolve_seed, with_operator_files


def run_configs(args, log: Log) -> tuple[Any, Path | None]:
    """The merged --config files (a simulate output folder given as --input puts its record first
    and its measurements as the input: (bundle, None)), and --input. A task that was simulated
    from files it drew (deblur_motion) is restored with the operator files the simulation recorded."""
    configs = list(args.config or [])
    inp = Path(args.input) if args.input else None
    if inp is not None:
        check_input("--input", inp)  # before its simulation.json is looked for
    if inp is not None and inp.is_dir() and (inp / SIMULATION_JSON).is_file():
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
            dropped = [p for p in args.param or [] if p.partition("=")[0].strip() not in TASKS[recorded.task].params]
            if dropped:  # parameters of the simulated operator, which the recorded files now fix
                log.info(f"ignoring {', '.join('--param ' + p for p in dropped)}: the simulation's "
                         f"{recorded.task} files define the operator")
                args.param = [p for p in args.param if p not in dropped]
    return bundle, inp


def input_folders(args, bundle, inp: Path | None) -> tuple[Path, Path | None]:
    """(--input, --gt): a simulation's measurements and ground truth unless given; both readable."""
    sim = bundle.simulation
    gt_dir = Path(args.gt) if args.gt else None
    if inp is None and sim is not None:
        inp = bundle.simulation_dir / sim.get("measurements", "measurements")
        if gt_dir is None and sim.get("ground_truth"):
            gt_dir = bundle.simulation_dir / sim["ground_truth"]
    if inp is None:
        raise UsageError("--input is required (a measurement image or a folder of them)")
    check_input("--input", inp)
    if gt_dir is not None:
        check_readable_folder("--gt", gt_dir)
    return inp, gt_dir


def task_with_operator_files(args, task):
    """The task with --mask / --kernel; a task that draws its operator at random refused (restoring
    needs the one the measurements were taken with); its mask or kernel file checked."""
    task = with_operator_files(task, kernel=args.kernel, mask=args.mask)
    if task.task in RANDOM_TASKS:
        flag = RANDOM_TASKS[task.task]
        raise UsageError(f"task {task.task!r} draws its {'mask' if flag == '--mask' else 'kernel'} at random; "
                         f"restoring needs the one the measurements were taken with: pass {flag} FILE|DIR, "
                         f"or --config <simulate output>/{SIMULATION_JSON}")
    reads = TASKS[task.task].reads
    if reads and task.params.get(f"{reads}_path") and not Path(task.params[f"{reads}_path"]).exists():
        raise UsageError(f"{task.source}: {reads}_path {task.params[f'{reads}_path']}: no such file or folder")
    check_operator_file(task, getattr(args, reads) if reads else None)
    return task


def run_sampler(args, bundle) -> tuple[ResolvedSampler, int, int]:
    """(the sampler, the base seed, K) of the configs and flags, checked; --max-batch's default."""
    for flag, value in (("--max-batch", args.max_batch), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.max_batch is None:
        args.max_batch = max(DEFAULT_MAX_BATCH, args.batch_size)
    sampler = resolve_sampler(args, bundle)
    seed = resolve_seed(args, bundle)
    samples = args.samples if args.samples is not None else (bundle.num_samples or 1)
    if samples < 1:
        raise UsageError(f"--samples must be >= 1, got {samples}")
    check_samples(samples, sampler.config)
    if args.save_samples and samples < 2:
        raise UsageError(f"--save-samples writes each of K >= 2 posterior samples; add --samples K (got K = {samples})")
    if args.restarts < 1:
        raise UsageError(f"--restarts must be >= 1, got {args.restarts}")
    check_restarts(args.restarts, sampler.config)
    if args.restarts > 1 and (samples > 1 or sampler.config.is_deterministic):
        raise UsageError(f"--restarts {args.restarts} keeps the best of N chains per image: it needs a stochastic "
                         f"sampler (e.g. --method daps, or --preset fast) and no --samples")
    if samples > 1 and sampler.config.is_deterministic:
        raise UsageError(f"--samples {samples}: {sampler.method}/{sampler.preset} is deterministic (every sample "
                         f"would be the same); for posterior samples and a std map add --preset fast")
    return sampler, seed, samples


def load_run_calibration(args, task, sampler: ResolvedSampler, samples: int, bundle) -> Any:
    """The --calibration file, checked against this run's task, sampler and K (the prior is checked
    once it loads); None without the flag. UsageError naming the file and what differs."""
    if getattr(args, "calibration", None) is None:
        return None
    if not args.calibration.strip():
        raise UsageError(f"--calibration {args.calibration!r}: empty; name a file of 'nfc-dps calibrate' (or leave "
                         f"the flag out)")
    if task.estimates_noise:
        flag = "--noise-sigma auto" if task.noise is None else f"--noise {task.noise}"
        raise UsageError(f"--calibration {args.calibration} with {flag}: a calibration holds at the noise "
                         f"level it was fitted at; give that level with --noise-sigma")
    if samples < 2:
        raise UsageError(f"--calibration {args.calibration} needs --samples K >= 2 (the interval scales the spread "
                         f"of K samples), got {samples}")
    # measurements of `simulate` restored with its saved masks / kernels: the task they were
    # simulated with (e.g. inpaint_random) identifies the operator
    tasks = [task.as_dict()]
    simulated = (bundle.simulation or {}).get("simulated_task") if bundle.simulation else None
    files = task.params.get("mask_path") or task.params.get("kernel_path")
    if (isinstance(simulated, dict) and files and bundle.simulation_dir is not None
            and Path(bundle.simulation_dir).resolve() in Path(files).resolve().parents
            and simulated.get("noise_sigma") == task.noise_sigma):
        tasks.append(simulated)
    try:
        cal = load_calibration(args.calibration)
        cal.check(sampler.method, sampler.config, samples, task=tasks)
    except CalibrationError as e:
        raise UsageError(str(e)) from e
    return cal

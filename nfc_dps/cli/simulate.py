"""``nfc-dps simulate``: clean images -> measurements, with the kernels, masks and seeds recorded
in simulation.json, which ``restore --config OUT/simulation.json`` reads back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import io as nio
from ..config import DEFAULT_NOISE_SIGMA, INCOMPLETE, KIND_SIMULATION, TaskConfig, load_config
from ..operators import TASKS
from ..operators.blur import KernelLargerThanMeasurement
from ..restore_inputs import as_batch
from ..run_record import package_versions
from .common import (
    DISK_FULL,
    EXIT_FAILED,
    EXIT_OK,
    SIMULATION_JSON,
    Log,
    UsageError,
    check_input,
    failure_reason,
    image_seed,
    input_names,
    noise_seed,
    read_inputs,
    to_numpy,
)
from .flags import task_flags
from .outputs import cannot_write, check_output_folder, existing_files, folder_lock, npy_bytes, output_stems, refuse_unrecorded
from .preflight import input_notes
from .tasks import OperatorSource, check_operator_file, resolve_seed, resolve_task

#: the subfolders of the output folder that simulate writes
OUTPUT_SUBFOLDERS = ("measurements", "ground_truth", "kernels", "masks")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``simulate`` subcommand and its arguments."""
    s = sub.add_parser("simulate", help="clean images -> measurements, with kernels, masks and seeds recorded",
                       description="Writes measurements/, ground_truth/ (cropped to a multiple of the SR factor), "
                                   "kernels/<name>.npy|.png, masks/<name>.png and simulation.json, which "
                                   "'restore --config OUT/simulation.json' reads back (operators from the saved files). "
                                   "Into a folder an earlier simulate wrote: with the same settings its other images "
                                   "are kept (add images one run at a time); with other settings (task, noise, seed, "
                                   "bit depth) what it wrote for images not simulated now is removed, and said so. "
                                   "A folder holding a file of an output's name that no earlier simulate run "
                                   "recorded is refused before any work, naming it (--overwrite replaces it).")
    s.add_argument("--input", "-i", required=True, help="clean image or folder")
    s.add_argument("--output", "-o", required=True, help="output folder (not the input folder)")
    task_flags(s, "base seed (default 0); each image's operator and noise seeds come from it and the image's "
               "file name, never its position, so adding files changes no other measurement")
    s.add_argument("--bit-depth", type=int, choices=(8, 16), default=16, help="measurement PNG bit depth (default 16)")
    s.add_argument("--overwrite", action="store_true",
                   help="replace files of the output names in --output that no earlier simulate run wrote there")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bars or info messages")
    s.set_defaults(func=cmd_simulate)


def _restore_task_for(task: TaskConfig, has_kernel: bool, has_mask: bool) -> dict[str, Any]:
    """The task config that restores the simulated measurements exactly (kernels / masks from files)."""
    if has_kernel:
        return {"task": "deblur_kernel", "kernel_path": "kernels",
                "boundary": {**TASKS[task.task].params, **task.params}["boundary"], "noise_sigma": task.noise_sigma,
                **({"noise": task.noise} if task.noise else {})}
    if has_mask:
        return {"task": "inpaint_mask", "mask_path": "masks", "noise_sigma": task.noise_sigma,
                **({"noise": task.noise} if task.noise else {})}
    return task.as_dict()


#: key of an incomplete simulation.json: the settings of the run that was rewriting the folder
REWRITING_WITH = "rewriting_with"
#: key of simulation.json's "note": the output stems of images a run started and its record does not
#: list, whose files remain (a run killed or stopped mid-image): they are a simulate run's own
UNFINISHED = "unfinished"


def measurement_extension(task: TaskConfig) -> str:
    """.png for a measurement in [0, 1]; .tif (float32, exact) for one that may leave it (Poisson
    counts / peak, an operator of unbounded range such as phase retrieval's amplitudes)."""
    writes = TASKS[task.task].writes_measurement
    if writes is not None:  # a file of the task's own kind (a real JPEG)
        return writes[0]
    return ".tif" if task.noise or TASKS[task.task].unbounded else ".png"


def _planned_files(stem: str, task: TaskConfig) -> list[str]:
    """The files (relative to the output folder) that :func:`_simulate_one` writes for output ``stem``."""
    files = [f"measurements/{stem}{measurement_extension(task)}", f"ground_truth/{stem}.png"]
    family = TASKS[task.task].family
    if family == "blur":
        files += [f"kernels/{stem}.npy", f"kernels/{stem}.png"]
    elif family == "inpaint":
        files.append(f"masks/{stem}.png")
    return files


def _unfinished(sim: Any) -> list[str]:
    """The unfinished stems a simulation record lists."""
    note = sim.get("note") if isinstance(sim, dict) else None
    stems = note.get(UNFINISHED) if isinstance(note, dict) else None
    return [s for s in stems if isinstance(s, str)] if isinstance(stems, list) else []


def _refuse_unrecorded(output: Path, out: Path, stems: list[str], task: TaskConfig) -> None:
    """Before any work: refuse (UsageError naming it) a file this run would write that no earlier
    simulate run into ``out`` recorded (its simulation.json: images, unfinished stems)."""
    try:
        sim = json.loads((out / SIMULATION_JSON).read_text()) if (out / SIMULATION_JSON).exists() else None
    except (OSError, ValueError):
        sim = None
    ours = isinstance(sim, dict) and sim.get("kind") == KIND_SIMULATION
    records = sim.get("images") if ours and isinstance(sim.get("images"), list) else []
    recorded = {f.casefold() for r in records if isinstance(r, dict) for f in _files_of(r)}
    unfinished = {s.casefold() for s in _unfinished(sim)} if ours else set()
    if ours:
        recorded.add(SIMULATION_JSON.casefold())

    def wrote(rel: str) -> bool:
        return rel.casefold() in recorded or ("/" in rel and Path(rel).stem.casefold() in unfinished)

    planned = [SIMULATION_JSON, *(f for stem in stems for f in _planned_files(stem, task))]
    refuse_unrecorded(output, out, planned, wrote, OUTPUT_SUBFOLDERS)


def _still_unfinished(out: Path, stems: list[str], images: list[dict[str, Any]]) -> list[str]:
    """Of ``stems``, those no record of ``images`` lists and whose files remain in ``out``."""
    listed = {Path(r["measurement"]).stem.casefold() for r in images}
    try:
        present = {Path(rel).stem.casefold() for rel in existing_files(out, OUTPUT_SUBFOLDERS).values() if "/" in rel}
    except UsageError:
        present = {s.casefold() for s in stems}
    return sorted({s for s in stems if s.casefold() not in listed and s.casefold() in present})


def _files_of(rec: dict[str, Any]) -> list[str]:
    """The files (relative to the output folder) that one image's simulation record wrote."""
    files = [rec.get(k) for k in ("measurement", "ground_truth", "kernel", "mask")]
    if rec.get("kernel"):
        files.append(str(Path(rec["kernel"]).with_suffix(".png")))  # its picture beside the .npy
    return [f for f in files if isinstance(f, str)]


def _previous_simulation(out: Path, log: Log) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(image records, settings) of the simulation.json an earlier run left in ``out``; settings:
    its simulated task, seed and bit depth. Nothing when there is none or it is unreadable."""
    path = out / SIMULATION_JSON
    if not path.is_file():
        return [], {}
    try:
        sim = json.loads(path.read_text())
        records = sim.get("images", [])
    except (OSError, ValueError, AttributeError) as e:
        log.error(f"warning: ignoring the unreadable {path} of an earlier run ({e})")
        return [], {}
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("name"), str)
               and isinstance(r.get("measurement"), str)] if isinstance(records, list) else []
    settings = {k: sim.get(k) for k in ("simulated_task", "simulation_seed", "bit_depth")}
    if sim.get(INCOMPLETE) and sim.get(REWRITING_WITH) != settings:
        return records, {INCOMPLETE: True}  # interrupted with other settings: its files may hold either's
    return records, settings


def _mark_incomplete(out: Path, previous: list[dict[str, Any]], settings: dict[str, Any],
                     unfinished: list[str]) -> None:
    """Before any file in ``out`` is written: its simulation.json says the folder is being
    rewritten, so an interrupted run leaves no record that restore would trust, and lists the
    ``unfinished`` output stems, so its files stay a simulate run's own; the final record replaces it."""
    path = out / SIMULATION_JSON
    try:
        sim = json.loads(path.read_text())
    except (OSError, ValueError):
        sim = {}
    sim = sim if isinstance(sim, dict) else {}
    note = sim.get("note") if isinstance(sim.get("note"), dict) else {}
    sim.update(note={**note, UNFINISHED: unfinished})
    sim.update(kind=KIND_SIMULATION, images=previous, **{REWRITING_WITH: settings},
               **{INCOMPLETE: "a simulate run into this folder was interrupted: its measurements may not be the "
                               "ones this record describes; rerun simulate"})
    try:
        nio.write_json(path, sim)
    except OSError as e:
        raise UsageError(cannot_write(e)) from e


def cmd_simulate(args) -> int:
    """Run ``simulate``; exit status 1 when some image failed."""
    log = Log(args.quiet)
    bundle = load_config(args.config or [])
    task = resolve_task(args, bundle, "simulate")
    if TASKS[task.task].estimates == "kernel":  # its operator is a guess until fitted to a photo
        size = task.params.get("kernel_size") or "N"
        raise UsageError(f"--task {task.task} restores a photo whose kernel is unknown; to simulate a shaken photo "
                         f"draw its kernel: simulate --task deblur_motion --param kernel_size={size} (the true kernel "
                         f"lands in kernels/), then restore the measurements with --task {task.task}")
    seed = resolve_seed(args, bundle)
    inp = Path(args.input)
    check_input("--input", inp)
    check_operator_file(task, None)
    images, others = read_inputs("--input", inp)
    if not images and not others:
        raise UsageError(f"--input {inp}: no files")
    source = OperatorSource(task)
    _check_first_image_measurable(images, inp, source, seed)
    read = [("--input", inp)] + [(f"--param {key}", Path(task.params[key])) for key in ("mask_path", "kernel_path")
                                 if task.params.get(key) and Path(task.params[key]).exists()]
    out = check_output_folder(Path(args.output), read, writes=OUTPUT_SUBFOLDERS)
    with folder_lock(out):
        nio.remove_stale_temp_files(out)
        names = input_names(images, inp)
        # an earlier simulation into this folder: its images keep their names; those this run does
        # not simulate stay when it had the same settings (adding an image to a folder), else what
        # it wrote for them is removed below (restore reads the folder)
        previous, previous_settings = _previous_simulation(out, log)
        stems = output_stems(images, names, {r["name"]: Path(r["measurement"]).stem for r in previous})
        if not args.overwrite:
            _refuse_unrecorded(Path(args.output), out, stems, task)
        try:
            held = _unfinished(json.loads((out / SIMULATION_JSON).read_text()))
        except (OSError, ValueError):
            held = []
        unfinished = sorted(set(held) | set(stems))
        failures = [{"name": p.name, "error": nio.unusable_reason(p)} for p in others]
        for f in failures:
            log.error(f"FAILED {f['name']}: {f['error']}")
        settings = json.loads(json.dumps({"simulated_task": task.as_dict(), "simulation_seed": seed,
                                          "bit_depth": args.bit_depth}))
        if images:
            _mark_incomplete(out, previous, settings, unfinished)
        records, disk_full = [], None
        for i, path in enumerate(tqdm(images, desc="simulate", unit="img", disable=args.quiet)):
            try:
                records.append(_simulate_one(i, path, names[i], stems[i], source, task, seed, out, args.bit_depth, log))
            except Exception as e:  # noqa: BLE001 - report, continue with the others
                if isinstance(e, OSError) and e.errno in DISK_FULL:  # every further image would fail alike
                    disk_full = e
                    break
                failures.append({"name": path.name, "error": failure_reason(e)})
                log.error(f"FAILED {path.name}: {failures[-1]['error']}")
        same = (previous_settings.get("bit_depth") in (None, args.bit_depth)  # None: written before it was recorded
                and all(previous_settings.get(k) == v for k, v in settings.items() if k != "bit_depth"))
        kept = []
        if previous and same:  # images not simulated now, or failing now (a read error keeps the good old files)
            redone = set(names) - {f["name"] for f in failures}
            kept = [r for r in previous if r["name"] not in redone and all((out / f).is_file() for f in _files_of(r))]
        sim = _simulation_record(task, seed, args.bit_depth, inp, records + kept, failures)
        left = _still_unfinished(out, unfinished, records + kept)
        if left:
            sim.setdefault("note", {})[UNFINISHED] = left
        try:
            nio.write_json(out / SIMULATION_JSON, sim)
        except OSError as e:
            raise UsageError(cannot_write(e)) from e
        _remove_stale(out, previous, records + kept, log)
        if disk_full is not None:
            raise UsageError(f"{cannot_write(disk_full)}; stopped after {len(records)} of {len(images)} image(s), "
                             f"recorded in {out / SIMULATION_JSON}: free space and rerun the same command")
    noise = "each file's own" if task.noise_sigma is None else task.noise_sigma
    log.info(f"simulated {len(records)} measurement(s) [{task.task}, noise_sigma={noise}]"
             + (f", kept the {len(kept)} of an earlier run with the same settings" if kept else "") + f" -> {out}\n"
             f"restore them with: nfc-dps restore --config {out / SIMULATION_JSON} --output RESULTS_DIR")
    return EXIT_FAILED if failures else EXIT_OK


def measurable_problem(op: Any, image_shape: tuple[int, ...]) -> str | None:
    """Why ``op`` cannot take a measurement of an image of ``image_shape`` that restore can restore
    (a valid-boundary blur whose kernel is larger than the image or than the measurement it
    leaves), or None."""
    h, w = image_shape[-2:]
    try:
        measured = op.measurement_shape(image_shape)
    except KernelLargerThanMeasurement as e:
        return str(e)
    except (ValueError, NotImplementedError):
        return None  # the operator's own error is reported with the image
    try:
        op.image_shape(measured)
    except KernelLargerThanMeasurement as e:
        return f"the {h}x{w} image leaves a measurement restore refuses: {e}"
    except (ValueError, NotImplementedError):
        pass
    return None


def _check_first_image_measurable(images: list[Path], inp: Path, source: OperatorSource, seed: int) -> None:
    """Before anything is written: UsageError naming the first input that reads when the task's
    operator cannot measure it (:func:`measurable_problem`); each later image is checked with its own."""
    for path in images:
        try:
            x, _ = nio.read_image(path)
        except (nio.ImageReadError, OSError):
            continue  # reported by name with the others
        name = input_names([path], inp)[0]
        factor = source.factor()
        h, w = x.shape[0] - x.shape[0] % factor, x.shape[1] - x.shape[1] % factor
        try:
            op, _ = source.build(path.name, (h, w), seed=image_seed(seed, name))
        except (ValueError, TypeError, OSError):
            return  # the image's own operator error is reported with it
        why = measurable_problem(op, (1, 1 if x.ndim == 2 else x.shape[-1], h, w))
        if why:
            raise UsageError(f"{path}: {why}")
        return


def _simulate_one(index: int, path: Path, name: str, stem: str, source: OperatorSource, task: TaskConfig, seed: int,
                  out: Path, bit_depth: int, log: Log) -> dict[str, Any]:
    """Simulate one clean image: write its truth, measurement and kernel or mask; its record."""
    x, info = nio.read_image(path)
    writes = TASKS[task.task].writes_measurement
    if writes is not None:  # the measurement is a file the task writes itself (a JPEG): its noise is the file's
        op_seed, crop, nseed, y = image_seed(seed, name), None, None, None
        op, _ = source.build(path.name, x.shape[:2], seed=op_seed)
    else:
        x, crop, op, y, op_seed, nseed = simulated_measurement(x, path.name, name, source, task.noise_model, seed)
    why = measurable_problem(op, (1, 1 if x.ndim == 2 else x.shape[-1], *x.shape[:2]))
    if why:
        raise ValueError(why)
    for note in input_notes(info, x.shape[:2], op):
        log.info(f"note {path.name}: {note}")
    ext = measurement_extension(task)
    rec = {"index": index, "name": path.name, "measurement": f"measurements/{stem}{ext}",
           "ground_truth": f"ground_truth/{stem}.png", "operator_seed": op_seed,
           "noise_seed": nseed, "crop": crop, "alpha": "dropped" if info.has_alpha else ""}
    nio.write_image(out / rec["ground_truth"], x, info.output_bit_depth)
    if writes is not None:
        writes[1](out / rec["measurement"], x, {**TASKS[task.task].params, **task.params})
    elif ext == ".png":
        nio.write_image(out / rec["measurement"], to_numpy(y), bit_depth)
    else:
        nio.write_measurement(out / rec["measurement"], to_numpy(y))
    kernel = op.blur_kernel()
    if kernel is not None:
        k = kernel.detach().cpu().double().numpy()
        nio.atomic_write_bytes(out / f"kernels/{stem}.npy", npy_bytes(k))
        nio.write_image(out / f"kernels/{stem}.png", k / k.max(), 16)  # a picture; the .npy is exact
        rec["kernel"] = f"kernels/{stem}.npy"
    mask = op.pixel_mask()
    if mask is not None:
        nio.write_image(out / f"masks/{stem}.png", mask.detach().cpu().numpy(), 8)
        rec["mask"] = f"masks/{stem}.png"
    return rec


def simulated_measurement(x: Any, file_name: str, name: str, source: OperatorSource, noise: Any, seed: int):
    """The measurement ``simulate`` takes of clean image ``x`` ((h, w[, C]) in [0, 1]; ``name``: its
    path relative to the input folder, ``file_name`` its file name): (x centre-cropped to a multiple
    of the SR factor, the crop [top, left, h, w] or None, the operator, y (1, C, h', w'), operator
    seed, noise seed). ValueError for an image smaller than the factor or an operator that fails."""
    factor = source.factor()
    h, w = x.shape[:2]
    ch, cw = h - h % factor, w - w % factor
    if min(ch, cw) < 1:
        raise ValueError(f"image {h}x{w} is smaller than the SR factor {factor}")
    crop = None
    if (ch, cw) != (h, w):
        top, left = (h - ch) // 2, (w - cw) // 2
        x = x[top:top + ch, left:left + cw]
        crop = [top, left, ch, cw]
    op_seed = image_seed(seed, name)
    op, _ = source.build(file_name, (ch, cw), seed=op_seed)
    nseed = noise_seed(op_seed)
    gen = torch.Generator().manual_seed(nseed)
    if noise.gaussian_sigma is not None:  # the Gaussian draws as they always were
        y = op.measure(as_batch(x)[0], noise.gaussian_sigma, gen)
    else:
        y = op.measure(as_batch(x)[0], noise=noise, generator=gen)
    return x, crop, op, y, op_seed, nseed


def _units(task: TaskConfig, bit_depth: int) -> str:
    """simulation.json's ``units``: how the measurements are stored, PNG or float TIFF
    (:func:`measurement_extension`)."""
    noise = f"noise_sigma in [0, 1] pixel units (default {DEFAULT_NOISE_SIGMA})"
    if TASKS[task.task].writes_measurement is not None:
        params = {**TASKS[task.task].params, **task.params}
        return (f"measurements are real {measurement_extension(task)} files of the clean images ("
                f"{', '.join(f'{k} {v}' for k, v in params.items())}); each file's noise is its own quantisation's, "
                f"which restore reads from it")
    if measurement_extension(task) == ".png":
        return f"{noise}; measurements are clipped to [0, 1] and stored as {bit_depth}-bit PNG"
    values = [what for what, holds in (
        (f"Poisson counts / peak ({task.noise}): >= 0, above 1 where the peak is low", bool(task.noise)),
        (f"the {task.task} operator's values, of no fixed range", TASKS[task.task].unbounded)) if holds]
    return (f"{noise}; measurements are stored exactly, not clipped, as float32 TIFF ({'; '.join(values)}); "
            f"restore reads them as they are")


def _simulation_record(task: TaskConfig, seed: int, bit_depth: int, inp: Path, images: list[dict[str, Any]],
                       failures: list[dict[str, Any]]) -> dict[str, Any]:
    """simulation.json: the task that restores the images exactly (from their kernel or mask files),
    the simulated task, seeds, units, every image's record and the failures."""
    sim = {
        "kind": KIND_SIMULATION,
        "task": _restore_task_for(task, any("kernel" in r for r in images), any("mask" in r for r in images)),
        "simulated_task": task.as_dict(),
        "simulation_seed": seed,
        "operator_seed": "nfc_dps.cli.common.image_seed(simulation_seed, name): the base seed and the image's "
                         "path relative to the input folder, never its position",
        "noise_seed": "nfc_dps.cli.common.noise_seed(operator_seed): SeedSequence([s, 0x5EED]) -> torch.Generator seed",
        "measurements": "measurements", "ground_truth": "ground_truth",
        "units": _units(task, bit_depth),
        "images": images,
        "bit_depth": bit_depth,
        "command": "simulate", "inputs": str(inp.resolve()),
        "versions": package_versions(),
    }
    if failures:
        sim["note"] = {"failures": failures}
    return sim


def _remove_stale(out: Path, previous: list[dict[str, Any]], images: list[dict[str, Any]], log: Log) -> None:
    """Remove what an earlier simulation wrote for images this one's record does not keep (files
    inside the folder only), and say so."""
    written = {f for rec in images for f in _files_of(rec)}
    stale = [f for rec in previous for f in _files_of(rec) if f not in written and (out / f).is_file()
             and out in (out / f).resolve().parents]
    for f in stale:
        (out / f).unlink()
    if stale:
        log.error(f"note: removed {len(stale)} file(s) that an earlier simulation wrote into {out} and this one "
                  f"does not keep (it ran with other settings: task, noise, seed or bit depth; or its record "
                  f"of them was incomplete)")

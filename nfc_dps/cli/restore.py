"""``nfc-dps restore``: every input image is the measurement y of the task (for SR the output is
``factor`` times larger). Each image's seed is a hash of ``--seed`` and its file name
(:func:`~nfc_dps.cli.common.image_seed`), never its position in the folder, so adding or removing
files changes no other result, and a rerun gives identical images and resumes: images recorded as
done in manifest.json whose outputs still open are skipped (``--overwrite`` redoes them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

from .. import api
from .. import io as nio
from ..config import PER_IMAGE_SEED, ResolvedSampler
from ..conformal import CalibrationError, UnfamiliarImageWarning
from ..distributed import Dist, init_distributed, resolve_device
from ..operators import TASKS
from ..restore_inputs import as_batch
from ..run_record import resolved_config
from ..samplers.common import PriorRangeError, PriorRangeWarning
from .common import (
    DISK_FULL,
    EXIT_FAILED,
    EXIT_OK,
    RESOLVED_JSON,
    STD_PNG_SCALE,
    Log,
    UsageError,
    failure_reason,
    image_seed,
    input_names,
    parse_device,
    prior_key,
    read_inputs,
    set_threads,
    sha256_file,
    sha256_json,
)
from .outputs import OutputError, cannot_write, check_output_folder, output_stems, refuse_unrecorded, run_lock
from .preflight import (
    FirstImage,
    check_measurement_fits,
    check_method_takes_operator,
    first_image,
    first_measurement,
    input_notes,
    open_checked_prior,
    read_measurement,
)
from .records import (
    MANIFEST,
    RECORD_FILES,
    SHARD_DIR,
    STEM_FOLDERS,
    SUMMARY_JSON,
    RunRecords,
    earlier_runs,
    merge_leftover_shards,
    outputs_ok,
    recorded_stems,
)
from .restore_outputs import (
    Item,
    Job,
    add_ground_truth_metrics,
    check_output_names,
    estimate_note,
    measured_frame,
    planned_outputs,
    write_outputs,
)
from .restore_parser import restore_arguments
from .restore_setup import input_folders, load_run_calibration, run_configs, run_sampler, task_with_operator_files
from .tasks import OperatorSource, resolve_task

#: how the console names the noise of a task whose noise is each file's own (jpeg)
FILE_NOISE = "each file's own"
#: the subfolders of the output folder that restore writes (std maps, samples, torchrun's progress)
OUTPUT_SUBFOLDERS = ("std", "samples", "kernels", SHARD_DIR)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``restore`` subcommand (its arguments: :mod:`nfc_dps.cli.restore_parser`)."""
    restore_arguments(sub).set_defaults(func=cmd_restore)


def cmd_restore(args) -> int:
    """Run ``restore``: resolve the task, sampler and folders (UsageError before any work), then the loop."""
    log = Log(args.quiet)
    bundle, inp = run_configs(args, log)
    task = resolve_task(args, bundle)
    inp, gt_dir = input_folders(args, bundle, inp)
    task = task_with_operator_files(args, task)
    sampler, seed, samples = run_sampler(args, bundle)
    args.calibration_loaded = load_run_calibration(args, task, sampler, samples, bundle)
    args.estimates_kernel = TASKS[task.task].estimates == "kernel"  # its outputs include the kernel
    device = parse_device(args.device)
    set_threads(args.threads)
    operator_folders = {flag: Path(task.params[k]) for k, flag in (("mask_path", "--mask"), ("kernel_path", "--kernel"))
                        if k in task.params and Path(task.params[k]).is_dir()}
    operator_files = [(flag, Path(task.params[k])) for k, flag in (("mask_path", "--mask"), ("kernel_path", "--kernel"))
                      if k in task.params and task.params[k] and Path(task.params[k]).is_file()]
    read = [("--input", inp)] + ([("--gt", gt_dir)] if gt_dir else []) + list(operator_folders.items()) + operator_files
    images, others = read_inputs("--input", inp)
    first = first_image(images, any_range=True)  # as each measurement is read: phase retrieval's too
    measurement_in = TASKS[task.task].measurement_in
    if first is not None and measurement_in is not None:
        try:  # a file that holds no measurement of the task (a colour photo to colorize): said up front
            first = first._replace(image=measurement_in(first.image, str(first.path)))
        except ValueError as e:
            raise UsageError(str(e)) from e
    first = first_measurement(task.task, first)  # a task whose operator its file gives: read, or refused
    if first is not None:
        first_name = input_names([first.path], inp)[0]
        check_measurement_fits(OperatorSource(task), first_name, first.path, first.image, first.operator)
        check_method_takes_operator(sampler.method, OperatorSource(task), first_name, first.image,
                                    task.noise_model, sampler.config, first.operator)
    out = check_output_folder(Path(args.output), read, writes=OUTPUT_SUBFOLDERS)
    dist = init_distributed(str(device))
    if dist.world > 1 and device.type == "cuda" and device.index is None:  # torchrun: one GPU per rank
        device = resolve_device("cuda", dist)
    if dist.rank > 0:  # one voice for the progress and the summary; every rank still reports its failures
        log = Log(quiet=True, results=False)

    with run_lock(out, dist):
        if dist.rank == 0:
            nio.remove_stale_temp_files(out)
            try:
                merge_leftover_shards(out, log)
            except OutputError as e:
                raise UsageError(f"{e}; free space and rerun the same command") from e
        dist.barrier()  # every rank reads the complete manifest
        names, stems = _names(args, inp, images, others, out, [gt_dir, *operator_folders.values()], dist, log, samples)
        prior = _checked_prior(args, device, first, sampler, samples, bundle, log)
        record = resolved_config(task, sampler, seed, samples, prior=prior_key(args.prior)["path"],
                                 command="restore", device=str(device), precision=prior.precision, inputs=str(inp.resolve()),
                                 ground_truth=str(gt_dir.resolve()) if gt_dir else None, batch_size=args.batch_size,
                                 max_batch=args.max_batch)
        if dist.rank == 0:
            try:
                nio.write_json(out / RESOLVED_JSON, record)
            except OSError as e:
                raise UsageError(cannot_write(e)) from e
        items = [Item(i, p, names[i], stems[i], image_seed(seed, names[i])) for i, p in enumerate(images)]
        # torchrun: rank r restores the r-th, (r + world)-th, ... file of the sorted list; the
        # results do not depend on the rank (each image's seed comes from its name)
        mine = items[dist.rank::dist.world]
        run = RestoreRun(args, log, task, sampler, prior, device, seed, samples, out, inp, gt_dir, dist,
                         [it.name for it in mine], own_outputs={f"{it.out_stem}.png" for it in items}, first=first)
        if dist.rank == 0:
            try:
                run.records.begin(stems)
            except OSError as e:
                raise UsageError(cannot_write(e)) from e
        return run.run(mine, others if dist.rank == 0 else [], total=len(items))


def _names(args, inp: Path, images: list[Path], others: list[Path], out: Path, also_read: list, dist: Dist,
           log: Log, samples: int = 1) -> tuple[list[str], list[str]]:
    """(names, output stems) of the --input files ``images``, under the run's lock: rank 0 names the
    outputs (from the manifest and the outputs on disk, which other ranks may already be writing)
    and every rank uses its names; --overwrite too: no orphans. Refused here, before any work: an
    output of one input named as another's (:func:`check_output_names`), and, without
    --overwrite, a file the run would replace that no earlier run recorded."""
    if inp.is_dir():
        nested = nio.images_in_subfolders(inp, [out, *[f for f in also_read if f]]) if dist.rank == 0 else 0
        if nested:
            log.error(f"warning: {nested} image(s) in subfolders of {inp} are not restored (restore reads the "
                      f"folder's top level; pass a subfolder as --input to restore its images)")
    if not images and not others:
        raise UsageError(f"--input {inp}: no files to restore")
    names = input_names(images, inp)
    named, error = None, None
    if dist.rank == 0:
        try:
            named = output_stems(images, names, recorded_stems(out))
            _check_outputs(args, out, names, named, samples)
        except UsageError as e:
            error = str(e)
    stems, error = dist.broadcast((named, error))
    if error is not None:
        raise UsageError(error)
    return names, stems


def _check_outputs(args, out: Path, names: list[str], stems: list[str], samples: int) -> None:
    """The run's output names against each other and what the folder records (see :func:`_names`)."""
    earlier = earlier_runs(out)
    kernel = getattr(args, "estimates_kernel", False)
    plan = {name: planned_outputs(stem, samples, args.save_samples, args.calibration_loaded is not None, kernel)
            for name, stem in zip(names, stems)}
    check_output_names(plan, earlier, Path(args.output) / MANIFEST)
    if args.overwrite:
        return
    # every file the run would write, also the new ones of an image the manifest records (more
    # samples, an interval): a file no earlier run wrote is the user's. An entry that lists no
    # outputs (damaged) leaves its image's files to it, as the manifest cannot tell which are whose
    files = [rel for name, outputs in plan.items() if name not in earlier.unlisted for rel, _ in outputs]
    refuse_unrecorded(Path(args.output), out, [*files, *RECORD_FILES], earlier.wrote, STEM_FOLDERS)


def _checked_prior(args, device, first, sampler: ResolvedSampler, samples: int, bundle, log: Log) -> Any:
    """The prior of --prior, checked against the first image and the calibration; a warning when
    the config names another prior than the one in use."""
    prior = open_checked_prior(args, device, first)
    if args.calibration_loaded is not None:
        try:
            args.calibration_loaded.check_run(sampler.method, sampler.config, samples, prior)
        except CalibrationError as e:
            raise UsageError(str(e)) from e
    in_use = prior_key(args.prior)["path"]
    recorded = bundle.recorded_prior
    # the embedded default installed elsewhere (another checkout or machine) is the same prior
    same = recorded is not None and (recorded[0] == in_use or (
        args.prior is None and Path(recorded[0]).parts[-2:] in (("assets", "default_prior"), ("_assets", "default_prior"))))
    if recorded is not None and not same:
        log.error(f"warning: {recorded[1]} was written with the prior {recorded[0]}; "
                  f"this run uses {in_use} (pass --prior {recorded[0]} to restore with that one)")
    return prior


class RestoreRun:
    """The restore loop: each input's measurement and operator (:meth:`_prepare`), batches of
    same-sized images through restore() (:meth:`_restore_jobs`), their outputs, and the run's
    records (:class:`~nfc_dps.cli.records.RunRecords`)."""

    def __init__(self, args, log, task, sampler: ResolvedSampler, prior, device, seed, samples, out, inp, gt_dir,
                 dist: Dist | None = None, names: list[str] | None = None, own_outputs: set[str] = frozenset(),
                 first: FirstImage | None = None) -> None:
        self.args, self.log, self.task, self.sampler = args, log, task, sampler
        # the first input, read by the checks before the run: its measurement is not read again
        self.first = first
        self.own_outputs = set(own_outputs)  # every input's main output name in this run: never removed as stale
        self.prior, self.device, self.seed, self.samples = prior, device, seed, samples
        self.out, self.inp, self.gt_dir = out, inp, gt_dir
        self.source = OperatorSource(task)
        self.config_hash = sha256_json({
            "task": task.as_dict(), "sampler": sampler.as_dict(), "samples": samples,
            "prior": prior_key(args.prior), "precision": prior.precision,  # bfloat16 and float32 differ slightly
            "bit_depth": args.bit_depth, "save_samples": args.save_samples,
            **({"restarts": args.restarts} if args.restarts > 1 else {}),  # earlier runs' keys unchanged
            # a photograph's blur written at the photo's frame (other tasks: earlier runs' keys unchanged)
            **({"frame": "photo"} if not args.keep_border
               and {**TASKS[task.task].params, **task.params}.get("boundary") == "valid" else {}),
        })
        about = {"input": str(inp.resolve()), "output": str(out),
                 "task": task.as_dict(), "method": sampler.method, "preset": sampler.preset,
                 "noise_sigma": task.noise_sigma, **({"noise": task.noise} if task.noise else {}),
                 "seed": seed, "per_image_seed": PER_IMAGE_SEED, "num_samples": samples,
                 **({"restarts": args.restarts} if args.restarts > 1 else {})}
        self.dist = dist or Dist()
        sharded = self.dist.world > 1
        self.records = RunRecords(out, log, about, STD_PNG_SCALE if samples > 1 else None, args.overwrite,
                                  shard=self.dist.rank if sharded else None, shard_names=names)
        self.batch_size, self.max_batch = args.batch_size, args.max_batch
        self.bar: Any = None
        self.calibration = getattr(args, "calibration_loaded", None)
        if self.calibration is not None:  # another calibration is another result: not a resume
            self.config_hash = sha256_json([self.config_hash, self.calibration.to_dict()])

    # -- the loop

    def _record(self, row: dict[str, Any]) -> None:
        """Add a finished image's row (done, skipped or failed) and report a failure or warning."""
        if row["status"] == "failed":
            row["output"] = ""  # it wrote no output
        self.records.rows.append(row)
        self.bar.update(1)
        if row["status"] == "failed":
            self.log.error(f"FAILED {row['name']}: {row['error']}")
        elif row.get("error"):
            self.log.error(f"warning {row['name']}: {row['error']}")

    def run(self, items: list[Item], others: list[Path], total: int | None = None) -> int:
        """Restore ``items`` (this rank's share of ``total`` images), record ``others`` (unusable
        files) as failed; under torchrun merge every rank's records at the end. The exit status."""
        from tqdm.auto import tqdm

        for p in others:
            self.records.rows.append({"index": "", "name": p.name, "status": "failed", "seed": "",
                              "error": nio.unusable_reason(p)})
            self.log.error(f"FAILED {p.name}: {self.records.rows[-1]['error']}")
        shards = f" over {self.dist.world} processes" if self.dist.world > 1 else ""
        noise = (f"noise {self.task.noise}" if self.task.noise else
                 f"noise_sigma={FILE_NOISE if self.task.noise_sigma is None else self.task.noise_sigma}")
        self.log.info(f"restoring {len(items) if total is None else total} image(s){shards} from {self.inp} -> {self.out} "
                      f"[{self.task.task}, {self.sampler.method}/{self.sampler.preset}, {noise}, "
                      f"seed {self.seed} (per image: a hash of it and the file name)]")
        self.bar = tqdm(total=len(items), desc="images", unit="img", disable=self.log.quiet, dynamic_ncols=True)
        pending: dict[tuple, list[Job]] = {}  # jobs waiting for a full batch, by (measurement shape, operator file)
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
                self.records.save()
            for group in pending.values():
                self._restore_jobs(group)
                self.records.save()
            self.records.save(final=True)
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):  # the images written so far are skipped by the rerun
                self.records.write(final=False)
            raise
        except OutputError as e:
            with contextlib.suppress(OSError):  # keep the records of what is done, if they still fit
                self.records.write(final=False)
            done = sum(r["status"] == "done" for r in self.records.rows)
            raise UsageError(f"{e}; stopped (the {done} image(s) restored so far are kept): free space and rerun "
                             f"the same command to resume") from e
        finally:
            self.bar.close()
        if self.dist.world > 1:
            self.dist.barrier()  # every shard saved
            if self.dist.rank == 0:
                self.records.merge_shards(self.dist.world)
            self.dist.barrier()  # summary.json holds every rank's rows
        summary = json.loads((self.out / SUMMARY_JSON).read_text())
        failed, problems = summary["failures"], summary["problems"]
        counts = summary["counts"]
        msg = (f"{counts['restored']} restored, {counts['skipped_done_before']} already done, "
               f"{counts['failed']} failed -> {self.out}")
        if summary["mean_psnr"] is not None:
            msg += f"; mean PSNR {summary['mean_psnr']:.2f} dB, SSIM {summary['mean_ssim'] or float('nan'):.4f} " \
                   f"over {summary['metrics_images']} image(s)"
            scored = summary.get("scored")
            if scored in ("measured frame", "mixed"):
                msg += (" (scored on the frame the measurement saw; the band a valid boundary restores beyond it "
                        "is not scored)" if scored == "measured frame" else
                        " (some on the frame the measurement saw, some whole: see the scored column of results.csv)")
        self.log.result(msg)
        return EXIT_FAILED if failed or problems else EXIT_OK

    def _prepare(self, item: Item) -> dict[str, Any] | Job:
        """The row of an image that needs no restoring (done before, or unusable), else its job:
        the measurement read and its operator built and checked."""
        row = {"index": item.index, "name": item.name, "status": "failed", "seed": item.seed,
               "output": f"{item.out_stem}.png"}
        try:
            input_sha = sha256_file(item.path)
        except OSError as e:
            row["error"] = f"cannot read: {e.strerror or e}"
            return row
        try:
            op_file = self.source.files_for(item.name)
        except ValueError as e:
            row["error"] = str(e)
            return row
        key = sha256_json([self.config_hash, input_sha, item.seed,
                            sha256_file(op_file) if op_file is not None and op_file.is_file() else None])
        entry = None if self.records.overwrite else self.records.images.get(item.name)
        if entry and entry.get("key") == key and outputs_ok(self.out, entry, row["output"]):
            row.update(status="skipped", nfe=entry.get("nfe"), seconds=entry.get("seconds"),
                       size=entry.get("size"), extent=entry.get("extent", ""), alpha=entry.get("alpha", ""),
                       noise_sigma=entry.get("noise_sigma", ""), noise=entry.get("noise", ""))
            add_ground_truth_metrics(row, item, self.gt_dir, self.out, TASKS[self.task.task].rotation_twin,
                                     entry.get("measured_frame"))
            return row
        try:
            operator = None  # built below, unless the file gives it (Task.reads_measurement)
            if self.first is not None and self.first.path == item.path:
                y, info, operator, self.first = self.first.image, self.first.info, self.first.operator, None
            else:
                read = read_measurement(self.task.task, item.path)
                y, info = nio.read_image(item.path, any_range=True)
                if read is not None:
                    operator, y = read
                measurement_in = TASKS[self.task.task].measurement_in
                if measurement_in is not None:
                    y = measurement_in(y, item.name)
            h, w = y.shape[:2]
            if operator is None:
                factor = self.source.factor()
                operator, _ = self.source.build(item.name, (h * factor, w * factor))
            operator = operator.to(self.device)
            # the image the measurement is of: factor times larger for SR, larger by the kernel less one
            # for a blur with boundary 'valid' (the scene beyond the frame that the blur mixed in)
            image_shape = tuple(operator.image_shape((1, 1 if y.ndim == 2 else y.shape[-1], h, w)))
            image_hw = image_shape[-2:]
            expected = tuple(operator.measurement_shape(image_shape)[-2:])
            if expected != (h, w):
                raise ValueError(f"measurement is {h}x{w} but the operator expects {expected[0]}x{expected[1]}")
            for note in input_notes(info, image_hw, operator) if not self.args.quiet else ():
                self.log.error(f"note {item.name}: {note}")  # every rank's images, not under --quiet
        except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
            row["error"] = failure_reason(e)
            self.records.images.pop(item.name, None)
            return row
        # images share a batch only where they share the operator: one read from each file only if equal
        own = sha256_json(operator.describe()) if TASKS[self.task.task].reads_measurement is not None else None
        return Job(item, row, key, y, info, operator, (y.shape, str(op_file) if op_file else None, own))

    def _restore_jobs(self, jobs: list[Job]) -> None:
        """Restore same-sized images that share one operator in one restore() call (each image
        has its own seed, so the results are those of one call per image up to float rounding),
        write their outputs and record their rows. A failing call is retried image by image, so
        one bad image fails alone."""
        import torch

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UnfamiliarImageWarning)
                warnings.simplefilter("always", PriorRangeWarning)
                res = api.restore(torch.cat([as_batch(j.y)[0].to(self.device) for j in jobs]), jobs[0].operator,
                                  prior=self.prior, method=self.sampler.method,
                                  noise=self.task.noise_model,  # kind:auto and auto: estimated per image
                                  seed=[j.item.seed for j in jobs], num_samples=self.samples,
                                  progress=not self.args.quiet, config=self.sampler.config, max_batch=self.max_batch,
                                  calibration=self.calibration, keep_samples=self.args.save_samples,
                                  restarts=self.args.restarts)
        except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise OutputError(e) from e
            if isinstance(e, PriorRangeError):  # the method and the prior do not fit: every image would fail
                raise UsageError(f"--method {self.sampler.method} with this prior: {e}") from e
            if len(jobs) > 1:
                for job in jobs:
                    self._restore_jobs([job])
                return
            self._record(self._failed(jobs[0], e))
            return
        for w in {str(w.message) for w in caught if issubclass(w.category, PriorRangeWarning)}:
            self.log.error(f"note {', '.join(j.item.name for j in jobs)}: {w}")
        if self.calibration is not None and res.std is not None:  # the API's warnings, said per image here
            for b, note in self.calibration.unfamiliar(res.image, res.std):
                self.log.error(f"note {jobs[b].item.name}: {note}")
        for i, job in enumerate(jobs):
            earlier = self.records.forget_before_replacing(job.item.name, job.key)
            frame = measured_frame(job.operator, job.y)
            try:
                entry = write_outputs(self.out, job, res, i, len(jobs), self.args.bit_depth, self.samples,
                                      self.args.save_samples, None if self.args.keep_border else frame)
            except Exception as e:  # noqa: BLE001 - one bad image must not stop the others
                if isinstance(e, OSError) and e.errno in DISK_FULL:
                    raise OutputError(e) from e
                self._record(self._failed(job, e))
                continue
            self.records.remove_unlisted(earlier, entry["outputs"], keep=self.own_outputs)
            entry["key"] = job.key
            if frame is not None:
                entry["measured_frame"] = frame
                # what a valid-boundary blur's restoration holds: the photo's frame or the whole scene
                entry["extent"] = job.row["extent"] = "scene" if self.args.keep_border else "photo"
            self.records.images[job.item.name] = entry
            job.row["status"] = "done"
            if self.task.estimates_noise:  # what it was restored with, as results.csv records it
                self.log.info(f"{job.item.name}: {estimate_note(job.row)}")
            add_ground_truth_metrics(job.row, job.item, self.gt_dir, self.out, TASKS[self.task.task].rotation_twin,
                                     frame)
            self._record(job.row)

    def _failed(self, job: Job, error: Exception) -> dict[str, Any]:
        job.row["error"] = failure_reason(error)
        self.records.images.pop(job.item.name, None)
        return job.row

"""The one benchmark runner (:func:`run_protocol`): every protocol (the grid, the Gaussian oracle,
the Gaussian mixture, the calibration of the std map) supplies its cases and how one case is set up
and measured (:class:`Protocol`); the runner owns the rest: the output folder's record
(config.json and the check that a rerun adds rows of the same configuration only), resume (a
case whose rows are all in the folder is skipped; failed rows are retried), sharding the cases
round-robin over torchrun ranks (:class:`~nfc_dps.distributed.Dist`), the per-rank part files,
their merge into each table's CSV in a canonical order on rank 0, and the summary's header."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch

from ..distributed import Dist, init_distributed, resolve_device
from ..io import atomic_write_text
from ..priors.default import load_prior, prior_identity
from ..priors.training_data import HELDOUT_IMAGES, load_skimage_image
from .instruments import machine_description
from .measurements import _center_crop_zoom
from .spec import DIFFUSION_METHODS, MIXTURE_RECORD_KEY, BenchSpec
from .tables import PartWriter, csv_text, load_results

Row = dict[str, Any]


@dataclass(frozen=True)
class Table:
    """One CSV a protocol writes (OUT/``file``): its ``columns``, the columns that name a row
    (``key``: a rerun skips rows it has), the columns that name the case that wrote it (``case``),
    how a row read back from a file becomes values (``parse``) and how values become the file's
    text (``format``). Part files hold the values as ``str`` writes them (full precision)."""

    file: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    case: tuple[str, ...]
    parse: Callable[[dict[str, str]], Row] = dict
    format: Callable[[Row], dict[str, str]] = dict

    def row_key(self, row: Row) -> tuple[str, ...]:
        return tuple(str(row[c]) for c in self.key)

    def part(self, out: Path, rank: int | str) -> Path:
        """The part file of ``rank`` (results.csv's are OUT/parts/rank{r}.csv)."""
        stem = Path(self.file).stem
        return out / "parts" / (f"rank{rank}.csv" if stem == "results" else f"{stem}-rank{rank}.csv")

    def parts(self, out: Path) -> list[Path]:
        """The part files of every rank in OUT (an interrupted run's, or this run's before the merge)."""
        pattern = self.part(out, "*")
        return sorted(pattern.parent.glob(pattern.name))

    def read(self, out: Path) -> list[Row]:
        """The table's rows in OUT (its CSV, then the part files), parsed."""
        return [self.parse(r) for p in [out / self.file, *self.parts(out)] for r in load_results(p)]

    def write(self, out: Path, rows: Sequence[Row]) -> None:
        atomic_write_text(out / self.file, csv_text([self.format(r) for r in rows], self.columns))


@dataclass(frozen=True)
class Case:
    """One unit of work: ``name`` (the values of its rows' :attr:`Table.case` columns), ``group``
    (cases of one group share a :meth:`Protocol.setup`: a measurement, a posterior), ``keys`` (the
    keys of the rows it writes to the first table: when all are there, the case is done) and
    ``item`` (what the protocol needs to run it)."""

    name: tuple[str, ...]
    group: Hashable
    keys: tuple[tuple[str, ...], ...]
    item: Any = None


class Protocol:
    """What a protocol supplies to :func:`run_protocol`. ``tables``: its CSVs, the first one the
    rows that say whether a case is done. Methods run on every rank unless said otherwise."""

    tables: tuple[Table, ...] = ()

    def __init__(self, spec: BenchSpec) -> None:
        self.spec = spec
        self.device = torch.device("cpu")

    def prepare(self, device: torch.device) -> None:
        """Check the spec and load what the cases need (before config.json is written: a refused
        run leaves its folder as it was)."""
        self.device = device

    def chosen(self, given: Sequence[str], allowed: Sequence[str], flag: str, what: str) -> list[str]:
        """``given`` (the --tasks or --methods list) in ``allowed``, or all of ``allowed`` when empty;
        ValueError naming ``flag``, the unknown ones and ``what`` the protocol has."""
        unknown = [g for g in given if g not in allowed]
        if unknown:
            raise ValueError(f"{flag} {','.join(unknown)}: the {self.spec.protocol} protocol's {what} are "
                             f"{', '.join(allowed)}")
        return list(given or allowed)

    def photo_names(self) -> list[str]:
        """The photographs a held-out tier runs on: --image-names, else the held-out ones, the first
        --num-images of them."""
        names = self.spec.image_names or HELDOUT_IMAGES
        return list(names[: self.spec.num_images] if self.spec.num_images else names)

    def photo_truths(self, names: Sequence[str], zoom: int) -> torch.Tensor:
        """The centre crops of the photographs ``names`` at the spec's size (area-averaged by
        ``zoom``): (N, 3, size, size) float32 on the protocol's device."""
        return torch.stack([torch.from_numpy(_center_crop_zoom(load_skimage_image(n), self.spec.size, zoom))
                            .permute(2, 0, 1) for n in names]).float().to(self.device)

    def record(self) -> dict[str, Any]:
        """What config.json records of the run (:func:`folder_record`)."""
        return folder_record(self.spec, {}, None)

    def cases(self) -> list[Case]:
        raise NotImplementedError

    def setup(self, group: Hashable, log: Callable[[str], None]) -> Any:
        """What the cases of ``group`` share (computed once for consecutive cases of the group)."""
        return None

    def measure(self, ctx: Any, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        """(table file, row) of every row of ``case`` not in ``done`` (first-table keys)."""
        raise NotImplementedError

    def failed(self, row: Row) -> bool:
        """A first-table row a rerun computes again (a method that raised: its reason in ``note``)."""
        return bool(row.get("note"))

    def row_labels(self, rows: Sequence[Row]) -> set[str]:
        """The columns ("method@budget", or "method" in a table without budgets) that first-table
        rows already hold: what a rerun's folder check compares with its own."""
        return {f"{r['method']}@{r['budget']}" if "budget" in r else r["method"] for r in rows}

    def order(self, table: Table, cases: Sequence[Case]) -> Callable[[Row], Any]:
        """The canonical sort key of ``table``'s rows: the order of their cases."""
        index = {c.name: i for i, c in enumerate(cases)}
        return lambda r: index.get(tuple(str(r[c]) for c in table.case), len(index))

    def header(self) -> dict[str, Any]:
        """The protocol's lines of the summary's settings list (rank 0, after the cases)."""
        return {}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        """Write summary.md and any other output from the merged tables (rank 0); returns what
        config.json records besides the folder record and the header."""
        return {}


def run_protocol(protocol: Protocol, log: Callable[[str], None] = print) -> dict[str, list[Row]]:
    """Run (or resume) ``protocol``'s cases into ``protocol.spec.out``; returns the merged tables
    ({file: rows}) on rank 0 (others: {})."""
    spec, t_start = protocol.spec, time.perf_counter()
    d = init_distributed(spec.device)
    device = resolve_device(spec.device, d)
    out, main = spec.out, protocol.tables[0]
    protocol.prepare(device)
    check_protocol(spec, out / "config.json")  # before its rows are read as this protocol's
    existing = main.read(out)
    record, notes = check_folder_record(spec, out / "config.json", protocol.record(), protocol.row_labels(existing))
    cases = protocol.cases()
    d.barrier()
    if d.rank == 0:
        for note in notes:
            log(note)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps({**_saved(out / "config.json"), **record}, indent=1,
                                                          default=str))
    d.barrier()
    done = {main.row_key(r) for r in existing if not protocol.failed(r)}
    prefix = f"[rank {d.rank}] " if d.world > 1 else ""
    _run_cases(protocol, [c for c in cases[d.rank::d.world] if not all(k in done for k in c.keys)], done,
               {t.file: PartWriter(t.part(out, d.rank), t.columns) for t in protocol.tables}, lambda s: log(prefix + s))
    d.barrier()
    tables: dict[str, list[Row]] = {}
    if d.rank == 0:
        tables = {t.file: merge_table(protocol, t, cases) for t in protocol.tables}
        header = run_header(protocol, d, device, time.perf_counter() - t_start)
        extra = protocol.finish(tables, header, log)
        atomic_write_text(out / "config.json", json.dumps({**record, "header": header, **extra}, indent=1, default=str))
    d.barrier()
    if d.initialised:
        import torch.distributed as dist

        dist.destroy_process_group()
    return tables


def _run_cases(protocol: Protocol, cases: Sequence[Case], done: set[tuple], writers: dict[str, PartWriter],
               log: Callable[[str], None]) -> None:
    """Measure ``cases`` in order, the setup of a group once for its consecutive cases, every row
    to its table's part file as it comes."""
    group: Any = object()
    ctx = None
    try:
        for case in cases:
            if case.group != group:
                group, ctx = case.group, protocol.setup(case.group, log)
            for file, row in protocol.measure(ctx, case, done, log):
                writers[file].write(row)
    finally:
        for w in writers.values():
            w.close()


def merge_table(protocol: Protocol, table: Table, cases: Sequence[Case]) -> list[Row]:
    """The table's CSV and part files -> one deduplicated, canonically ordered CSV; parts removed.
    Of two rows with one key the first is kept, unless it is a failed first-table row (a retry's
    replaces it); in the other tables the later one (the case's rerun) is kept."""
    seen: dict[tuple, Row] = {}
    first = table is protocol.tables[0]
    for r in table.read(protocol.spec.out):
        key = table.row_key(r)
        if key not in seen or not first or protocol.failed(seen[key]):
            seen[key] = r
    rows = sorted(seen.values(), key=protocol.order(table, cases))
    table.write(protocol.spec.out, rows)
    for p in table.parts(protocol.spec.out):
        p.unlink()
    with contextlib.suppress(OSError):
        (protocol.spec.out / "parts").rmdir()
    return rows


def run_header(protocol: Protocol, d: Dist, device: torch.device, seconds: float) -> dict[str, Any]:
    """The settings list at the top of summary.md: the label, the date, the protocol's lines, the
    machine, the device and processes, torch and its threads, the wall time."""
    spec, mach = protocol.spec, machine_description()
    h: dict[str, Any] = {"label": spec.label} if spec.label else {}
    h["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    h.update(protocol.header())
    h.update({
        "machine": f"{mach.get('cpu', platform.processor())}, nproc {mach['nproc']}, RAM {mach.get('ram_gib', '?')} GiB"
                   + (f", GPU {mach['gpu']}" if "gpu" in mach else ""),
        "device / processes": f"{device} / {d.world}",
        "torch": mach["torch"],
        "torch threads": torch.get_num_threads(),
        "wall time of this invocation": f"{seconds / 60:.1f} min",
    })
    return h


# --------------------------------------------------------------------------- the folder's record


def prior_record(path: str | None) -> dict[str, Any]:
    """The prior as summary.md and profile.json record it: its folder, whether it is the embedded
    default (then its path is the package's "assets/default_prior", not this machine's), and (when
    it has files) a hash of their contents and the newest file's time."""
    info = prior_identity(path, contents=True)
    if info["embedded_default"]:
        info["path"] = "assets/default_prior"
    return {k: info[k] for k in ("path", "embedded_default", "sha256", "modified") if k in info}


def load_bench_prior(spec: BenchSpec, device: torch.device):
    """The run's prior (--prior, else the embedded default); FileNotFoundError says how to pass one."""
    try:
        return load_prior(spec.prior, device=device, precision=spec.precision)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}\nPass --prior DIR (e.g. runs/prior/export, the training job's export).") from e


def folder_record(spec: BenchSpec, configs: dict[str, Any], prior: dict[str, Any] | None,
                  precision: str | None = None) -> dict[str, Any]:
    """What config.json records so that a rerun into the same folder adds rows only of the same
    configuration: the spec's fingerprint, the resolved sampler config of every diffusion column
    (``configs``: "label@budget" -> config dataclass; the row key leaves them out) and the prior's
    content hash (``prior``: its :func:`prior_record`, None when the run uses no prior) and the
    network's resolved ``precision``."""
    record: dict[str, Any] = {"fingerprint": spec.fingerprint(), "spec": spec_json(spec),
                              "configs": {column: dataclasses.asdict(c) for column, c in configs.items()}}
    if prior is not None:
        record["prior_sha256"] = prior.get("sha256")
    if precision is not None:
        record["precision"] = precision
    return json.loads(json.dumps(record, default=str))  # tuples -> lists, as they are read back


def _saved(cfg_path: Path) -> dict[str, Any]:
    return json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}


def check_protocol(spec: BenchSpec, cfg_path: Path) -> None:
    """Refuse a folder that holds another protocol's results (its record names the protocol;
    records of the mixture and calibration protocols written before they had a fingerprint name it
    by their own keys)."""
    saved = _saved(cfg_path)
    if "fingerprint" in saved:
        old = saved["fingerprint"].get("protocol")
    else:
        old = "mixture" if MIXTURE_RECORD_KEY in saved else "calibration" if "settings" in saved else None
    if old not in (None, spec.protocol):
        raise ValueError(f"{spec.out} holds results of another protocol ({old}, {cfg_path}); use another --out")


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON values differ, as 'key: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_folder_record(spec: BenchSpec, cfg_path: Path, record: dict[str, Any],
                        columns_with_rows: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Refuse to mix rows of another configuration into an existing output folder: another
    protocol, another spec fingerprint, another prior, or a column ("label@budget") with rows whose
    sampler config changed (a preset edited since). Columns without rows (an interrupted run) are
    not compared. Returns the record to save (the configs of the folder's columns that have rows,
    and this run's) and notes for the log (a folder written before configs were recorded)."""
    check_protocol(spec, cfg_path)
    saved = _saved(cfg_path)
    problems, notes = [], []
    old_fp = saved.get("fingerprint")
    if old_fp is not None and old_fp != record["fingerprint"]:
        problems += _differences(old_fp, record["fingerprint"])
    diffusion_rows = any(c.split("@")[0].split(":")[0] in DIFFUSION_METHODS for c in columns_with_rows)
    old_sha, new_sha = saved.get("prior_sha256"), record.get("prior_sha256")
    if diffusion_rows and old_sha and new_sha and old_sha != new_sha:
        problems.append(f"prior (sha256 of its files): {old_sha} -> {new_sha}")
    old_prec, new_prec = saved.get("precision"), record.get("precision")
    if diffusion_rows and old_prec and new_prec and old_prec != new_prec:
        problems.append(f"network precision: {old_prec} -> {new_prec} (--precision)")
    old_settings, new_settings = saved.get("protocol_settings"), record.get("protocol_settings")
    if columns_with_rows and new_settings and old_settings != new_settings:  # e.g. the calibration's image split
        problems.append(f"protocol settings: {old_settings} -> {new_settings}")
    old_configs = {k: v for k, v in saved.get("configs", {}).items() if k in columns_with_rows}
    for column, cfg in record["configs"].items():
        if column in old_configs and old_configs[column] != cfg:
            problems += [f"{column} config {d}" for d in _differences(old_configs[column], cfg)]
    if problems:
        raise ValueError(f"{spec.out} holds results of another configuration ({cfg_path}): "
                         + "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
                         + ". Use another --out")
    if diffusion_rows and saved and "configs" not in saved:
        notes.append(f"note: {cfg_path} predates the record of sampler configs and prior; the rows already "
                     f"in {spec.out} cannot be checked against this run's, which is recorded from now on")
    merged = {**record, "configs": {**old_configs, **record["configs"]}}
    if not new_sha and old_sha and diffusion_rows:
        merged["prior_sha256"] = old_sha
    if not new_prec and old_prec and diffusion_rows:
        merged["precision"] = old_prec
    return merged, notes


def spec_json(spec: BenchSpec) -> dict[str, Any]:
    """The spec as JSON-ready values (paths as strings; the noise as ``sigma_y`` and, where it is
    not Gaussian, its spec), for config.json."""
    out: dict[str, Any] = {}
    for k, v in dataclasses.asdict(spec).items():
        if k == "noise":
            out["sigma_y"] = spec.recorded_sigma()
            out["noise"] = None if spec.noise.gaussian_sigma is not None else str(spec.noise)
        else:
            out[k] = str(v) if isinstance(v, Path) else v
    return out

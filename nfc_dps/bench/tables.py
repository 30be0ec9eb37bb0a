"""The grid's results files and tables: results.csv's columns, the per-rank part files
(:class:`PartWriter`), the canonical row order (:func:`row_order`), and summary.md
(:func:`summary_markdown`)."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .spec import BenchSpec, MethodRun, budget_str

COLUMNS = ["protocol", "task", "image", "method", "estimator", "budget", "nfe", "psnr", "ssim", "mse", "lpips",
           "seconds", "peak_mem_mb", "seed", "note"]
KEY = ("task", "image", "method", "estimator", "budget")
#: columns that legitimately differ between runs (wall time and memory)
VOLATILE = ("seconds", "peak_mem_mb")


def fmt(v: float | None, spec: str) -> str:
    """A number as results.csv writes it: ``spec`` format, None -> empty, NaN / inf as Python spells them."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "" if v is None else str(v)
    return format(v, spec)


#: results.csv's columns that hold numbers (empty allowed; "nan" / "inf" as :func:`fmt` writes them)
NUMBER_COLUMNS = ("nfe", "psnr", "ssim", "mse", "lpips", "seconds", "peak_mem_mb")
#: the columns that name a row and may not be empty
NAME_COLUMNS = ("task", "image", "method", "estimator")


def load_results(path: Path, strict: bool = False) -> list[dict[str, str]]:
    """Rows of a results CSV (missing file: []). ``strict`` (what the report reads): ValueError
    naming the file and the line of the first malformed row (:func:`check_result_row`) or a header
    without one of ``KEY``'s columns."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not strict:
            return [dict(r) for r in reader]
        header = reader.fieldnames or []
        missing = [c for c in KEY if c not in header]
        if missing:
            raise ValueError(f"{path}, line 1: the header has no column {', '.join(missing)} (a results CSV's "
                             f"columns: {','.join(COLUMNS)})")
        rows = []
        for r in reader:
            problem = check_result_row(r, len(header))
            if problem:
                raise ValueError(f"{path}, line {reader.line_num}: malformed row: {problem}")
            rows.append(dict(r))
        return rows


def check_result_row(row: dict[Any, Any], width: int) -> str | None:
    """What is wrong with a row csv.DictReader read from a results CSV of ``width`` columns, or None:
    fields missing or extra, an empty name column (``NAME_COLUMNS``), a budget that is not an int
    >= 0, a number column that is not a number."""
    if None in row:
        return f"{width + len(row[None])} fields, the header has {width}"
    short = [k for k, v in row.items() if v is None]
    if short:
        return f"{width - len(short)} fields, the header has {width} (no {', '.join(short[:3])})"
    empty = [c for c in NAME_COLUMNS if c in row and not row[c].strip()]
    if empty:
        return f"empty {', '.join(empty)}"
    budget = row.get("budget", "")
    if budget and not (budget.isdigit()):
        return f"budget {budget!r} is not an int >= 0"
    for c in NUMBER_COLUMNS:
        v = row.get(c, "")
        if v:
            try:
                float(v)
            except ValueError:
                return f"{c} {v!r} is not a number"
    return None


def is_failed(row: dict[str, str]) -> bool:
    """A row a method failed to produce: no PSNR, the reason in its note (a rerun retries it)."""
    return not row.get("psnr") and bool(row.get("note"))


def csv_text(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    """A CSV's text: the header and ``rows`` in ``columns`` order (a missing value empty)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in columns})
    return buf.getvalue()


class PartWriter:
    """Appends rows to a part file (OUT/parts/rank{r}.csv), flushed row by row (an interrupted run
    keeps them). Values are written as ``str`` writes them (a float in full precision, None empty)."""

    def __init__(self, path: Path, columns: Sequence[str] = COLUMNS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = list(columns)
        new = not self.path.is_file() or self.path.stat().st_size == 0
        self._f = open(self.path, "a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n")
        if new:
            self._w.writeheader()
            self._f.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._w.writerow({c: row.get(c, "") for c in self.columns})
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def row_order(spec: BenchSpec, image_names: Sequence[str]) -> Callable[[dict[str, str]], tuple]:
    """The canonical sort key of rows: the spec's task, image and method order, then estimator and budget."""
    tasks = {t: i for i, t in enumerate(spec.tasks)}
    images = {n: i for i, n in enumerate(image_names)}
    methods = {m: i for i, m in enumerate(spec.methods)}

    def est_rank(e: str) -> tuple[int, str]:
        return (0, e) if e in ("sample", "deterministic") else (1, e)

    def key(r: dict[str, str]) -> tuple:
        return (tasks.get(r["task"], len(tasks)), r["task"], images.get(r["image"], len(images)), r["image"],
                methods.get(r["method"], len(methods)), r["method"], est_rank(r["estimator"]), int(r["budget"] or 0))

    return key


def result_row(spec: BenchSpec, task: str, image: str, run: MethodRun, estimator: str, **vals: Any) -> dict[str, str]:
    """A results row of ``run`` at ``estimator``, numbers formatted as results.csv stores them."""
    return {"protocol": spec.protocol, "task": task, "image": image, "method": run.label, "estimator": estimator,
            "budget": budget_str(run), "nfe": str(vals.get("nfe", 0)), "psnr": fmt(vals.get("psnr"), ".4f"),
            "ssim": fmt(vals.get("ssim"), ".5f"), "mse": fmt(vals.get("mse"), ".6e"),
            "lpips": fmt(vals.get("lpips"), ".4f"), "seconds": fmt(vals.get("seconds"), ".3f"),
            "peak_mem_mb": fmt(vals.get("peak_mem_mb"), ".1f"), "seed": str(vals.get("seed", "")),
            "note": str(vals.get("note", ""))}


def mean_std(vals: list[float]) -> tuple[float, float]:
    """Mean and standard deviation (ddof 1; 0 for one value)."""
    a = np.asarray(vals, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def group_rows(rows: list[dict[str, str]]) -> dict[tuple[str, str, str, str], list[dict[str, str]]]:
    """Rows grouped by (task, method, estimator, budget)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["method"], r["estimator"], r["budget"]), []).append(r)
    return groups


def numbers(rows: list[dict[str, str]], col: str) -> list[float]:
    """The non-empty values of column ``col`` as floats."""
    return [float(r[col]) for r in rows if r.get(col, "") not in ("", None)]


def chain_calls(rows: list[dict[str, str]]) -> list[int]:
    """The network calls one chain of ``rows`` spent, each count once, most first: a row's NFE, over K
    for a ``mean of K`` row (its NFE counts all K chains); failed rows and rows without an NFE left out."""
    out = set()
    for r in rows:
        if is_failed(r) or r.get("nfe", "") in ("", None):
            continue
        est = r.get("estimator", "")
        k = int(est[4:]) if est.startswith("mean") and est[4:].isdigit() else 1
        out.add(round(float(r["nfe"]) / k))
    return sorted(out, reverse=True)


def _calls(counts: Sequence[int]) -> str:
    return "/".join(map(str, counts))


def _spent(groups: dict, tasks: Sequence[str], method: str, est: str, budget: str) -> str:
    """" (8 on denoise)": the tasks whose chains spent other than ``budget`` calls, and what they spent
    ("" when every task spent the budget, and for a classical row)."""
    if budget in ("0", ""):
        return ""
    other: dict[str, list[str]] = {}
    for t in tasks:
        calls = chain_calls(groups.get((t, method, est, budget), []))
        if calls and calls != [int(budget)]:
            other.setdefault(_calls(calls), []).append(t)
    parts = [f"{calls} on {', '.join(ts)}" for calls, ts in other.items()]
    return f" ({'; '.join(parts)})" if parts else ""


def _label(method: str, est: str, budget: str, spent: str = "") -> str:
    """A table row's name: "nfc", "nfc (mean of 4)", with " @budget" for diffusion methods and what
    the tasks that spent other calls spent (``spent``, :func:`_spent`: "nfc:deterministic @16 (8 on denoise)")."""
    lab = method if est in ("sample", "deterministic") else f"{method} ({est.replace('mean', 'mean of ')})"
    return lab if budget in ("0", "") else f"{lab} @{budget}{spent}"


def summary_markdown(spec: BenchSpec, rows: list[dict[str, str]], header: dict[str, Any], notes: Sequence[str],
                     plots: Sequence[str]) -> str:
    """summary.md: settings, PSNR and SSIM tables (mean +- std over images), PSNR vs NFE,
    timing and memory, notes."""
    groups = group_rows(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    order = row_order(spec, [])
    row_keys = sorted({(g[1], g[2], g[3]) for g in groups},
                      key=lambda k: order({"task": "", "image": "", "method": k[0], "estimator": k[1], "budget": k[2]}))
    lines = _settings_section(spec, header)
    lines += _quality_tables(rows, groups, tasks, row_keys)
    lines += _nfe_tables(groups, tasks, row_keys)
    lines += _time_and_memory_table(groups, tasks, row_keys)
    lines += _notes_and_figures(rows, notes, plots)
    return "\n".join(lines)


#: what summary.md's numbers are, under its settings
_VALUES_NOTE = (
    "Values: mean ± std over images (std with ddof=1). PSNR in dB and SSIM (scikit-image "
    "conventions) on outputs clipped to [0, 1], data_range 1. A posterior *sample*'s expected squared "
    "error is twice the posterior mean's, so compare single samples with `mean of K` rows and with the "
    "classical (deterministic) baselines accordingly. `@N` = NFE budget of one chain (a `mean of K` row "
    "costs K times that: its NFE and seconds count all K chains, a single sample's one chain's share); "
    "a task whose chains spent other calls is named with them: `@16 (8 on denoise)` spent 8 calls per chain "
    "on denoise (a `PSNR vs NFE` cell: `(8 calls)`); classical rows use no network. "
    "Peak memory: on CPU the growth of the process's resident memory during the call (memory already held "
    "from earlier calls is not counted, so small runs often show ~0); on CUDA the allocator's peak above "
    "its level at entry.")

#: a table row's (method, estimator, budget)
_RowKey = tuple[str, str, str]


def _table_head(columns: Sequence[str]) -> list[str]:
    """A markdown table's header and rule: a "method" column, then ``columns``."""
    return ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]


def _row_label(groups: dict, tasks: Sequence[str], method: str, est: str, budget: str) -> str:
    """A table row's name, with what the tasks that spent other calls spent (:func:`_label`)."""
    return _label(method, est, budget, _spent(groups, tasks, method, est, budget))


def _settings_section(spec: BenchSpec, header: dict[str, Any]) -> list[str]:
    """The title, the run's settings (``header``) and what the values are."""
    lines = [f"# Benchmark summary ({spec.protocol} protocol)", ""]
    lines += [f"- **{k}**: {v}" for k, v in header.items()]
    return lines + ["", _VALUES_NOTE, ""]


def _quality_tables(rows: list[dict[str, str]], groups: dict, tasks: Sequence[str],
                    row_keys: Sequence[_RowKey]) -> list[str]:
    """PSNR and SSIM per task (mean ± std over images), and LPIPS (mean) where rows have it."""
    lines = []
    for metric, number_format in (("psnr", ".2f"), ("ssim", ".3f")):
        lines += [f"## {metric.upper()} (mean ± std)", ""] + _table_head(tasks)
        for m, e, b in row_keys:
            cells = []
            for t in tasks:
                vals = numbers(groups.get((t, m, e, b), []), metric)
                cells.append(f"{mean_std(vals)[0]:{number_format}} ± {mean_std(vals)[1]:{number_format}}" if vals else "–")
            lines.append(f"| {_row_label(groups, tasks, m, e, b)} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(r.get("lpips") for r in rows):
        lines += ["## LPIPS (mean)", ""] + _table_head(tasks)
        for m, e, b in row_keys:
            cells = [f"{np.mean(v):.3f}" if (v := numbers(groups.get((t, m, e, b), []), "lpips")) else "–" for t in tasks]
            lines.append(f"| {_row_label(groups, tasks, m, e, b)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _nfe_tables(groups: dict, tasks: Sequence[str], row_keys: Sequence[_RowKey]) -> list[str]:
    """PSNR vs NFE budget per task (mean over images), where the rows have more than one budget;
    the classical methods' PSNR repeated in every column."""
    budgets = sorted({int(b) for (_, _, _, b) in groups if b not in ("0", "")})
    if len(budgets) <= 1:
        return []
    lines = ["## PSNR vs NFE (mean over images)", ""]
    for t in tasks:
        lines += [f"**{t}**", ""] + _table_head([str(b) for b in budgets])
        for m, e in dict.fromkeys((m, e) for (m, e, b) in row_keys if b != "0"):
            cells = []
            for b in budgets:  # a cell whose chains spent other than its column's calls says what they spent
                rs = groups.get((t, m, e, str(b)), [])
                v, calls = numbers(rs, "psnr"), chain_calls(rs)
                other = f" ({_calls(calls)} calls)" if calls and calls != [b] else ""
                cells.append(f"{np.mean(v):.2f}{other}" if v else "–")
            if any(c != "–" for c in cells):
                lines.append(f"| {_label(m, e, '0')} | " + " | ".join(cells) + " |")
        for m, e in [(m, e) for (m, e, b) in row_keys if b == "0"]:
            v = numbers(groups.get((t, m, e, "0"), []), "psnr")
            if v:
                lines.append(f"| {m} (no network) | " + " | ".join(f"{np.mean(v):.2f}" for _ in budgets) + " |")
        lines.append("")
    return lines


def _time_and_memory_table(groups: dict, tasks: Sequence[str], row_keys: Sequence[_RowKey]) -> list[str]:
    """Network calls, seconds, seconds per call and peak memory per image (mean over images and
    tasks) of every row that timed its work."""
    lines = ["## Time and memory per image (mean over images and tasks)", ""]
    lines += _table_head(["NFE", "seconds", "s / NFE", "peak memory MB"])
    for m, e, b in row_keys:
        rs = [r for t in tasks for r in groups.get((t, m, e, b), [])]
        secs, mem, nfe = numbers(rs, "seconds"), numbers(rs, "peak_mem_mb"), numbers(rs, "nfe")
        if not secs:
            continue
        n = np.mean(nfe) if nfe else 0
        per = f"{np.mean(secs) / n:.3f}" if n else "–"
        counts = _calls(sorted({round(v) for v in nfe}, reverse=True)) if nfe else "0"  # each, not their mean
        lines.append(f"| {_row_label(groups, tasks, m, e, b)} | {counts} | {np.mean(secs):.2f} | {per} | "
                     f"{f'{np.mean(mem):.0f}' if mem else '–'} |")
    return lines + [""]


def _notes_and_figures(rows: list[dict[str, str]], notes: Sequence[str], plots: Sequence[str]) -> list[str]:
    """The run's notes (each once) and failed rows, then the figures (``plots``: file names)."""
    lines = []
    failed = [r for r in rows if r.get("note")]
    if notes or failed:
        lines += ["## Notes", ""]
        lines += [f"- {n}" for n in dict.fromkeys(notes)]
        lines += [f"- FAILED {r['task']}/{r['image']}/{r['method']}@{r['budget']}: {r['note']}" for r in failed]
        lines.append("")
    if plots:
        lines += ["## Figures", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return lines

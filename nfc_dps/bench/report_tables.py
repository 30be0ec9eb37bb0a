"""The tables of ``nfc-dps bench report`` built from the committed result files: the grids'
(``docs/bench/<name>_results.csv`` captioned from ``<name>_summary.md``), the glance and "which
method" tables, per-image and cost tables, the calibration table and the Gaussian oracle's.
:mod:`nfc_dps.bench.report` places them on the pages.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..baselines import CLASSICAL
from ..samplers import METHODS
from .calibration_report import coverage_table, read_calibration_csv
from .spec import DEFAULT_TASKS, TASK_LABELS
from .tables import group_rows, load_results, mean_std, numbers
from .tier_tables import read_header  # re-exported: the report reads every tier's header

#: the task columns, in order, of the tables whose result files have rows of them
TASKS = (*DEFAULT_TASKS, "denoise")
#: display names, in the order rows are listed (network methods, then the classical answers)
METHOD_NAMES = {**{name: m.display_name for name, m in METHODS.items()},
                **{name: m.label for name, m in CLASSICAL.items()}}
NFC_PRESET_ORDER = ("deterministic", "fast", "fast_psnr", "paper")
DPIR_COLUMNS = ("dpir", "dpir:paper")

# --------------------------------------------------------------------------- sources


@dataclass
class Source:
    """One grid's committed results: its rows and its summary's header lines (``key: value``)."""

    path: Path
    rows: list[dict[str, str]]
    header: dict[str, str] = field(default_factory=dict)

    @property
    def preset(self) -> str:
        """The run's --preset (the one bare method names ran at)."""
        return self.header.get("preset / budgets", "fast").split("/")[0].strip()


def load_source(bench: Path, name: str) -> Source:
    """docs/bench/<name>_results.csv with the header of <name>_summary.md (a missing CSV is an error)."""
    path = bench / f"{name}_results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"result file {path} not found (table sources: nfc_dps/bench/report.py)")
    return Source(path, load_results(path, strict=True), read_header(bench / f"{name}_summary.md"))


def checked_csv(path: Path, strings: Sequence[str], ints: Sequence[str] = (), optional: Sequence[str] = ()) -> Path:
    """``path`` when it is a CSV whose header has ``strings``, ``ints`` and every other column it
    holds a number in each row (``optional`` columns may be absent); ValueError naming the file and
    the line of the first malformed row (too few or many fields, an empty name, an int or number
    that does not parse)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file {path} not found (table sources: nfc_dps/bench/report.py)")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in (*strings, *ints) if c not in header and c not in optional]
        if missing:
            raise ValueError(f"{path}, line 1: the header has no column {', '.join(missing)}")
        for row in reader:
            problem = None
            if None in row:
                problem = f"{len(header) + len(row[None])} fields, the header has {len(header)}"
            elif any(v is None for v in row.values()):
                problem = f"{sum(v is not None for v in row.values())} fields, the header has {len(header)}"
            else:
                for c, v in row.items():
                    if c in strings:
                        problem = None if v.strip() else f"empty {c}"
                    elif c in ints:
                        problem = None if v.strip().lstrip("-").isdigit() else f"{c} {v!r} is not an int"
                    else:
                        try:
                            float(v)
                        except ValueError:
                            problem = f"{c} {v!r} is not a number"
                    if problem:
                        break
            if problem:
                raise ValueError(f"{path}, line {reader.line_num}: malformed row: {problem}")
    return path


def _calibration_csv(path: Path) -> Path:
    return checked_csv(path, ("setting", "method"), ("budget", "k"))


def _conformal_csv(path: Path) -> Path:
    return checked_csv(path, ("setting", "method"), ("budget", "k", "n_validation", "n_test"),
                       optional=("edge_weight", "coverage_se"))


# --------------------------------------------------------------------------- labels and cells


def column_label(method: str, preset: str) -> tuple[str, str]:
    """(display name, preset) of a results row's method column, e.g. "nfc:fast_psnr" -> ("NFC", "fast_psnr")."""
    base, _, explicit = method.partition(":")
    return METHOD_NAMES.get(base, base), explicit or preset


def row_label(method: str, estimator: str, preset: str) -> str:
    """"NFC `deterministic`", "DDNM+ `fast`, mean of 4", "TV"."""
    base = method.partition(":")[0]
    name, p = column_label(method, preset)
    lab = name if base in CLASSICAL else f"{name} `{p}`"
    if estimator.startswith("mean"):
        lab += f", mean of {estimator[4:]}"
    return lab


def _sort_key(key: tuple[str, str, str], preset: str) -> tuple:
    """Network methods first (NFC's presets in NFC_PRESET_ORDER, then the peers), the classical answers last."""
    method, est, budget = key
    base = method.partition(":")[0]
    order = list(METHOD_NAMES)
    p = column_label(method, preset)[1]
    return (base in CLASSICAL, order.index(base) if base in order else len(order),
            NFC_PRESET_ORDER.index(p) if p in NFC_PRESET_ORDER else len(NFC_PRESET_ORDER), p,
            est.startswith("mean"), int(budget or 0))


def _fmt_nfe(rows: list[dict[str, str]]) -> str:
    """The network calls of a row's cells: one number, or each count it takes, most first ("16/8")."""
    n = numbers(rows, "nfe")
    if not n or max(n) == 0:
        return "–"
    return "/".join(str(v) for v in sorted({int(v) for v in n}, reverse=True))


def _caption(src: Source, link: str) -> str:
    """One generated sentence: the file, its images, date and anything the command overrode."""
    h = src.header
    bits = [f"[`{src.path.name}`]({link}{src.path.name})"]
    if "images" in h:
        bits.append(re.sub(r"^(\d+) \(", r"\1 images (", h["images"]))
    if "date" in h:
        bits.append(f"measured {h['date'][:10]}")
    if h.get("seed", "0") != "0":
        bits.append(f"`--seed {h['seed']}`")
    if "overrides" in h:
        try:
            ov = ast.literal_eval(h["overrides"])
            bits.append("with " + ", ".join(f"`--set {m}.{k}={v}`" for m, d in ov.items() for k, v in d.items()))
        except (ValueError, SyntaxError):
            bits.append(f"overrides {h['overrides']}")
    return "; ".join(bits) + "."


def _bold_best(cells: list[list[tuple[float | None, str]]]) -> list[list[str]]:
    """Per column, bold the mean of the best row(s) (the highest mean at the printed precision)."""
    out = [[text for _, text in row] for row in cells]
    for j in range(len(cells[0]) if cells else 0):
        vals = [row[j][0] for row in cells if row[j][0] is not None]
        if len(vals) < 2:
            continue
        best = max(round(v, 2) for v in vals)
        for i, row in enumerate(cells):
            v, text = row[j]
            if v is not None and round(v, 2) == best:
                head, sep, tail = text.partition(" ± ")
                out[i][j] = f"**{head}**{sep}{tail}"
    return out


# --------------------------------------------------------------------------- tables


def grid_table(sources: Sequence[Source], link: str, metric: str = "psnr", std: bool = True,
               tasks: Sequence[str] | None = None, bold: bool = True) -> str:
    """Every (method, estimator, budget) of ``sources`` as a row, mean (± std) over images per task; a column
    that an earlier source already has (same method, estimator and budget) is taken from that one."""
    tasks = list(tasks or [t for t in TASKS if any(r["task"] == t for s in sources for r in s.rows)])
    entries: list[tuple[tuple, str, str, list[dict[str, str]], dict]] = []
    seen: set[tuple[str, str, str]] = set()
    for src in sources:
        groups = group_rows(src.rows)
        keys = sorted({(m, e, b) for (_, m, e, b) in groups}, key=lambda k: _sort_key(k, src.preset))
        for m, e, b in keys:
            if (m, e, b) in seen:  # the same column in an earlier source (e.g. TV in every grid): the first one
                continue
            seen.add((m, e, b))
            per_task = {t: groups.get((t, m, e, b), []) for t in tasks}
            all_rows = [r for rs in per_task.values() for r in rs]
            entries.append((_sort_key((m, e, b), src.preset), row_label(m, e, src.preset), _fmt_nfe(all_rows),
                            all_rows, per_task))
    entries.sort(key=lambda x: x[0])
    cells: list[list[tuple[float | None, str]]] = []
    for _, _, _, _, per_task in entries:
        row = []
        for t in tasks:
            vals = numbers(per_task[t], metric)
            if not vals:
                row.append((None, "–"))
                continue
            m, s = mean_std(vals)
            f = ".2f" if metric == "psnr" else ".3f"
            row.append((m, f"{m:{f}} ± {s:{f}}" if std else f"{m:{f}}"))
        cells.append(row)
    texts = _bold_best(cells) if bold else [[t for _, t in row] for row in cells]
    L = ["| method | NFE | " + " | ".join(TASK_LABELS.get(t, t) for t in tasks) + " |",
         "|---|---|" + "---|" * len(tasks)]
    for (_, label, nfe, _, _), row in zip(entries, texts):
        L.append(f"| {label} | {nfe} | " + " | ".join(row) + " |")
    L += ["", "Source: " + " ".join(_caption(s, link) for s in sources)]
    return "\n".join(L)


def _means(src: Source, method: str) -> dict[str, float]:
    groups = group_rows(src.rows)
    out = {}
    for (t, m, _, _), rs in groups.items():
        if m == method and (v := numbers(rs, "psnr")):
            out[t] = mean_std(v)[0]
    return out


def _best(src: Source, methods: Iterable[str]) -> dict[str, tuple[float, str]]:
    """Per task, the best mean PSNR over ``methods`` and the row label of the method that gave it."""
    best: dict[str, tuple[float, str]] = {}
    for m in methods:
        for t, v in _means(src, m).items():
            if t not in best or v > best[t][0]:
                best[t] = (v, row_label(m, "deterministic", src.preset))
    return best


def glance_table(sized: Sequence[tuple[str, Source]], link: str) -> str:
    """NFC's default against the better DPIR preset and the best classical answer, per image size."""
    L = ["| | " + " | ".join(TASK_LABELS[t] for t in TASKS) + " |", "|---|" + "---|" * len(TASKS)]
    for title, src in sized:
        nfc = _means(src, "nfc:deterministic")
        calls = _fmt_nfe([r for r in src.rows if r["method"] == "nfc:deterministic"])
        rows = [(f"{title}: NFC default ({calls} NFE)", {t: (v, "") for t, v in nfc.items()}),
                (f"{title}: better DPIR preset", _best(src, DPIR_COLUMNS)),
                (f"{title}: best classical", _best(src, CLASSICAL))]
        top = {t: max(d[t][0] for _, d in rows if t in d) for t in TASKS if any(t in d for _, d in rows)}
        for label, d in rows:
            cells = []
            for t in TASKS:
                if t not in d:
                    cells.append("–")
                    continue
                v, who = d[t]
                txt = f"**{v:.2f}**" if round(v, 2) == round(top[t], 2) else f"{v:.2f}"
                cells.append(txt + (f" ({who.replace('DPIR ', '')})" if who else ""))
            L.append(f"| {label} | " + " | ".join(cells) + " |")
    L += ["", "Source: " + " ".join(_caption(s, link) for _, s in sized)]
    return "\n".join(L)


def which_table(det: Source, stoch: Source, link: str, blind: Path | None = None, jpeg: Path | None = None) -> str:
    """README's "which method when": what to call, its network calls, and its 256-px PSNR per task;
    with ``blind`` (a blind protocol's results.csv) a column for the kernel unknown, with ``jpeg`` (the
    jpeg protocol's) one for JPEG files."""
    g_det, g_st = group_rows(det.rows), group_rows(stoch.rows)
    blind_rows = load_results(blind) if blind is not None else []
    jpeg_rows = load_results(jpeg) if jpeg is not None else []

    def value(path: Path | None, r: dict[str, str], column: str) -> float:
        try:
            return float(r[column])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: malformed {column} {r.get(column)!r} in the row of {r.get('method')}, "
                             f"{r.get('image')}") from None

    def blind_value(r: dict[str, str], column: str) -> float:
        return value(blind, r, column)

    def tier_cell(path: Path | None, rows: list[dict[str, str]], method: str) -> str:
        if not rows:
            return ""
        rs = [r for r in rows if r["method"] == method]
        psnrs = [value(path, r, "psnr") for r in rs if r["psnr"] not in ("", "nan")]
        failed = f" (failed on {len(rs) - len(psnrs)} of {len(rs)})" if len(psnrs) < len(rs) else ""
        return (f" | {np.mean(psnrs):.2f}" if psnrs else " | –") + failed

    def blind_cell(method: str) -> str:
        return tier_cell(blind, blind_rows, method)

    def jpeg_cell(method: str) -> str:
        return tier_cell(jpeg, jpeg_rows, method)

    def means(groups, method):
        return {t: mean_std(v)[0] for (t, m, _, _), rs in groups.items() if m == method
                for v in [numbers(rs, "psnr")] if v}

    rows = [("the best single estimate (the default)", "`restore(y, op)`", "nfc:deterministic", g_det),
            ("posterior samples and a per-pixel std map",
             "`restore(y, op, preset=\"fast\", num_levels=25, num_samples=K)`", "nfc", g_st),
            ("a stochastic estimate closer to the posterior mean", "`preset=\"fast_psnr\", num_levels=25`",
             "nfc:fast_psnr", g_st),
            ("DPIR, a published plug-and-play method", "`method=\"dpir\"`", "dpir", g_det),
            ("DPIR at its published 24 iterations", "`method=\"dpir\", preset=\"paper\"`", "dpir:paper", g_det),
            ("DDNM+, a null-space diffusion sampler", "`method=\"ddnm\", num_steps=50`", "ddnm", g_st)]
    blind_of = {"nfc:deterministic": "nfc-blind", "dpir": "dpir-blind"}
    jpeg_of = {"nfc:deterministic": "nfc", "dpir": "dpir"}
    L = ["| you want | call | network calls | " + " | ".join(TASK_LABELS[t] for t in TASKS)
         + (" | blind deblur" if blind_rows else "") + (" | JPEG" if jpeg_rows else "") + " |",
         "|---|---|---|" + "---|" * (len(TASKS) + bool(blind_rows) + bool(jpeg_rows))]
    for want, call, method, groups in rows:
        m = means(groups, method)
        rs = [r for (_, mm, e, _), g in groups.items() if mm == method for r in g]
        nfe = _fmt_nfe(rs) + ("" if all(r["estimator"] == "deterministic" for r in rs) else " per sample")
        L.append(f"| {want} | {call} | {nfe} | " + " | ".join(f"{m[t]:.2f}" if t in m else "–" for t in TASKS)
                 + blind_cell(blind_of.get(method, "")) + jpeg_cell(jpeg_of.get(method, "")) + " |")
    best = _best(det, CLASSICAL)
    L.append("| no network at all | `nfc_dps.baselines.restore_classical` | 0 | "
             + " | ".join(f"{best[t][0]:.2f} ({best[t][1]})" if t in best else "–" for t in TASKS)
             + blind_cell("classical") + (jpeg_cell("qcs_tv") + " (QCS + TV)" if jpeg_rows else "") + " |")
    L += ["", "PSNR in dB, mean over the 3 held-out photos of the 256-px tier (one draw for the sampling rows). "
          "Source: " + _caption(det, link) + " " + _caption(stoch, link)]
    if blind_rows:
        calls = {m: [blind_value(r, "nfe") for r in blind_rows if r["method"] == m and r["nfe"] not in ("", "nan")]
                 for m in ("nfc-blind", "nfc-true")}
        times = (f"{np.mean(calls['nfc-blind']) / np.mean(calls['nfc-true']):.0f} times the default's calls"
                 if calls["nfc-blind"] and calls["nfc-true"] else "the estimation and its restorations")
        L[-1] += (f" Blind deblur: the kernel unknown, `build_operator(\"deblur_blind\", kernel_size=...)` (NFC: "
                  f"{times}), mean over the {len({r['image'] for r in blind_rows})} held-out photos and the "
                  f"{len({r['family'] for r in blind_rows})} kernel families of [docs/blind.md](docs/blind.md); the "
                  f"classical row estimates the kernel by L0 coarse to fine, then TV; source: "
                  f"[`{blind.parent.name}/{blind.name}`]({link}{blind.parent.name}/{blind.name}).")
    if jpeg_rows:
        qualities = sorted({int(str(r["quality"]).lstrip("q")) for r in jpeg_rows})
        L[-1] += (f" JPEG: task `jpeg`, a JPEG file's own tables and noise, the restoration projected onto its "
                  f"quantisation cells, mean over the {len({r['image'] for r in jpeg_rows})} held-out photos at "
                  f"quality {', '.join(map(str, qualities))} of [docs/jpeg.md](docs/jpeg.md) (the decoded files: "
                  f"{np.mean([value(jpeg, r, 'psnr') for r in jpeg_rows if r['method'] == 'decoded']):.2f}); source: "
                  f"[`{jpeg.parent.name}/{jpeg.name}`]({link}{jpeg.parent.name}/{jpeg.name}).")
    return "\n".join(L)


def per_image_table(src: Source, link: str, method: str = "nfc:deterministic",
                    against: Sequence[str] = ("dpir", "dpir:paper", "tv")) -> str:
    """Per task and image: PSNR of ``method`` and of each of ``against``, and ``method`` minus the best
    of the DPIR rows; then ``method``'s seconds per network call on each task over its SR x4 cost."""
    groups = {(t, r["image"], m): r for (t, m, _, _), rs in group_rows(src.rows).items() for r in rs}
    tasks = [t for t in TASKS if any(k[0] == t for k in groups)]
    images = list(dict.fromkeys(r["image"] for r in src.rows))
    heads = [row_label(m, "", src.preset) for m in (method, *against)]
    L = ["| task | image | " + " | ".join(heads) + " | − best DPIR |", "|---|---|" + "---|" * (len(heads) + 1)]
    for t in tasks:
        for im in images:
            vals = [float(groups[(t, im, m)]["psnr"]) if (t, im, m) in groups else None for m in (method, *against)]
            dpir = [v for m, v in zip(against, vals[1:]) if m.startswith("dpir") and v is not None]
            gap = f"{vals[0] - max(dpir):+.2f}" if dpir and vals[0] is not None else "–"
            L.append(f"| {TASK_LABELS.get(t, t)} | {im} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in vals)
                     + f" | {gap} |")
    cost = {t: np.mean([float(r["seconds"]) / int(r["nfe"]) for (tt, _, m), r in groups.items() if tt == t and m == method])
            for t in tasks}
    ratios = ", ".join(f"{TASK_LABELS.get(t, t)} {cost[t] / cost['sr_bicubic']:.2f}×" for t in tasks if t != "sr_bicubic")
    L += ["", f"PSNR in dB per image. Seconds per network call of `{method}` relative to SR ×4: {ratios}. "
              "Source: " + _caption(src, link)]
    return "\n".join(L)


def cost_table(files: Sequence[Path], link: str) -> str:
    """Per task and method, a single process's time per network call (``bench --profile``'s JSON,
    one file per task, all of one image size, image and machine), what of it is the network, and
    that time over the same method's on SR x4."""
    runs = [json.loads(f.read_text()) for f in files]
    setting = {(r["size"], r.get("image"), r["device"], json.dumps(r["machine"].get("cpu"))) for r in runs}
    if len(setting) > 1:
        raise ValueError(f"{', '.join(f.name for f in files)}: profiles of different sizes, images or machines")
    sr = next((r["methods"] for r in runs if r["task"] == "sr_bicubic"), {})
    L = ["| task | method | ms per NFE (whole run) | of which network | relative to SR ×4 |", "|---|---|---|---|---|"]
    for run in runs:
        for m, v in run["methods"].items():
            name = f"| {TASK_LABELS.get(run['task'], run['task'])} | {row_label(m, '', 'fast')} |"
            if "error" in v:
                L.append(f"{name} failed | – | – |")
                continue
            base = sr.get(m, {}).get("per_nfe_s")
            rel = f"{v['per_nfe_s'] / base:.2f}×" if base else "–"
            L.append(f"{name} {1000 * v['per_nfe_s']:.0f} | {1000 * v['network_per_call_s']:.0f} | {rel} |")
    r0 = runs[0]
    where = f"{r0['size']} px, image {r0['image']}" if r0.get("image") else f"{r0['size']} px, one image"
    threads = r0["machine"]["torch_threads"]
    L += ["", f"{where}, one process, {threads} torch thread{'s' * (threads != 1)}, {r0['machine']['cpu']} "
              f"({r0['device']}). Source: " + " ".join(f"[`{f.name}`]({link}{f.parent.name}/{f.name})" for f in files) + "."]
    return "\n".join(L)


def calibration_table(paths: Sequence[Path], link: str) -> str:
    """Coverage of the K-sample std map at ±1 / ±2 std, the largest K of each file, per setting
    (:func:`~nfc_dps.bench.calibration_report.coverage_table`)."""
    rows: list[dict] = []
    columns: dict[str, int] = {}  # setting -> the K of the file it is read from
    for p in paths:
        file_rows = read_calibration_csv(_calibration_csv(p))
        k = max(r["k"] for r in file_rows)
        rows += [r for r in file_rows if r["k"] == k]
        for r in file_rows:
            columns.setdefault(r["setting"], k)
    names = {"gaussian": "Gaussian oracle", "mixture-well-mild-lo": "mixture, one narrow mode",
             "mixture-poor-strong-hi": "mixture, spread over modes"}
    heads = [names.get(s, s.replace("embedded-", "embedded ").replace("_", " ")) for s in columns]
    runs = sorted(dict.fromkeys((r["method"], r["budget"]) for r in rows),
                  key=lambda mb: (mb[0] != "exact", list(METHOD_NAMES).index(mb[0]) if mb[0] in METHOD_NAMES else 99,
                                  mb[1]))

    def label(method: str, budget: int) -> str:
        name = "exact posterior draws" if method == "exact" else f"{METHOD_NAMES.get(method, method)} `fast`"
        return f"{name} | {budget or '–'}"

    L = coverage_table(rows, list(columns.items()), heads, runs, label)
    L.append("| DPIR, NFC `deterministic` and the classical methods (deterministic: no std map) | – | "
             + " | ".join("–" for _ in columns) + " |")
    L += ["", f"% of pixels within ±1 / ±2 sample stds of the mean of K = {'/'.join(str(k) for k in sorted(set(columns.values())))} "
              "chains. Source: " + " ".join(f"[`{p.parent.name}/{p.name}`]({link}{p.parent.name}/{p.name})"
                                            for p in paths) + "."]
    return "\n".join(L)


def read_md_table(path: Path) -> list[dict[str, str]]:
    """The rows of the first markdown table of a file whose header starts with ``| method |``."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| method |"):
            cols = [c.strip() for c in line.strip("|").split("|")]
            out = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                out.append(dict(zip(cols, (c.strip() for c in row.strip("|").split("|")))))
            return out
    raise ValueError(f"{path}: no '| method |' table")


def oracle_rows() -> dict[str, str]:
    """The oracle table's rows (key -> label): the exact bounds, the classical answers, NFC's and
    DAPS's variants, then every other registered method under its display name."""
    return {"exact-mmse": "exact posterior mean (MMSE)", "exact-sample": "exact posterior sample",
            "wiener": "Wiener", "tv": "TV", "daps-iso": "DAPS (isotropic covariance, exact inner step)",
            "nfc-spec-y": "NFC (spectral covariance fitted to y, exact inner step)",
            "nfc-fast-fresh": "NFC `fast`", "nfc-fast_psnr-matched": "NFC `fast_psnr`",
            **{name: m.display_name for name, m in METHODS.items() if name not in ("nfc", "daps")}}


def _bounds(path: Path) -> str:
    """"MMSE 17.88 dB, sample 14.87 dB" from an oracle summary's 'Exact bounds' line."""
    m = re.search(r"\(MMSE\) \*\*([\d.]+) dB\*\*.*?\(2 x MMSE\) \*\*([\d.]+) dB\*\*", path.read_text())
    return f"MMSE {m.group(1)} dB, sample {m.group(2)} dB" if m else "see the summary"


def oracle_table(files: Sequence[tuple[str, Path]], link: str) -> str:
    """The Gaussian oracle: PSNR and, in brackets, the distance to the exact-sample bound, per prior and NFE."""
    tabs = [(title, {(r["method"], r["NFE"]): r for r in read_md_table(p)}) for title, p in files]
    budgets = sorted({int(k[1]) for _, t in tabs for k in t if k[1] != "0"})
    cols = [(title, t, b) for title, t in tabs for b in budgets]
    L = ["| method | " + " | ".join(f"{title}, {b} NFE" for title, _, b in cols) + " |",
         "|---|" + "---|" * len(cols)]
    for key, label in oracle_rows().items():
        cells = []
        for _, t, b in cols:
            r = t.get((key, str(b))) or t.get((key, "0"))
            cells.append(f"{r['PSNR(mean MSE)']} ({r['to sample bound']})" if r else "–")
        if any(c != "–" for c in cells):
            L.append(f"| {label} | " + " | ".join(cells) + " |")
    dates = sorted({read_header(p).get("date", "")[:10] for _, p in files} - {""})
    L += ["", "Exact bounds: " + "; ".join(f"{title}: {_bounds(p)}" for title, p in files) + ". Source: "
          + ", ".join(f"[`{p.name}`]({link}{p.name})" for _, p in files)
          + (f"; measured {' and '.join(dates)}" if dates else "") + "."]
    return "\n".join(L)

"""The calibration protocol's pages: its result files read back, the coverage and conformal tables
(markdown) and the reliability plot."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from ..metrics import expected_coverage


def raw_z(coverage: float) -> float:
    """Half-width in stds of a Gaussian's central ``coverage`` interval (1.645 for 90 %): the
    uncalibrated interval of the raw column."""
    return float(stats.norm.ppf(0.5 + coverage / 2))


def read_calibration_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of an OUT/calibration.csv (numbers parsed), e.g. to redraw the plot."""
    with open(path, newline="") as f:
        return [{"setting": r["setting"], "method": r["method"], "budget": int(r["budget"]), "k": int(r["k"]),
                 "width": float(r["width"]), "observed": float(r["observed"]), "expected": float(r["expected"])}
                for r in csv.DictReader(f)]


def read_conformal_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of an OUT/conformal.csv (numbers parsed; a file without an edge_weight column is a
    rule fitted without it: 0; one without coverage_se has nan there)."""
    ints = ("budget", "k", "n_validation", "n_test")
    with open(path, newline="") as f:
        return [{k: v if k in ("setting", "method") else int(v) if k in ints else float(v)
                 for k, v in {"edge_weight": "0", "coverage_se": "nan", **r}.items()} for r in csv.DictReader(f)]


def mean_rows(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Row-wise mean of ``observed`` over equally laid out row lists (one per image)."""
    return [{**rs[0], "observed": float(np.mean([r["observed"] for r in rs]))} for rs in zip(*parts)]


def coverage_summary(rows: list[dict[str, Any]]) -> str:
    """'cov 61/89 % (K=16)' of the last (setting, method) in ``rows``."""
    last = rows[-1]
    at = {r["width"]: r["observed"] for r in rows if r["setting"] == last["setting"] and r["method"] == last["method"]
          and r["budget"] == last["budget"] and r["k"] == last["k"]}
    return f"coverage {100 * at[1.0]:.0f}/{100 * at[2.0]:.0f} % at ±1/±2 std (K={last['k']})"


def conformal_summary(crows: list[dict[str, Any]]) -> str:
    """'calibrated 90 %: raw 71 -> 89 % (K=16)' of the last (setting, method) in ``crows``."""
    r = crows[-1]
    return (f"{100 * r['nominal']:.0f} % interval on test: {100 * r['raw_coverage']:.0f} % before, "
            f"{100 * r['coverage']:.1f} % calibrated, width {r['width']:.3f} (K={r['k']})")


def conformal_markdown(crows: list[dict[str, Any]]) -> str:
    """The calibrated-interval table: per (setting, method, budget, K), coverage before and after
    calibration on the test measurements, q and the width."""
    if not crows:
        return ""
    nominal = crows[0]["nominal"]
    lines = ["", f"## Calibrated {100 * nominal:g} % intervals (fitted on validation, measured on test)", "",
             _conformal_legend(nominal), ""]
    return "\n".join(lines + conformal_lines(crows)) + "\n"


def _conformal_legend(nominal: float) -> str:
    return (f"before: mean ± {raw_z(nominal):.3f} std (a Gaussian's {100 * nominal:g} % interval); after: mean ± q "
            "(std + c edge(mean) + eps), q and the edge weight c fitted on the validation measurements (pooled rule, "
            "nfc_dps.conformal); width: mean of upper − lower over the test pixel values ([0, 1] units; oracles in "
            "their own units); ± the standard error of the mean coverage over the test images, where the run recorded "
            "it. At the same coverage the narrower interval is the better uncertainty estimate.")


def conformal_lines(crows: list[dict[str, Any]]) -> list[str]:
    """The calibrated-interval table's markdown lines, a row per (setting, method, budget, K)."""
    lines = ["| setting | method | NFE | K | before % | after % | q | c | width | validation / test images |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in crows:
        lines.append(f"| {r['setting']} | {r['method']} | {r['budget']} | {r['k']} | {100 * r['raw_coverage']:.1f} | "
                     f"{_percent_se(r)} | {r['q']:.3f} | {r.get('edge_weight', 0.0):g} | {r['width']:.4f} | "
                     f"{r['n_validation']} / {r['n_test']} |")
    return lines


def _percent_se(r: dict[str, Any]) -> str:
    """'92.2 ± 1.1' (coverage ± its standard error, in %), or '92.2' where none was recorded."""
    se = r.get("coverage_se", float("nan"))
    return f"{100 * r['coverage']:.1f}" + ("" if not np.isfinite(se) else f" ± {100 * se:.1f}")


def conformal_table(paths: Sequence[Path], bench: Path, link: str) -> str:
    """The docs' calibrated-interval table from committed conformal.csv files under ``bench``
    (``link``: the prefix of links to ``bench``)."""
    crows = [r for p in paths for r in read_conformal_csv(p)]
    nominal = crows[0]["nominal"]
    names = [Path(p).relative_to(bench).as_posix() for p in paths]
    sources = " ".join(f"[`{n}`]({link}{n})" for n in names)
    return "\n".join(conformal_lines(crows) + ["", _conformal_legend(nominal) + f" Source: {sources}."])


def coverage_table(rows: list[dict[str, Any]], columns: Sequence[tuple[str, int]], heads: Sequence[str],
                   runs: Sequence[tuple[str, int]], label: Callable[[str, int], str]) -> list[str]:
    """The ±1 / ±2 coverage table (markdown lines): a row per (method, budget) of ``runs``, its first
    cells ``label(method, budget)`` ("name | NFE"), then per (setting, K) of ``columns`` (headed
    ``heads``) the % of pixels within ±1 / ±2 sample stds ("–" where ``rows`` have none)."""
    idx = {(r["setting"], r["method"], r["budget"], r["k"], r["width"]): r["observed"] for r in rows}
    lines = ["| method | NFE | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(columns)]
    for method, budget in runs:
        cells = []
        for s, k in columns:
            a, b = idx.get((s, method, budget, k, 1.0)), idx.get((s, method, budget, k, 2.0))
            cells.append("–" if a is None else f"{100 * a:.0f}/{100 * b:.0f}")
        lines.append(f"| {label(method, budget)} | " + " | ".join(cells) + " |")
    return lines


def calibration_markdown(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """One table: per (method, budget), % of pixels within ±1 / ±2 stds at K = 4 and K = all, per setting."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    ks = sorted({r["k"] for r in rows})
    lines = ["# Calibration of the K-sample std map", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()] + [""]
    lines.append("% of pixels with |mean − truth| within ±1 / ±2 sample stds; " +
                 "; ".join(f"K = {k}: an exact sampler gives {100 * expected_coverage(k, 1):.0f}/"
                           f"{100 * expected_coverage(k, 2):.0f}" for k in ks) + ".")
    lines.append("")
    columns = [(s, k) for s in settings for k in ks]
    lines += coverage_table(rows, columns, [f"{s} K={k}" for s, k in columns],
                            list(dict.fromkeys((r["method"], r["budget"]) for r in rows)), lambda m, b: f"{m} | {b}")
    return "\n".join(lines) + "\n"


def reliability_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Observed against expected coverage over the widths, one panel per setting, K = all chains
    (a colour per method, a line style per NFE budget). Returns False (and draws nothing) when
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(r["k"] for r in rows)
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    ncol = min(3, len(settings))
    nrow = math.ceil(len(settings) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.8 * nrow), squeeze=False)
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "exact"]
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    budgets = sorted({r["budget"] for r in rows if r["method"] != "exact"})
    styles = {b: ("-", ":", "-.", "--")[i % 4] for i, b in enumerate(budgets)}  # NFE budget -> line style
    for ax, s in zip(axes.flat, settings):
        runs = list(dict.fromkeys((r["method"], r["budget"]) for r in rows if r["setting"] == s))
        for method, budget in runs:
            pts = [(r["expected"], r["observed"]) for r in rows
                   if r["setting"] == s and r["method"] == method and r["budget"] == budget and r["k"] == k]
            e, o = zip(*pts)
            if method == "exact":
                ax.plot(e, o, "k--", lw=1.5, label="exact")
            else:
                ax.plot(e, o, styles[budget], color=colours[method], lw=1.1, label=f"{method} @{budget}")
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8)
        ax.set_title(s, fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel(f"expected coverage of an exact sampler (K={k})", fontsize=8)
        ax.set_ylabel("observed coverage", fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[len(settings):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

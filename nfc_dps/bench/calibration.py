"""Calibration of the K-sample uncertainty map (``scripts/calibration.py``).

``restore(..., num_samples=K)`` returns a per-pixel ``std`` over K posterior samples, offered as
an uncertainty map. This protocol measures how often the error of the sample mean lies within c
such stds (:func:`nfc_dps.metrics.coverage`), for c on a grid, on three kinds of problems:

* ``gaussian``: the exact Gaussian oracle, a :class:`~nfc_dps.priors.GaussianSpectralPrior`
  (32 x 32 gray, power law alpha 2, pixel std 0.5 model units) under circulant Gaussian blur of
  std 1.5 px, sigma_y 0.025 ([0, 1] units); its posterior is Gaussian and drawn exactly;
* ``mixture-<setting>``: the Gaussian-mixture oracle of :mod:`nfc_dps.bench.mixture` (a
  multimodal posterior, exact draws), settings named there (default: well-mild-lo, where the
  posterior is one narrow mode, and poor-strong-hi, where it is spread over several);
* ``embedded-<task>``: the embedded prior on the local protocol's measurements (64 px held-out
  photos, sigma_y 0.025); no exact posterior exists, so only the samplers are measured.

Each stochastic sampler of :data:`nfc_dps.samplers.METHODS` runs at its ``fast`` preset at the
stated NFE budget (deterministic configs have no spread and are left out); the oracles add
``exact`` (K exact posterior draws). For an exact sampler with Gaussian pixel posteriors the
expected coverage at width c is P(|T_{K-1}| <= c / sqrt(1 + 1/K))
(:func:`~nfc_dps.metrics.expected_coverage`): 56 / 83 % at c = 1 / 2 for K = 4 and 65 / 93 % for
K = 16 (68.3 / 95.4 % as K grows). K = 4 is measured on disjoint groups of 4 of the K chains.

Writes OUT/calibration.csv (setting, method, budget, k, width, observed, expected: one row per
width, the mean over measurements), OUT/summary.md (the ±1 / ±2 table) and
OUT/reliability.png (observed against expected coverage at every width, K = all chains).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["WIDTHS", "DEFAULT_SETTINGS", "coverage_curve", "calibration_rows", "run_calibration",
           "calibration_markdown", "reliability_plot", "read_calibration_csv"]

#: the widths c (in sample stds) of the reliability curve; 1 and 2 are the table's
WIDTHS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 31))
DEFAULT_SETTINGS = ("gaussian", "mixture-well-mild-lo", "mixture-poor-strong-hi",
                    "embedded-sr4", "embedded-inpaint_random", "embedded-deblur_gaussian")
DEFAULT_SAMPLES = 16
ORACLE_MEASUREMENTS = 8
ORACLE_SIZE = 32
GAUSSIAN_BLUR_STD = 1.5
SIGMA_Y = 0.025
EMBEDDED_IMAGES = ("astronaut", "coffee")
COLUMNS = ["setting", "method", "budget", "k", "width", "observed", "expected"]


def coverage_curve(samples: Tensor, truth: Tensor, widths: Sequence[float] = WIDTHS, group: int | None = None
                   ) -> Tensor:
    """(len(widths),) float64: coverage at each width, averaged over images (and over disjoint
    groups of ``group`` chains when given; None uses all K).

    samples: (K, B, C, H, W); truth: (B, C, H, W); the same units.
    """
    from ..metrics import coverage

    k = samples.shape[0]
    g = k if group is None else int(group)
    if g < 2 or k % g:
        raise ValueError(f"group must be >= 2 and divide K = {k}, got {g}")
    curves = [coverage(samples[i:i + g], truth, tuple(widths)).mean(0) for i in range(0, k, g)]
    return torch.stack(curves).mean(0)


def calibration_rows(setting: str, method: str, budget: int, samples: Tensor, truth: Tensor) -> list[dict[str, Any]]:
    """Rows of calibration.csv for one (setting, method): K = 4 and K = all, every width."""
    from ..metrics import expected_coverage

    k = samples.shape[0]
    rows = []
    for kk in sorted({4, k}):
        if k % kk:
            continue
        curve = coverage_curve(samples, truth, WIDTHS, group=kk)
        rows += [{"setting": setting, "method": method, "budget": budget, "k": kk, "width": c,
                  "observed": float(v), "expected": expected_coverage(kk, c)} for c, v in zip(WIDTHS, curve)]
    return rows


def _stochastic_runs(budget: int, methods: Sequence[str]) -> list[tuple[str, Any]]:
    """(method, config) of every registered sampler whose fast preset at ``budget`` draws samples."""
    from .spec import method_config
    from ..samplers import METHODS

    out = []
    for name in METHODS:
        if methods and name not in methods:
            continue
        cfg = method_config(name, "fast", budget)
        if not cfg.is_deterministic:
            out.append((name, cfg))
    return out


def _run_chains(method: str, cfg: Any, prior, op, y: Tensor, sigma_y: float, k: int, seeds: Sequence[int],
                device: torch.device) -> Tensor:
    """(K, B, C, H, W) samples in [0, 1] units (unclipped) of K chains per measurement of y (B, ...)."""
    from ..api import image_generators
    from ..samplers import get_method

    b = y.shape[0]
    shape = (b * k, *op.image_shape(y.shape)[1:])
    with torch.no_grad():
        x = get_method(method).sample(prior, op, y.repeat_interleave(k, 0), sigma_y, shape, cfg,
                                      image_generators(seeds, k, device=device), None)
    return x.view(b, k, *shape[1:]).transpose(0, 1)


def _oracle_problems(names: Sequence[str], seed: int, device: torch.device) -> Iterator[tuple]:
    """Per oracle setting: (name, prior, op, truth (B, 1, h, w) in [0, 1], y, sigma_y, exact, gen);
    ``exact(k, generator)`` gives (K, B, 1, h, w) exact posterior draws in [0, 1] units, ``gen(*parts)``
    a seeded generator."""
    from ..api import stable_seed
    from ..operators import BlurOperator, gaussian_kernel
    from ..priors import GaussianMixturePrior, GaussianSpectralPrior
    from .mixture import SETTINGS

    def gen(*parts: Any) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(stable_seed(seed, "calibration", *parts))

    n, size = ORACLE_MEASUREMENTS, ORACLE_SIZE
    for name in names:
        if name == "gaussian":
            prior = GaussianSpectralPrior((size, size), alpha=2.0, channels=1, pixel_std=0.5).to(device)
            std, sigma_y = GAUSSIAN_BLUR_STD, SIGMA_Y
            truth_m = prior.sample(n, gen(name, "images"), device=device)
        else:
            st = SETTINGS[name.removeprefix("mixture-")]
            prior = GaussianMixturePrior.structured(size, 1, st.separation, gen(name, "prior")).to(device)
            std, sigma_y = st.blur_std, st.sigma_y
            truth_m = prior.sample_prior(n, gen(name, "images"))
        op = BlurOperator(gaussian_kernel(2 * math.ceil(4 * std) + 1, std), "circular").to(device)
        truth = ((truth_m + 1) / 2).float()
        y = op.measure(truth, sigma_y, gen(name, "noise"))
        y_m, sig_m = 2 * y - 1, 2 * sigma_y
        if name == "gaussian":
            H = op.transfer_function(size, size, dtype=torch.float32, device=device)

            def exact(k: int, g: torch.Generator, prior=prior, y_m=y_m, H=H) -> Tensor:
                xs = prior.posterior_sample(y_m.repeat(k, 1, 1, 1), H, sig_m, g)
                return ((xs + 1) / 2).view(k, *y_m.shape)
        else:
            post = prior.posterior(op, y_m, sig_m)

            def exact(k: int, g: torch.Generator, post=post) -> Tensor:
                return ((post.sample(k, g) + 1) / 2).float()
        yield name, prior, op, truth, y, sigma_y, exact, gen


def _embedded_problems(names: Sequence[str], prior_path: str | None, seed: int, device: torch.device, out: Path):
    """Per task: (name, prior, operators, truths, measurements), one entry per image, the local
    protocol's measurements (cached under ``out``, as the harness caches them)."""
    from .measurements import load_images, measurement
    from .spec import BenchSpec, task_specs
    from ..priors.default import load_prior

    spec = BenchSpec(protocol="local", size=64, sigma_y=SIGMA_Y, seed=seed, out=out,
                     image_names=EMBEDDED_IMAGES, save_images=False)
    prior = load_prior(prior_path, device=device)
    tasks = task_specs("local", spec.size, "circular")
    images = load_images(spec)
    for name in names:
        task = tasks[name.removeprefix("embedded-")]
        ops, truths, ys = [], [], []
        for image, img in images:
            op, x, y, _ = measurement(spec, task, image, img)
            ops.append(op)
            truths.append(x)
            ys.append(y)
        yield name, prior, ops, truths, ys


def run_calibration(out: Path, settings: Sequence[str] = DEFAULT_SETTINGS, budgets: Sequence[int] = (20, 100),
                    embedded_budget: int = 20, k: int = DEFAULT_SAMPLES, methods: Sequence[str] = (),
                    prior_path: str | None = None, seed: int = 0, log: Callable[[str], None] = print
                    ) -> list[dict[str, Any]]:
    """Run the protocol (module doc); write OUT/calibration.csv, summary.md, reliability.png; return the rows."""
    from ..api import stable_seed
    from .instruments import machine_description
    from .spec import MethodRun, not_applicable
    from ..io import atomic_write_text

    from .mixture import SETTINGS
    from .spec import task_specs

    known = ["gaussian"] + [f"mixture-{s}" for s in SETTINGS] + [f"embedded-{t}" for t in task_specs("local", 64, "circular")]
    unknown = [s for s in settings if s not in known]
    if unknown:
        raise ValueError(f"unknown calibration setting(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    t_start = time.perf_counter()
    device = torch.device("cpu")
    rows: list[dict[str, Any]] = []
    oracle = [s for s in settings if not s.startswith("embedded-")]
    embedded = [s for s in settings if s.startswith("embedded-")]
    for name, prior, op, truth, y, sigma_y, exact, gen in _oracle_problems(oracle, seed, device):
        rows += calibration_rows(name, "exact", 0, exact(k, gen(name, "exact")), truth)
        seeds = [stable_seed(seed, "calibration-sampler", name, b) for b in range(truth.shape[0])]
        for budget in budgets:
            for method, cfg in _stochastic_runs(budget, methods):
                t0 = time.perf_counter()
                xs = _run_chains(method, cfg, prior, op, y, sigma_y, k, seeds, device)
                rows += calibration_rows(name, method, budget, xs.double(), truth.double())
                log(f"calibration {name} {method} @{budget}: {_pm(rows)} ({time.perf_counter() - t0:.1f}s)")
    for name, prior, ops, truths, ys in _embedded_problems(embedded, prior_path, seed, device, Path(out) / "local"):
        for method, cfg in _stochastic_runs(embedded_budget, methods):
            if not_applicable(MethodRun(method, embedded_budget, cfg), ops[0]) is not None:
                continue
            t0 = time.perf_counter()
            parts = []
            for i, (op, truth, y) in enumerate(zip(ops, truths, ys)):
                xs = _run_chains(method, cfg, prior, op, y, SIGMA_Y, k, [stable_seed(seed, "calibration", name, i)], device)
                parts.append(calibration_rows(name, method, embedded_budget, xs.double(), truth.double()))
            if not parts:
                continue
            rows += _mean_rows(parts)
            log(f"calibration {name} {method} @{embedded_budget}: {_pm(rows)} ({time.perf_counter() - t0:.1f}s)")
    header = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "K": k, "oracle budgets": ", ".join(map(str, budgets)), "embedded budget": embedded_budget,
        "oracle measurements per setting": ORACLE_MEASUREMENTS, "embedded images": f"{', '.join(EMBEDDED_IMAGES)} (64 px)",
        "prior": prior_path or "embedded default", "seed": seed,
        "machine": machine_description().get("cpu", ""), "torch threads": torch.get_num_threads(),
        "wall time": f"{(time.perf_counter() - t_start) / 60:.1f} min",
    }
    out = Path(out)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: (f"{r[c]:.4f}" if isinstance(r[c], float) and c != "width" else r[c]) for c in COLUMNS})
    atomic_write_text(out / "calibration.csv", buf.getvalue())
    atomic_write_text(out / "summary.md", calibration_markdown(rows, header))
    atomic_write_text(out / "config.json", json.dumps({"settings": list(settings), "header": header}, indent=1))
    plotted = reliability_plot(rows, out / "reliability.png")
    log(f"wrote {out / 'calibration.csv'}, {out / 'summary.md'}"
        + (f" and {out / 'reliability.png'}" if plotted else
           " (matplotlib not installed: no reliability.png; pip install 'nfc_dps[bench]')"))
    return rows


def read_calibration_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of an OUT/calibration.csv (numbers parsed), e.g. to redraw the plot."""
    with open(path, newline="") as f:
        return [{"setting": r["setting"], "method": r["method"], "budget": int(r["budget"]), "k": int(r["k"]),
                 "width": float(r["width"]), "observed": float(r["observed"]), "expected": float(r["expected"])}
                for r in csv.DictReader(f)]


def _mean_rows(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Row-wise mean of ``observed`` over equally laid out row lists (one per image)."""
    return [{**rs[0], "observed": float(np.mean([r["observed"] for r in rs]))} for rs in zip(*parts)]


def _pm(rows: list[dict[str, Any]]) -> str:
    """'cov 61/89 % (K=16)' of the last (setting, method) in ``rows``."""
    last = rows[-1]
    at = {r["width"]: r["observed"] for r in rows if r["setting"] == last["setting"] and r["method"] == last["method"]
          and r["budget"] == last["budget"] and r["k"] == last["k"]}
    return f"coverage {100 * at[1.0]:.0f}/{100 * at[2.0]:.0f} % at ±1/±2 std (K={last['k']})"


def _table_index(rows: list[dict[str, Any]]) -> dict[tuple, float]:
    return {(r["setting"], r["method"], r["budget"], r["k"], r["width"]): r["observed"] for r in rows}


def calibration_markdown(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """One table: per (method, budget), % of pixels within ±1 / ±2 stds at K = 4 and K = all, per setting."""
    from ..metrics import expected_coverage

    idx = _table_index(rows)
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    ks = sorted({r["k"] for r in rows})
    runs = list(dict.fromkeys((r["method"], r["budget"]) for r in rows))
    lines = ["# Calibration of the K-sample std map", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()] + [""]
    lines.append("% of pixels with |mean − truth| within ±1 / ±2 sample stds; " +
                 "; ".join(f"K = {k}: an exact sampler gives {100 * expected_coverage(k, 1):.0f}/"
                           f"{100 * expected_coverage(k, 2):.0f}" for k in ks) + ".")
    lines.append("")
    cols = [f"{s} K={k}" for s in settings for k in ks]
    lines.append("| method | NFE | " + " | ".join(cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    for method, budget in runs:
        cells = []
        for s in settings:
            for k in ks:
                a, b = idx.get((s, method, budget, k, 1.0)), idx.get((s, method, budget, k, 2.0))
                cells.append("–" if a is None else f"{100 * a:.0f}/{100 * b:.0f}")
        lines.append(f"| {method} | {budget} | " + " | ".join(cells) + " |")
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

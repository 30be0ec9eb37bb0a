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

Conformal calibration (:mod:`nfc_dps.conformal`, the ``pooled`` rule at ``coverage``, 90 % by
default) is measured on a validation / test split: q is fitted on validation measurements and
the interval mean ± q (std + eps) is scored on test measurements never used for the fit. K = 4
uses the first 4 chains (what ``restore --samples 4`` draws with the same seed), K = all every
chain. The split:

* oracles: the 8 measurements above are the test set; ``ORACLE_VALIDATION`` (20) more, drawn
  from the same prior with other seeds, are the validation set. Oracle values are not clipped
  (they are not confined to [0, 1]). An exact sampler's calibrated interval should stay at the
  nominal coverage.
* embedded prior: test images are tiles of the held-out photographs ``EMBEDDED_IMAGES``
  (astronaut, coffee), validation images tiles of the other two held-out photographs
  ``VALIDATION_PHOTOS`` (chelsea, camera); the prior was trained on neither
  (:data:`nfc_dps.priors.training_data.HELDOUT_IMAGES`). A tile is a (size·2)-pixel crop
  area-averaged to ``size`` px: the first tile of a photograph is its centre crop (the local
  protocol's image), the next ones adjoin it on a grid (:func:`photo_tiles`), so tiles do not
  overlap. Validation and test images come from different photographs; tiles of one photograph
  are not independent, so the test coverage is that of these photographs, not of photographs in
  general.

Before calibration the interval is mean ± 1.645 std (a Gaussian's 90 % interval; the raw
coverage column), after it mean ± q (std + eps); the width is the mean of upper - lower over the
test pixel values (after clipping to [0, 1] on the embedded prior): at the same coverage, a
narrower interval is the better uncertainty estimate.

Writes OUT/calibration.csv (setting, method, budget, k, width, observed, expected: one row per
width, the mean over measurements), OUT/conformal.csv (setting, method, budget, k, nominal, q,
raw_coverage, coverage, width, n_validation, n_test), OUT/summary.md (the ±1 / ±2 table and the
calibrated-interval table) and OUT/reliability.png (observed against expected coverage at every
width, K = all chains).
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from ..metrics import coverage, expected_coverage
from .spec import method_config, BenchSpec, task_specs, MethodRun, not_applicable, seed_name
from ..samplers import METHODS, get_method
from ..api import image_generators, stable_seed
from ..operators import BlurOperator, gaussian_kernel
from ..priors import GaussianMixturePrior, GaussianSpectralPrior
from .mixture import SETTINGS
from ..priors.training_data import load_skimage_image
from .measurements import _center_crop_zoom, measurement
from ..priors.default import load_prior
from ..conformal import DEFAULT_EPS, interval, fit_quantile, normalized_scores
from .instruments import machine_description
from ..io import atomic_write_text, write_csv
from .calibration_report import (calibration_markdown, conformal_markdown, conformal_summary, coverage_summary,
                                 mean_rows, raw_z, read_calibration_csv, reliability_plot)

__all__ = ["WIDTHS", "DEFAULT_SETTINGS", "coverage_curve", "calibration_rows", "run_calibration",
           "calibration_markdown", "reliability_plot", "read_calibration_csv", "photo_tiles", "conformal_rows",
           "conformal_markdown", "interval_stats"]

#: the widths c (in sample stds) of the reliability curve; 1 and 2 are the table's
WIDTHS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 31))
DEFAULT_SETTINGS = ("gaussian", "mixture-well-mild-lo", "mixture-poor-strong-hi",
                    "embedded-sr_bicubic", "embedded-inpaint_random", "embedded-deblur_gaussian")
DEFAULT_SAMPLES = 16
ORACLE_MEASUREMENTS = 8
ORACLE_SIZE = 32
GAUSSIAN_BLUR_STD = 1.5
SIGMA_Y = 0.025
EMBEDDED_IMAGES = ("astronaut", "coffee")
#: held-out photographs whose tiles are the embedded prior's validation images
VALIDATION_PHOTOS = ("chelsea", "camera")
ORACLE_VALIDATION = 20
DEFAULT_VALIDATION_IMAGES = 9
DEFAULT_COVERAGE = 0.9
COLUMNS = ["setting", "method", "budget", "k", "width", "observed", "expected"]
CONFORMAL_COLUMNS = ["setting", "method", "budget", "k", "nominal", "q", "raw_coverage", "coverage", "width",
                     "n_validation", "n_test"]


def coverage_curve(samples: Tensor, truth: Tensor, widths: Sequence[float] = WIDTHS, group: int | None = None
                   ) -> Tensor:
    """(len(widths),) float64: coverage at each width, averaged over images (and over disjoint
    groups of ``group`` chains when given; None uses all K).

    samples: (K, B, C, H, W); truth: (B, C, H, W); the same units.
    """
    k = samples.shape[0]
    g = k if group is None else int(group)
    if g < 2 or k % g:
        raise ValueError(f"group must be >= 2 and divide K = {k}, got {g}")
    curves = [coverage(samples[i:i + g], truth, tuple(widths)).mean(0) for i in range(0, k, g)]
    return torch.stack(curves).mean(0)


def calibration_rows(setting: str, method: str, budget: int, samples: Tensor, truth: Tensor) -> list[dict[str, Any]]:
    """Rows of calibration.csv for one (setting, method): K = 4 and K = all, every width."""
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
    b = y.shape[0]
    shape = (b * k, *op.image_shape(y.shape)[1:])
    with torch.no_grad():
        x = get_method(method).sample(prior, op, y.repeat_interleave(k, 0), sigma_y, shape, cfg,
                                      image_generators(seeds, k, device=device), None)
    return x.view(b, k, *shape[1:]).transpose(0, 1)


def _oracle_problems(names: Sequence[str], seed: int, device: torch.device, split: str = "test") -> Iterator[tuple]:
    """Per oracle setting: (name, prior, op, truth (B, 1, h, w) in [0, 1], y, sigma_y, exact, gen);
    ``exact(k, generator)`` gives (K, B, 1, h, w) exact posterior draws in [0, 1] units, ``gen(*parts)``
    a seeded generator. ``split``: "test" (the protocol's measurements) or "validation"
    (``ORACLE_VALIDATION`` others of the same prior, drawn from other seeds)."""
    def gen(*parts: Any) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(stable_seed(seed, "calibration", *parts))

    n, size = (ORACLE_MEASUREMENTS if split == "test" else ORACLE_VALIDATION), ORACLE_SIZE
    tag = "" if split == "test" else f"{split}-"
    for name in names:
        if name == "gaussian":
            prior = GaussianSpectralPrior((size, size), alpha=2.0, channels=1, pixel_std=0.5).to(device)
            std, sigma_y = GAUSSIAN_BLUR_STD, SIGMA_Y
            truth_m = prior.sample(n, gen(name, f"{tag}images"), device=device)
        else:
            st = SETTINGS[name.removeprefix("mixture-")]
            prior = GaussianMixturePrior.structured(size, 1, st.separation, gen(name, "prior")).to(device)
            std, sigma_y = st.blur_std, st.sigma_y
            truth_m = prior.sample_prior(n, gen(name, f"{tag}images"))
        op = BlurOperator(gaussian_kernel(2 * math.ceil(4 * std) + 1, std), "circular").to(device)
        truth = ((truth_m + 1) / 2).float()
        y = op.measure(truth, sigma_y, gen(name, f"{tag}noise"))
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


def photo_tiles(photos: Sequence[str], count: int, size: int, zoom: int = 2) -> list[tuple[str, np.ndarray]]:
    """``count`` non-overlapping tiles (name, (size, size, 3) float32), taken from ``photos`` in
    turn: a photograph's first tile is its centre crop of side size·zoom area-averaged to ``size``
    (named as the photograph, the local protocol's image), the next ones the grid cells around it
    nearest the centre (named ``<photo>_r<i>c<j>``)."""
    from PIL import Image

    loaded = {p: load_skimage_image(p) for p in photos}
    cells: dict[str, list[tuple[int, int]]] = {}
    for p, img in loaded.items():
        h, w = img.shape[:2]
        side = min(size * zoom, h, w)
        t0, l0 = (h - side) // 2, (w - side) // 2
        cand = [(i, j) for i in range(-(t0 // side), (h - t0) // side) for j in range(-(l0 // side), (w - l0) // side)]
        cells[p] = sorted(cand, key=lambda c: (c[0] ** 2 + c[1] ** 2, c))
    out: list[tuple[str, np.ndarray]] = []
    taken = {p: 0 for p in photos}
    while len(out) < count:
        progressed = False
        for p in photos:
            if len(out) == count or taken[p] >= len(cells[p]):
                continue
            i, j = cells[p][taken[p]]
            taken[p] += 1
            progressed = True
            img = loaded[p]
            if (i, j) == (0, 0):
                out.append((p, _center_crop_zoom(img, size, zoom)))
                continue
            h, w = img.shape[:2]
            side = min(size * zoom, h, w)
            t, l = (h - side) // 2 + i * side, (w - side) // 2 + j * side
            crop = img[t:t + side, l:l + side]
            chans = [np.asarray(Image.fromarray(crop[..., c].astype(np.float32), mode="F").resize((size, size), Image.BOX))
                     for c in range(crop.shape[2])]
            out.append((f"{p}_r{i}c{j}", np.ascontiguousarray(np.stack(chans, -1))))
        if not progressed:
            raise ValueError(f"{', '.join(photos)} hold fewer than {count} tiles of {size * zoom} px")
    return out


def _embedded_problems(names: Sequence[str], prior_path: str | None, seed: int, device: torch.device, out: Path,
                       size: int = 64, validation_images: int = 0, test_images: int = len(EMBEDDED_IMAGES)):
    """Per task: (name, prior, {split: (operators, truths, measurements, image names)}), one entry
    per image, the local protocol's measurements (cached under ``out``, as the harness caches them);
    splits "test" (tiles of EMBEDDED_IMAGES) and, when ``validation_images`` > 0, "validation"
    (tiles of VALIDATION_PHOTOS)."""
    spec = BenchSpec(protocol="local", size=size, sigma_y=SIGMA_Y, seed=seed, out=out,
                     image_names=EMBEDDED_IMAGES, save_images=False)
    prior = load_prior(prior_path, device=device)
    tasks = task_specs("local", spec.size, "circular")
    images = {"test": photo_tiles(EMBEDDED_IMAGES, test_images, size, spec.zoom)}
    if validation_images:
        images["validation"] = photo_tiles(VALIDATION_PHOTOS, validation_images, size, spec.zoom)
    for name in names:
        task = tasks[name.removeprefix("embedded-")]
        splits = {}
        for split, imgs in images.items():
            ops, truths, ys = [], [], []
            for image, img in imgs:
                op, x, y, _ = measurement(spec, task, image, img)
                ops.append(op)
                truths.append(x)
                ys.append(y)
            splits[split] = (ops, truths, ys, [n for n, _ in imgs])
        yield name, prior, splits


def interval_stats(samples: Sequence[Tensor], truths: Sequence[Tensor], q: float, z: float, clip: bool) -> dict:
    """Test-set numbers of one interval rule: per image, the fraction of pixel values inside
    mean ± q (std + eps) and inside mean ± z std, and the mean width; averaged over images.
    samples: per image (K, B, C, H, W) unclipped chains; truths: (B, C, H, W)."""
    cov, raw, width = [], [], []
    for xs, truth in zip(samples, truths):
        mean, std = _mean_std(xs, clip)
        lo, hi = interval(mean, std, q, DEFAULT_EPS) if clip else (mean - q * (std + DEFAULT_EPS),
                                                                    mean + q * (std + DEFAULT_EPS))
        cov.append(float(((truth >= lo) & (truth <= hi)).double().mean()))
        raw.append(float(((truth - mean).abs() <= z * std).double().mean()))
        width.append(float((hi - lo).double().mean()))
    return {"coverage": float(np.mean(cov)), "raw_coverage": float(np.mean(raw)), "width": float(np.mean(width))}


def _mean_std(xs: Tensor, clip: bool) -> tuple[Tensor, Tensor]:
    """As restore(): the mean of the unclipped chains (clamped to [0, 1] when ``clip``), their std."""
    mean = xs.mean(0)
    return (mean.clamp(0, 1) if clip else mean), xs.std(0)


def conformal_rows(setting: str, method: str, budget: int, validation: Sequence[Tensor], val_truths: Sequence[Tensor],
                   test: Sequence[Tensor], test_truths: Sequence[Tensor], coverage: float = DEFAULT_COVERAGE,
                   clip: bool = True) -> list[dict[str, Any]]:
    """Rows of conformal.csv for one (setting, method): for K = 4 (the first 4 chains) and K = all,
    q fitted on the validation measurements (pooled rule), coverage and width on the test ones.
    validation / test: per measurement, (K, B, C, H, W) chains; each of the B images is one
    calibration image."""
    k = validation[0].shape[0]
    rows = []
    for kk in sorted({4, k}):
        if kk > k:
            continue
        scores = []
        for xs, truth in zip(validation, val_truths):
            mean, std = _mean_std(xs[:kk], clip)
            scores += [normalized_scores(mean[b], std[b], truth[b], DEFAULT_EPS) for b in range(truth.shape[0])]
        q = fit_quantile(scores, coverage, "pooled")
        st = interval_stats([xs[:kk] for xs in test], test_truths, q, raw_z(coverage), clip)
        rows.append({"setting": setting, "method": method, "budget": budget, "k": kk, "nominal": coverage, "q": q,
                     **st, "n_validation": len(scores), "n_test": sum(t.shape[0] for t in test_truths)})
    return rows


def run_calibration(out: Path, settings: Sequence[str] = DEFAULT_SETTINGS, budgets: Sequence[int] = (20, 100),
                    embedded_budget: int = 20, k: int = DEFAULT_SAMPLES, methods: Sequence[str] = (),
                    prior_path: str | None = None, seed: int = 0, log: Callable[[str], None] = print,
                    embedded_size: int = 64, validation_images: int = DEFAULT_VALIDATION_IMAGES,
                    test_images: int = len(EMBEDDED_IMAGES), coverage: float = DEFAULT_COVERAGE
                    ) -> list[dict[str, Any]]:
    """Run the protocol (module doc); write OUT/calibration.csv, conformal.csv, summary.md,
    reliability.png; return the calibration.csv rows. ``validation_images`` 0 skips the conformal
    part on the embedded prior."""

    known = ["gaussian"] + [f"mixture-{s}" for s in SETTINGS] + [f"embedded-{t}" for t in task_specs("local", 64, "circular")]
    unknown = [s for s in settings if s not in known]
    if unknown:
        raise ValueError(f"unknown calibration setting(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    t_start = time.perf_counter()
    device = torch.device("cpu")
    rows: list[dict[str, Any]] = []
    crows: list[dict[str, Any]] = []
    oracle = [s for s in settings if not s.startswith("embedded-")]
    embedded = [s for s in settings if s.startswith("embedded-")]
    for (name, prior, op, truth, y, sigma_y, exact, gen), val in zip(
            _oracle_problems(oracle, seed, device), _oracle_problems(oracle, seed, device, "validation")):
        _, _, _, v_truth, v_y, _, v_exact, _ = val
        xs = exact(k, gen(name, "exact"))
        rows += calibration_rows(name, "exact", 0, xs, truth)
        crows += conformal_rows(name, "exact", 0, [v_exact(k, gen(name, "validation-exact")).double()],
                                [v_truth.double()], [xs.double()], [truth.double()], coverage, clip=False)
        seeds = [stable_seed(seed, "calibration-sampler", name, b) for b in range(truth.shape[0])]
        v_seeds = [stable_seed(seed, "calibration-sampler-validation", name, b) for b in range(v_truth.shape[0])]
        for budget in budgets:
            for method, cfg in _stochastic_runs(budget, methods):
                t0 = time.perf_counter()
                xs = _run_chains(method, cfg, prior, op, y, sigma_y, k, seeds, device).double()
                rows += calibration_rows(name, method, budget, xs, truth.double())
                v_xs = _run_chains(method, cfg, prior, op, v_y, sigma_y, k, v_seeds, device).double()
                crows += conformal_rows(name, method, budget, [v_xs], [v_truth.double()], [xs], [truth.double()],
                                        coverage, clip=False)
                log(f"calibration {name} {method} @{budget}: {coverage_summary(rows)}; {conformal_summary(crows)} "
                    f"({time.perf_counter() - t0:.1f}s)")
    for name, prior, splits in _embedded_problems(embedded, prior_path, seed, device, Path(out) / "local",
                                                  embedded_size, validation_images, test_images):
        ops, truths, ys, _ = splits["test"]
        for method, cfg in _stochastic_runs(embedded_budget, methods):
            if not_applicable(MethodRun(method, embedded_budget, cfg), ops[0]) is not None:
                continue
            t0 = time.perf_counter()
            parts, chains = [], {}
            for split, (s_ops, s_truths, s_ys, s_names) in splits.items():
                chains[split] = []
                for i, (op, truth, y, image) in enumerate(zip(s_ops, s_truths, s_ys, s_names)):
                    # the test split's seeds are those of the local protocol's images (index i)
                    named = seed_name(name)
                    key = (seed, "calibration", named, i) if split == "test" else (seed, "calibration", named, image)
                    xs = _run_chains(method, cfg, prior, op, y, SIGMA_Y, k, [stable_seed(*key)], device).double()
                    chains[split].append(xs)
                    if split == "test":
                        parts.append(calibration_rows(name, method, embedded_budget, xs, truth.double()))
            if not parts:
                continue
            rows += mean_rows(parts)
            msg = f"calibration {name} {method} @{embedded_budget}: {coverage_summary(rows)}"
            if "validation" in splits:
                v_truths = [t.double() for t in splits["validation"][1]]
                crows += conformal_rows(name, method, embedded_budget, chains["validation"], v_truths,
                                        chains["test"], [t.double() for t in truths], coverage, clip=True)
                msg += f"; {conformal_summary(crows)}"
            log(f"{msg} ({time.perf_counter() - t0:.1f}s)")
    header = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "K": k, "oracle budgets": ", ".join(map(str, budgets)), "embedded budget": embedded_budget,
        "oracle measurements per setting": f"{ORACLE_MEASUREMENTS} test, {ORACLE_VALIDATION} validation",
        "embedded images": f"test: {test_images} tile(s) of {', '.join(EMBEDDED_IMAGES)}; validation: "
                           f"{validation_images} tile(s) of {', '.join(VALIDATION_PHOTOS)} ({embedded_size} px)",
        "calibrated coverage": f"{coverage:g} (pooled rule, fitted on validation, measured on test)",
        "prior": prior_path or "embedded default", "seed": seed,
        "machine": machine_description().get("cpu", ""), "torch threads": torch.get_num_threads(),
        "wall time": f"{(time.perf_counter() - t_start) / 60:.1f} min",
    }
    out = Path(out)
    # floats with 4 decimals (write_csv), the exact width and nominal coverage as they were set
    write_csv(out / "calibration.csv", [{**r, "width": str(r["width"])} for r in rows], COLUMNS)
    write_csv(out / "conformal.csv", [{**r, "nominal": str(r["nominal"])} for r in crows], CONFORMAL_COLUMNS)
    atomic_write_text(out / "summary.md", calibration_markdown(rows, header) + conformal_markdown(crows))
    atomic_write_text(out / "config.json", json.dumps({"settings": list(settings), "header": header}, indent=1))
    plotted = reliability_plot(rows, out / "reliability.png")
    log(f"wrote {out / 'calibration.csv'}, {out / 'summary.md'}"
        + (f" and {out / 'reliability.png'}" if plotted else
           " (matplotlib not installed: no reliability.png; pip install 'nfc_dps[bench]')"))
    return rows

"""Calibration of the K-sample uncertainty map (``nfc-dps bench --protocol calibration``).

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
the interval mean ± q (std + c edge(mean) + eps) is scored on test measurements never used for
the fit. K = 4
uses the first 4 chains (what ``restore --samples 4`` draws with the same seed), K = all every
chain. The split:

* oracles: the 8 measurements above are the test set; ``ORACLE_VALIDATION`` (20) more, drawn
  from the same prior with other seeds, are the validation set. Oracle values are not clipped
  (they are not confined to [0, 1]). An exact sampler's calibrated interval should stay at the
  nominal coverage.
* embedded prior: test images are tiles of the four held-out photographs ``EMBEDDED_IMAGES``
  (:data:`nfc_dps.priors.training_data.HELDOUT_IMAGES`: astronaut, coffee, chelsea, camera),
  taken in turn; validation images (:func:`validation_tiles`) are two thirds tiles of
  ``VALIDATION_PHOTOS`` (scikit-image's motorcycle, left view) and one third textured dead leaves
  (:func:`nfc_dps.training.leaves.textured_leaves`); the prior was trained on none of them. A tile
  is a (size·2)-pixel crop area-averaged to ``size`` px: the first tile of a photograph is its
  centre crop (the local protocol's image), the next ones adjoin it on a grid (:func:`photo_tiles`),
  so tiles do not overlap. Tiles of one photograph are not independent, so the test coverage is
  that of these photographs, not of photographs in general.

Before calibration the interval is mean ± 1.645 std (a Gaussian's 90 % interval; the raw
coverage column), after it the fitted rule's mean ± q (std + c edge(mean) + eps)
(:func:`nfc_dps.conformal.fit_rule`: q and the edge weight c fitted on validation); the width is the mean of upper - lower over the
test pixel values (after clipping to [0, 1] on the embedded prior): at the same coverage, a
narrower interval is the better uncertainty estimate.

Writes OUT/calibration.csv (setting, method, budget, k, width, observed, expected: one row per
width, the mean over measurements), OUT/conformal.csv (setting, method, budget, k, nominal, q,
raw_coverage, coverage, coverage_se: its standard error over test images, width, n_validation,
n_test), OUT/summary.md (the ±1 / ±2 table and the calibrated-interval table),
OUT/reliability.png (observed against expected coverage at every width, K = all chains) and, per embedded (setting, method), its draws in
OUT/chains/SETTING_METHOD@BUDGET.npz (:func:`save_chains`: refit a rule without sampling again).
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..conformal import DEFAULT_EPS, EDGE_WEIGHTS, fit_rule, interval
from ..io import atomic_write_bytes, atomic_write_text
from ..metrics import coverage, expected_coverage
from ..noise import GaussianNoise
from ..operators import BlurOperator, build_operator, gaussian_kernel
from ..priors import GaussianMixturePrior, GaussianSpectralPrior
from ..priors.default import load_prior
from ..priors.training_data import HELDOUT_IMAGES, load_skimage_image
from ..restore_inputs import stable_seed
from ..samplers import METHODS, Measurement, sample_chains
from ..training.leaves import textured_leaves
from .calibration_report import (
    calibration_markdown,
    conformal_markdown,
    conformal_summary,
    coverage_summary,
    mean_rows,
    raw_z,
    read_calibration_csv,
    reliability_plot,
)
from .measurements import _center_crop_zoom, measurement
from .mixture import SETTINGS
from .runner import Case, Protocol, Row, Table, folder_record, prior_record
from .spec import BenchSpec, MethodRun, method_config, not_applicable, seed_name, task_specs

__all__ = ["WIDTHS", "DEFAULT_SETTINGS", "coverage_curve", "calibration_rows", "Calibration",
           "calibration_markdown", "reliability_plot", "read_calibration_csv", "photo_tiles", "conformal_rows",
           "conformal_markdown", "interval_stats", "save_chains"]

#: the widths c (in sample stds) of the reliability curve; 1 and 2 are the table's
WIDTHS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 31))
DEFAULT_SETTINGS = ("gaussian", "mixture-well-mild-lo", "mixture-poor-strong-hi",
                    "embedded-sr_bicubic", "embedded-inpaint_random", "embedded-deblur_gaussian")
DEFAULT_SAMPLES = 16
DEFAULT_BUDGETS = (20, 100)
ORACLE_MEASUREMENTS = 8
ORACLE_SIZE = 32
GAUSSIAN_BLUR_STD = 1.5
NOISE = GaussianNoise(0.025)
#: the embedded prior's test photographs, taken in turn
EMBEDDED_IMAGES = HELDOUT_IMAGES
#: embedded test tiles without --num-images: the centre crops of the first two test photographs
DEFAULT_TEST_IMAGES = 2
#: photographs whose tiles are two thirds of the embedded prior's validation images (:func:`validation_tiles`)
VALIDATION_PHOTOS = ("motorcycle_left",)
ORACLE_VALIDATION = 20
DEFAULT_COVERAGE = 0.9
COLUMNS = ["setting", "method", "budget", "k", "width", "observed", "expected"]
CONFORMAL_COLUMNS = ["setting", "method", "budget", "k", "nominal", "q", "edge_weight", "raw_coverage", "coverage",
                     "coverage_se", "width", "n_validation", "n_test"]


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


def _chains(method: str, cfg: Any, prior, op, y: Tensor, noise: GaussianNoise, k: int, seeds: Sequence[int]) -> Tensor:
    """(K, B, C, H, W) samples in [0, 1] units (unclipped) of K chains per measurement of y (B, ...)."""
    x, _ = sample_chains(method, prior, Measurement(op, y, noise), cfg, seeds, num_samples=k)
    return x.view(y.shape[0], k, *x.shape[1:]).transpose(0, 1)


def _oracle_problems(names: Sequence[str], seed: int, device: torch.device, split: str = "test") -> Iterator[tuple]:
    """Per oracle setting: (name, prior, op, truth (B, 1, h, w) in [0, 1], y, noise, exact, gen);
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
            std, noise = GAUSSIAN_BLUR_STD, NOISE
            truth_m = prior.sample(n, gen(name, f"{tag}images"), device=device)
        else:
            st = SETTINGS[name.removeprefix("mixture-")]
            prior = GaussianMixturePrior.structured(size, 1, st.separation, gen(name, "prior")).to(device)
            std, noise = st.blur_std, st.noise
            truth_m = prior.sample_prior(n, gen(name, f"{tag}images"))
        op = BlurOperator(gaussian_kernel(2 * math.ceil(4 * std) + 1, std), "circular").to(device)
        truth = ((truth_m + 1) / 2).float()
        y = op.measure(truth, noise=noise, generator=gen(name, f"{tag}noise"))
        y_m, sig_m = 2 * y - 1, 2 * noise.sigma
        if name == "gaussian":
            H = op.transfer_function(size, size, dtype=torch.float32, device=device)

            def exact(k: int, g: torch.Generator, prior=prior, y_m=y_m, H=H) -> Tensor:
                xs = prior.posterior_sample(y_m.repeat(k, 1, 1, 1), H, sig_m, g)
                return ((xs + 1) / 2).view(k, *y_m.shape)
        else:
            post = prior.posterior(op, y_m, sig_m)

            def exact(k: int, g: torch.Generator, post=post) -> Tensor:
                return ((post.sample(k, g) + 1) / 2).float()
        yield name, prior, op, truth, y, noise, exact, gen


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


def validation_tiles(count: int, size: int, zoom: int = 2) -> list[tuple[str, np.ndarray]]:
    """The embedded prior's ``count`` validation images (name, (size, size, 3) float32): the first
    two thirds tiles of VALIDATION_PHOTOS (:func:`photo_tiles`), the rest textured dead leaves
    (``leaves<i>``, drawn at size·zoom from seed i and area-averaged by zoom, as the tiles are)."""
    photos = photo_tiles(VALIDATION_PHOTOS, (2 * count) // 3, size, zoom)
    leaves = [textured_leaves(size * zoom, np.random.default_rng(i)) for i in range(count - len(photos))]
    return photos + [(f"leaves{i}", img.reshape(size, zoom, size, zoom, 3).mean((1, 3)).astype(np.float32))
                     for i, img in enumerate(leaves)]


def _embedded_problem(name: str, seed: int, out: Path, size: int = 64, validation_images: int = 0,
                      test_images: int = DEFAULT_TEST_IMAGES) -> dict[str, tuple]:
    """A task's {split: (operators, truths, measurements, image names)}, one entry per image, the
    local protocol's measurements (cached under ``out``, as the harness caches them); splits
    "test" (tiles of EMBEDDED_IMAGES) and, when ``validation_images`` > 0, "validation"
    (:func:`validation_tiles`)."""
    spec = BenchSpec(protocol="local", size=size, noise=NOISE, seed=seed, out=out,
                     image_names=EMBEDDED_IMAGES, save_images=False)
    task = task_specs("local", spec.size, "circular")[name.removeprefix("embedded-")]
    images = {"test": photo_tiles(EMBEDDED_IMAGES, test_images, size, spec.zoom)}
    if validation_images:
        images["validation"] = validation_tiles(validation_images, size, spec.zoom)
    splits = {}
    for split, imgs in images.items():
        measured = [measurement(spec, task, image, img) for image, img in imgs]
        splits[split] = ([m[0] for m in measured], [m[1] for m in measured], [m[2] for m in measured],
                         [n for n, _ in imgs])
    return splits


def interval_stats(samples: Sequence[Tensor], truths: Sequence[Tensor], q: float, z: float, clip: bool,
                   edge_weight: float = 0.0) -> dict:
    """Test-set numbers of one interval rule: per image, the fraction of pixel values inside
    mean ± q (std + edge_weight edge(mean) + eps) and inside mean ± z std, and the mean width;
    averaged over images; ``coverage_se``: the standard error of that mean coverage over images
    (nan for one image). samples: per measurement (K, B, C, H, W) unclipped chains; truths: (B, C, H, W)."""
    cov, raw, width = [], [], []  # one value per image of each measurement's batch
    for xs, truth in zip(samples, truths):
        mean, std = _mean_std(xs, clip)
        lo, hi = interval(mean, std, q, DEFAULT_EPS, edge_weight, clip=clip)
        cov += ((truth >= lo) & (truth <= hi)).double().flatten(1).mean(1).tolist()
        raw += ((truth - mean).abs() <= z * std).double().flatten(1).mean(1).tolist()
        width += (hi - lo).double().flatten(1).mean(1).tolist()
    se = float(np.std(cov, ddof=1) / np.sqrt(len(cov))) if len(cov) > 1 else float("nan")
    return {"coverage": float(np.mean(cov)), "coverage_se": se, "raw_coverage": float(np.mean(raw)),
            "width": float(np.mean(width))}


def _mean_std(xs: Tensor, clip: bool) -> tuple[Tensor, Tensor]:
    """As restore(): the mean of the unclipped chains (clamped to [0, 1] when ``clip``), their std."""
    mean = xs.mean(0)
    return (mean.clamp(0, 1) if clip else mean), xs.std(0)


def save_chains(path: Path, chains: dict[str, list[Tensor]], truths: dict[str, Sequence[Tensor]],
                names: dict[str, Sequence[str]]) -> None:
    """One embedded (setting, method)'s draws, to refit an interval rule without sampling again:
    per split ("test", "validation"), ``SPLIT_chains`` (N, K, B, C, H, W), ``SPLIT_truth``
    (N, B, C, H, W), float32 in [0, 1] units (chains unclipped), N measurements of B images, and
    ``SPLIT_names`` (N,), each measurement's tile name."""
    arrays = {}
    for split, xs in chains.items():
        arrays[f"{split}_chains"] = np.stack([x.float().cpu().numpy() for x in xs])
        arrays[f"{split}_truth"] = np.stack([t.float().cpu().numpy() for t in truths[split]])
        arrays[f"{split}_names"] = np.array([str(n) for n in names[split]])
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def conformal_rows(setting: str, method: str, budget: int, validation: Sequence[Tensor], val_truths: Sequence[Tensor],
                   test: Sequence[Tensor], test_truths: Sequence[Tensor], coverage: float = DEFAULT_COVERAGE,
                   clip: bool = True, rule: str = "pooled",
                   edge_weights: Sequence[float] = EDGE_WEIGHTS) -> list[dict[str, Any]]:
    """Rows of conformal.csv for one (setting, method): for K = 4 (the first 4 chains) and K = all,
    the rule (q and the edge weight, :func:`~nfc_dps.conformal.fit_rule`) fitted on the
    validation measurements, coverage and width on the test ones.
    validation / test: per measurement, (K, B, C, H, W) chains; each of the B images is one
    calibration image."""
    k = validation[0].shape[0]
    rows = []
    for kk in sorted({4, k}):
        if kk > k:
            continue
        images = []
        for xs, truth in zip(validation, val_truths):
            mean, std = _mean_std(xs[:kk], clip)
            images += [(mean[b], std[b], truth[b]) for b in range(truth.shape[0])]
        fit = fit_rule(images, coverage, rule, edge_weights=edge_weights)
        st = interval_stats([xs[:kk] for xs in test], test_truths, fit.q, raw_z(coverage), clip, fit.edge_weight)
        rows.append({"setting": setting, "method": method, "budget": budget, "k": kk, "nominal": coverage, "q": fit.q,
                     "edge_weight": fit.edge_weight, **st, "n_validation": len(images),
                     "n_test": sum(t.shape[0] for t in test_truths)})
    return rows


def _parse(row: dict[str, str]) -> Row:
    """A calibration.csv or conformal.csv row read back: counts as ints, the measures as floats."""
    return {k: (v if k in ("setting", "method") else None if v in ("", None)
                else int(v) if k in ("budget", "k", "n_validation", "n_test") else float(v)) for k, v in row.items()}


def _formatter(exact: str) -> Callable[[Row], dict[str, str]]:
    """Floats with 4 decimals, column ``exact`` (calibration.csv's width, conformal.csv's nominal
    coverage) as it was set."""
    def format_row(row: Row) -> dict[str, str]:
        return {k: (str(v) if k == exact and v is not None else f"{v:.4f}" if isinstance(v, float) and math.isfinite(v)
                    else "" if v is None or isinstance(v, float) else str(v)) for k, v in row.items()}

    return format_row


CASE = ("setting", "method", "budget")
CALIBRATION = Table("calibration.csv", tuple(COLUMNS), ("setting", "method", "budget", "k", "width"), CASE,
                    _parse, _formatter("width"))
CONFORMAL = Table("conformal.csv", tuple(CONFORMAL_COLUMNS), ("setting", "method", "budget", "k"), CASE,
                  _parse, _formatter("nominal"))


class Calibration(Protocol):
    """The calibration protocol through the benchmark runner (module doc): ``--tasks`` its
    settings, ``--budgets`` the oracles' NFE, ``--embedded-budget``, ``--samples`` K (default 16),
    ``--num-images`` the embedded test tiles (default 2), ``--validation-images``, ``--coverage``.
    A case is one (setting, method, budget)."""

    tables = (CALIBRATION, CONFORMAL)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.settings = tuple(spec.tasks) or DEFAULT_SETTINGS
        known = ["gaussian"] + [f"mixture-{s}" for s in SETTINGS] + [f"embedded-{t}" for t in
                                                                     task_specs("local", 64, "circular")]
        unknown = [s for s in self.settings if s not in known]
        if unknown:
            raise ValueError(f"unknown calibration setting(s) {', '.join(unknown)}; choose from {', '.join(known)}")
        self.k = spec.samples if spec.samples > 1 else DEFAULT_SAMPLES
        if self.k % 4:
            raise ValueError(f"--samples must be a multiple of 4 (K = 4 is measured on groups of 4), got {self.k}")
        self.budgets = tuple(spec.budgets) or DEFAULT_BUDGETS
        self.test_images = spec.num_images or DEFAULT_TEST_IMAGES
        self.embedded = [s for s in self.settings if s.startswith("embedded-")]
        self.prior_info = prior_record(spec.prior) if self.embedded else None
        self.prior = None

    def record(self) -> dict[str, Any]:
        budgets = self.budgets + ((self.spec.embedded_budget,) if self.embedded else ())
        configs = {f"{m}@{b}": cfg for b in dict.fromkeys(budgets) for m, cfg in _stochastic_runs(b, self.spec.methods)}
        split = {"test": list(EMBEDDED_IMAGES), "validation": [*VALIDATION_PHOTOS, "textured leaves"],
                 "test tiles": self.test_images}
        return {**folder_record(self.spec, configs, self.prior_info),
                "protocol_settings": {"embedded split": split} if self.embedded else {}}

    def _case(self, name: str, method: str, budget: int, item: Any = None) -> Case:
        keys = tuple((name, method, str(budget), str(kk), str(c)) for kk in sorted({4, self.k}) for c in WIDTHS)
        return Case((name, method, str(budget)), name, keys, item)

    def cases(self) -> list[Case]:
        out = []
        for name in self.settings:
            if name not in self.embedded:
                out.append(self._case(name, "exact", 0))
                out += [self._case(name, m, b, cfg) for b in self.budgets for m, cfg in _stochastic_runs(b, self.spec.methods)]
                continue
            task = task_specs("local", self.spec.size, "circular")[name.removeprefix("embedded-")]
            op = build_operator(task.name, self.spec.size, 0, **task.params)
            b = self.spec.embedded_budget
            out += [self._case(name, m, b, cfg) for m, cfg in _stochastic_runs(b, self.spec.methods)
                    if not_applicable(MethodRun(m, b, cfg), op) is None]
        return out

    def setup(self, group: Hashable, log: Callable[[str], None]) -> tuple:
        """An oracle's (test problem, validation problem) (:func:`_oracle_problems`), or an
        embedded setting's splits (:func:`_embedded_problem`)."""
        spec = self.spec
        if group in self.embedded:
            if self.prior is None:
                self.prior = load_prior(spec.prior, device=self.device, precision=spec.precision)
            return _embedded_problem(group, spec.seed, spec.out / "local", spec.size, spec.validation_images,
                                     self.test_images)
        return (next(_oracle_problems([group], spec.seed, self.device)),
                next(_oracle_problems([group], spec.seed, self.device, "validation")))

    def measure(self, ctx, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        name, method, budget = case.name
        t0 = time.perf_counter()
        rows, crows = (self._embedded(ctx, case) if name in self.embedded else self._oracle(ctx, case))
        yield from ((CALIBRATION.file, r) for r in rows)
        yield from ((CONFORMAL.file, r) for r in crows)
        log(f"calibration {name} {method} @{budget}: {coverage_summary(rows)}"
            + (f"; {conformal_summary(crows)}" if crows else "") + f" ({time.perf_counter() - t0:.1f}s)")

    def _oracle(self, ctx: tuple, case: Case) -> tuple[list[Row], list[Row]]:
        """The rows of one method (or the exact draws) on an oracle: K chains per test and validation measurement."""
        (name, prior, op, truth, y, noise, exact, gen), (_, _, _, v_truth, v_y, _, v_exact, _) = ctx
        k, seed, cov = self.k, self.spec.seed, self.spec.coverage
        if case.item is None:
            xs = exact(k, gen(name, "exact"))
            return (calibration_rows(name, "exact", 0, xs, truth),
                    conformal_rows(name, "exact", 0, [v_exact(k, gen(name, "validation-exact")).double()],
                                   [v_truth.double()], [xs.double()], [truth.double()], cov, clip=False))
        method, budget, cfg = case.name[1], int(case.name[2]), case.item
        seeds = [stable_seed(seed, "calibration-sampler", name, b) for b in range(truth.shape[0])]
        v_seeds = [stable_seed(seed, "calibration-sampler-validation", name, b) for b in range(v_truth.shape[0])]
        xs = _chains(method, cfg, prior, op, y, noise, k, seeds).double()
        v_xs = _chains(method, cfg, prior, op, v_y, noise, k, v_seeds).double()
        return (calibration_rows(name, method, budget, xs, truth.double()),
                conformal_rows(name, method, budget, [v_xs], [v_truth.double()], [xs], [truth.double()], cov,
                               clip=False))

    def _embedded(self, splits: dict[str, tuple], case: Case) -> tuple[list[Row], list[Row]]:
        """The rows of one method on the embedded prior: per test image, K chains; the calibrated
        interval when there are validation images."""
        name, method, budget = case.name[0], case.name[1], int(case.name[2])
        parts, chains = [], {}
        for split, (s_ops, s_truths, s_ys, s_names) in splits.items():
            chains[split] = []
            for i, (op, truth, y, image) in enumerate(zip(s_ops, s_truths, s_ys, s_names)):
                # the test split's seeds are those of the local protocol's images (index i)
                key = (self.spec.seed, "calibration", seed_name(name), i if split == "test" else image)
                xs = _chains(method, case.item, self.prior, op, y, NOISE, self.k, [stable_seed(*key)]).double()
                chains[split].append(xs)
                if split == "test":
                    parts.append(calibration_rows(name, method, budget, xs, truth.double()))
        save_chains(self.spec.out / "chains" / f"{name}_{method.replace(':', '-')}@{budget}.npz", chains,
                    {split: s[1] for split, s in splits.items()}, {split: s[3] for split, s in splits.items()})
        if "validation" not in splits:
            return mean_rows(parts), []
        return mean_rows(parts), conformal_rows(
            name, method, budget, chains["validation"], [t.double() for t in splits["validation"][1]], chains["test"],
            [t.double() for t in splits["test"][1]], self.spec.coverage, clip=True)

    def header(self) -> dict[str, Any]:
        spec = self.spec
        return {"K": self.k, "oracle budgets": ", ".join(map(str, self.budgets)), "embedded budget": spec.embedded_budget,
                "oracle measurements per setting": f"{ORACLE_MEASUREMENTS} test, {ORACLE_VALIDATION} validation",
                "embedded images": f"test: {self.test_images} tile(s) of {', '.join(EMBEDDED_IMAGES)}; validation: "
                                   f"{spec.validation_images} tile(s) of {', '.join(VALIDATION_PHOTOS)} and textured "
                                   f"leaves ({spec.size} px)",
                "calibrated coverage": f"{spec.coverage:g} (pooled rule and edge weight fitted on validation, "
                                       f"measured on test)",
                "prior": self.prior_info or "none (the oracles need no network)", "seed": spec.seed}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        out, rows = self.spec.out, tables[CALIBRATION.file]
        atomic_write_text(out / "summary.md", calibration_markdown(rows, header)
                          + conformal_markdown(tables[CONFORMAL.file]))
        plotted = bool(rows) and reliability_plot(rows, out / "reliability.png")
        log(f"wrote {out / 'calibration.csv'}, {out / 'summary.md'}"
            + (f" and {out / 'reliability.png'}" if plotted else
               " (matplotlib not installed: no reliability.png; pip install 'nfc_dps[bench]')"))
        return {"settings": list(self.settings)}

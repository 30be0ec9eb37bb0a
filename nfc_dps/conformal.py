"""Conformal calibration of the K-sample uncertainty map: per-pixel intervals with a stated coverage.

``restore(..., num_samples=K)`` returns the mean of K posterior samples and their per-pixel std.
The std is the spread of the posterior *of the prior the sampler is given*, as far as the sampler
draws it: it leaves out the network's own error and a sampler's bias, so mean ± c·std covers the
truth at no known rate. Calibration fits one number q on clean calibration images the user
provides (their measurements simulated with the task's operator), so that the interval

    [mean - q u, mean + q u],   u = std + c edge(mean) + eps   (then clipped to [0, 1])

covers a chosen fraction 1 - alpha of the pixel values of new images of the same kind. Scores are
the normalised errors s = |x - mean| / u, one per pixel value (pixel and channel); ``eps`` (one
8-bit grey level, :data:`DEFAULT_EPS`) keeps q finite where a sampler's spread vanishes (e.g.
observed pixels of an inpainting). ``edge(mean)`` (:func:`edge_strength`) is the local gradient
magnitude of the restoration: a network errs most at edges and in texture, which the samples'
spread under-reports, and how much it does varies from image to image. The fit
(:func:`fit_rule`) takes the edge weight c from :data:`EDGE_WEIGHTS` (0: the std alone) whose
interval covers the calibration images most evenly (the smallest spread over images of the fraction
each has covered, q fitted at each c); c is chosen on the same images as q, a choice among a few
values. Two rules choose q (:func:`fit_quantile`); each image weighs the same, whatever its size:

* ``pooled`` (default): the smallest q with at most alpha of the calibration images' pixel values
  outside their interval (the image-weighted (1 - alpha) quantile of the pooled scores). Pixels of
  one image are not exchangeable (their errors are correlated), so split-conformal's finite-sample
  guarantee does not hold for them; what this rule estimates is the *expected fraction of a new
  image's pixel values inside its interval*, averaged over images exchangeable with the
  calibration images. The estimate is consistent (it reaches 1 - alpha as the number of images
  grows); with n images it misses it by the sampling error of a mean over n images, in either
  direction.
* ``risk-control``: conformal risk control (Angelopoulos, Bates, Fisch, Lei, Schuster, "Conformal
  Risk Control", ICLR 2024; the per-image loss of Angelopoulos et al., ICML 2022) with the loss
  L_i(q) = fraction of image i's pixel values outside the interval: q is the smallest value with
  n/(n+1) mean_i L_i(q) + 1/(n+1) <= alpha. If the n calibration images and a new image are
  exchangeable, E[L_new(q)] <= alpha: the expected fraction of the new image's pixel values that
  the interval covers is at least 1 - alpha, for any n. It pays for the guarantee by covering
  more than asked when n is small (its in-sample target is alpha - (1 - alpha) / n).

Neither is a per-pixel guarantee, nor conditional on the image (an image unlike the calibration
set can be covered far less), nor valid for another task, noise level, sampler, K or prior: a
:class:`Calibration` records them and refuses to be applied to anything else.

Minimum number of calibration images: n >= ceil(1/alpha) - 1 (9 for 90 %, 19 for 95 %,
99 for 99 %), for both rules: with fewer, 1/(n+1) > alpha and no finite q controls the risk of a
new image at alpha; at that minimum ``risk-control`` takes the largest score of any calibration
pixel. More images give a tighter q (a few dozen is the usual calibration set).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .fingerprint import CalibrationError, prior_fingerprint, weights_determine  # re-exported: they live there
from .io import write_json
from .operators.tasks import TASKS

__all__ = ["DEFAULT_EPS", "EDGE_WEIGHTS", "RULES", "CalibrationError", "Calibration", "RuleFit", "min_images",
           "edge_strength", "spread", "normalized_scores", "fit_quantile", "fit_rule", "interval", "load_calibration",
           "prior_fingerprint", "weights_determine", "task_family"]

#: floor added to the std before normalising (one 8-bit grey level, [0, 1] units)
DEFAULT_EPS = 1.0 / 255.0
RULES = ("pooled", "risk-control")
FORMAT = "nfc_dps conformal calibration"
VERSION = 2
#: versions this nfc_dps reads (version 1 has no edge weight: c = 0)
READABLE_VERSIONS = (1, 2)
#: the edge weights c the fit chooses from (module doc); 0 is the std alone
EDGE_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


class UnfamiliarImageWarning(UserWarning):
    """An image unlike the calibration images: its interval's coverage was not measured for such images."""


def mean_spread(mean: Any, std: Any, eps: float = DEFAULT_EPS, edge_weight: float = 0.0) -> np.ndarray:
    """Per image of a batch (B, ...) (or one image: shape (1,)), the mean of :func:`spread` u over its
    pixels: how wide its interval is per unit of q, what the sampler tells about its own difficulty."""
    u = _numpy(spread(mean, std, eps, edge_weight)).astype(np.float64)
    return u.reshape(u.shape[0], -1).mean(axis=1) if u.ndim == 4 else np.array([u.mean()])


def check_coverage(coverage: Any) -> float:
    """``coverage`` as a float in (0, 1); CalibrationError otherwise."""
    try:
        c = float(coverage)
    except (TypeError, ValueError) as e:
        raise CalibrationError(f"coverage must be a number in (0, 1), got {coverage!r}") from e
    if not 0.0 < c < 1.0 or isinstance(coverage, bool):
        raise CalibrationError(f"coverage must lie strictly between 0 and 1 (e.g. 0.9), got {coverage!r}")
    return c


def min_images(coverage: float) -> int:
    """The fewest calibration images a target ``coverage`` = 1 - alpha needs: ceil(1/alpha) - 1."""
    alpha = 1.0 - check_coverage(coverage)
    return max(1, math.ceil(1.0 / alpha - 1e-9) - 1)


def _numpy(a: Any) -> np.ndarray:
    return np.asarray(a.detach().cpu() if isinstance(a, torch.Tensor) else a, dtype=np.float64)


def edge_strength(mean: Any) -> Any:
    """Local gradient magnitude of an image (..., H, W), per channel, in its units per pixel: the
    norm of the Sobel gradient / 8, averaged over each pixel's 3 x 3 neighbourhood (borders
    replicated). A tensor for a tensor (its dtype and device), else a float64 array."""
    t = mean.detach() if isinstance(mean, torch.Tensor) else torch.from_numpy(_numpy(mean))
    x = t.reshape(-1, 1, *t.shape[-2:])
    d = torch.tensor([1.0, 0.0, -1.0], dtype=x.dtype, device=x.device)
    w = torch.tensor([1.0, 2.0, 1.0], dtype=x.dtype, device=x.device)
    sobel = torch.stack([torch.outer(w, d), torch.outer(d, w)]).unsqueeze(1)  # d/dx, d/dy
    g = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate"), sobel)
    g = g.square().sum(1, keepdim=True).sqrt() / 8
    g = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(g, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    g = g.reshape(t.shape)
    return g if isinstance(mean, torch.Tensor) else g.numpy()


def spread(mean: Any, std: Any, eps: float = DEFAULT_EPS, edge_weight: float = 0.0) -> Any:
    """u = std + edge_weight edge(mean) + eps, the interval's half-width per unit of q (module doc)."""
    return std + eps if edge_weight == 0 else std + edge_weight * edge_strength(mean) + eps


def normalized_scores(mean: Any, std: Any, truth: Any, eps: float = DEFAULT_EPS, edge_weight: float = 0.0
                      ) -> np.ndarray:
    """|truth - mean| / u (:func:`spread`), flattened to a float64 vector (one score per pixel value)."""
    m, s, x = _checked(mean, std, truth)
    return (np.abs(x - m) / spread(m, s, eps, edge_weight)).ravel()


def _checked(mean: Any, std: Any, truth: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three as float64 arrays of one shape (CalibrationError otherwise)."""
    m, s, x = (_numpy(a) for a in (mean, std, truth))
    if not (m.shape == s.shape == x.shape):
        raise CalibrationError(f"mean, std and truth must have one shape, got {m.shape}, {s.shape}, {x.shape}")
    return m, s, x


def fit_quantile(scores: Sequence[np.ndarray], coverage: float, rule: str = "pooled") -> float:
    """q of the rule (module doc) from one score vector per calibration image.

    Each image weighs 1/n; q is the smallest score value whose image-weighted fraction of scores
    above it is at most the rule's target (alpha for ``pooled``, (alpha (n+1) - 1)/n for
    ``risk-control``)."""
    cov = check_coverage(coverage)
    if rule not in RULES:
        raise CalibrationError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    n = len(scores)
    need = min_images(cov)
    if n < need:
        raise CalibrationError(f"{n} calibration image(s) for coverage {cov:g}: the rule needs at least {need} "
                               f"(ceil(1/alpha) - 1 with alpha = {1 - cov:.4g})")
    parts = [np.asarray(s, dtype=np.float64).ravel() for s in scores]
    if any(p.size == 0 for p in parts):
        raise CalibrationError("a calibration image has no pixels")
    if any(not np.isfinite(p).all() or (p < 0).any() for p in parts):
        raise CalibrationError("scores must be finite and >= 0")
    alpha = 1.0 - cov
    target = alpha if rule == "pooled" else (alpha * (n + 1) - 1.0) / n
    s = np.concatenate(parts)
    w = np.concatenate([np.full(p.size, 1.0 / (n * p.size)) for p in parts])
    order = np.argsort(s, kind="stable")
    s, w = s[order], w[order]
    above = np.cumsum(w[::-1])[::-1] - w  # weight of the scores after position i in sorted order
    last = np.searchsorted(s, s, side="right") - 1  # ties: the weight strictly above s[i]
    tail = above[last]
    ok = np.nonzero(tail <= target + 1e-10)[0]
    return float(s[ok[0]])


@dataclass(frozen=True)
class RuleFit:
    """What :func:`fit_rule` chose: q, the edge weight c, each calibration image's covered fraction
    at them, and the spread over images of that fraction at every c tried."""

    q: float
    edge_weight: float
    covered: list[float]
    spread_by_weight: dict[float, float]


def fit_rule(images: Sequence[tuple[Any, Any, Any]], coverage: float, rule: str = "pooled",
             eps: float = DEFAULT_EPS, edge_weights: Sequence[float] = EDGE_WEIGHTS) -> RuleFit:
    """The interval rule (module doc) from one (mean, std, truth) per calibration image (the same
    shape each, any layout ending in (H, W)): for every c in ``edge_weights``, q by
    :func:`fit_quantile`; the c whose per-image covered fractions spread least (the smaller c on a tie)."""
    if not edge_weights:
        raise CalibrationError("edge_weights is empty")
    parts = []  # per image, what every c's scores are made of (:func:`spread`): |x - mean|, std, edge(mean)
    for m, sd, x in images:
        m, sd, x = _checked(m, sd, x)
        parts.append((np.abs(x - m), sd, edge_strength(m)))
    best, spreads = None, {}
    for c in edge_weights:
        scores = [(err / (sd + eps if c == 0 else sd + c * edge + eps)).ravel() for err, sd, edge in parts]
        q = fit_quantile(scores, coverage, rule)
        covered = [float(np.mean(sc <= q)) for sc in scores]
        spreads[float(c)] = float(np.std(covered))
        if best is None or spreads[float(c)] < best.spread_by_weight[best.edge_weight] - 1e-12:
            best = RuleFit(q, float(c), covered, spreads)
    return best


def interval(mean: Any, std: Any, q: float, eps: float = DEFAULT_EPS, edge_weight: float = 0.0,
             clip: bool = True) -> tuple[Any, Any]:
    """(lower, upper) = mean ∓ q u (:func:`spread`), clipped to [0, 1] unless ``clip`` is False;
    tensors or arrays as given."""
    half = q * spread(mean, std, eps, edge_weight)
    if not clip:
        return mean - half, mean + half
    if isinstance(mean, torch.Tensor):
        return (mean - half).clamp(0, 1), (mean + half).clamp(0, 1)
    return np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1)


def task_family(task: str) -> str:
    """The operator family (:attr:`LinearOperator.family`) of a registered task ("other" if unknown)."""
    return TASKS[task].family if task in TASKS else "other"


def sampler_fields(config: Any) -> dict[str, Any]:
    """Every field of a sampler config as plain JSON values (what a calibration records)."""
    body = asdict(config) if is_dataclass(config) else dict(config)
    return json.loads(json.dumps(body, default=str))


@dataclass
class Calibration:
    """A fitted interval rule and what it was fitted for (module doc). ``check`` refuses a run it
    does not belong to; ``interval`` applies it."""

    q: float
    coverage: float
    rule: str
    eps: float
    n_images: int
    num_samples: int
    method: str
    preset: str
    sampler: dict[str, Any]
    prior: dict[str, Any]
    task: dict[str, Any] | None = None
    edge_weight: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)
    source: str = "<in memory>"

    # -- files

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return {"format": FORMAT, "version": VERSION, **d}

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: Any, source: str = "<in memory>") -> "Calibration":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CalibrationError(f"{source}: not a calibration file (no 'format': {FORMAT!r}); write one with "
                                   f"'nfc-dps calibrate'")
        if d.get("version") not in READABLE_VERSIONS:
            raise CalibrationError(f"{source}: calibration file version {d.get('version')!r}, this nfc_dps reads "
                                   f"version {', '.join(map(str, READABLE_VERSIONS))}")
        need = ("q", "coverage", "rule", "eps", "n_images", "num_samples", "method", "preset", "sampler", "prior")
        missing = [k for k in need if k not in d]
        if missing:
            raise CalibrationError(f"{source}: missing key(s) {', '.join(missing)}")
        def number(key: str, value: Any, positive: bool = False) -> float:
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0 or (positive and value == 0)):
                raise CalibrationError(f"{source}: {key} must be a finite number {'>' if positive else '>='} 0, "
                                       f"got {value!r}")
            return float(value)

        number("q", d["q"])
        check_coverage(d["coverage"])
        if isinstance(d["num_samples"], bool) or not isinstance(d["num_samples"], int) or d["num_samples"] < 2:
            raise CalibrationError(f"{source}: num_samples must be an int >= 2, got {d['num_samples']!r}")
        c = number("edge_weight", d.get("edge_weight", 0.0) if d["version"] >= 2 else 0.0)
        number("eps", d["eps"], positive=True)
        if d["rule"] not in RULES:
            raise CalibrationError(f"{source}: rule must be one of {', '.join(RULES)}, got {d['rule']!r}")
        for key in ("method", "preset"):
            if not isinstance(d[key], str):
                raise CalibrationError(f"{source}: {key} must be a string, got {d[key]!r}")
        if d.get("task") is None:
            raise CalibrationError(f"{source}: {'key task is null' if 'task' in d else 'no key task'}: a calibration "
                                   f"holds for the task it was fitted on only (an object naming it, e.g. "
                                   f"{{\"task\": \"sr_bicubic\", \"noise_sigma\": 0.025, ...}}, as 'nfc-dps calibrate' "
                                   f"writes); calibrate again")
        for key in ("sampler", "prior", "task"):
            if not isinstance(d.get(key), dict):
                raise CalibrationError(f"{source}: {key} must be an object (JSON {{...}}), got {d.get(key)!r}")
        if not isinstance(d["task"].get("task"), str) or not d["task"]["task"]:
            raise CalibrationError(f"{source}: key task.task (the task's name, e.g. \"sr_bicubic\") must be a "
                                   f"non-empty string, got {d['task'].get('task')!r}")
        kw = {k: d[k] for k in need}
        return cls(**kw, task=d.get("task"), edge_weight=c, fit=_checked_fit(d.get("fit", {}), source),
                   source=source)

    # -- applying

    def interval(self, mean: Any, std: Any) -> tuple[Any, Any]:
        return interval(mean, std, self.q, self.eps, self.edge_weight)

    def unfamiliar(self, mean: Any, std: Any) -> list[tuple[int, str]]:
        """(index, note) per image of ``mean`` / ``std`` ((B, C, H, W) or one image) whose mean
        spread (:func:`mean_spread`) lies outside the range of the calibration images' (``fit``'s
        ``mean_spread_range``; a file without one is not checked)."""
        seen = self.fit.get("mean_spread_range")
        if not (isinstance(seen, (list, tuple)) and len(seen) == 2):
            return []
        lo, hi = float(seen[0]), float(seen[1])
        notes = []
        for b, value in enumerate(mean_spread(mean, std, self.eps, self.edge_weight)):
            if not lo <= value <= hi:
                notes.append((b, f"its sample spread (mean {value:.4g}) lies outside the calibration images' "
                                 f"({lo:.4g} to {hi:.4g}, {self.source}): the {self.coverage:.0%} interval's "
                                 f"coverage was not measured on images like it"))
        return notes

    def _mismatch(self, key: str, here: Any, recorded: Any) -> CalibrationError:
        return CalibrationError(f"calibration {self.source} was fitted for {key} {recorded!r}, this run has "
                                f"{here!r}; calibrate again for this run (nfc-dps calibrate ...)")

    def check_run(self, method: str, config: Any, num_samples: int, prior: Any, **kw: Any) -> None:
        """:meth:`check` against a loaded ``prior``: its fingerprint and precision (the CLI's and
        the API's one check); ``kw``: the task or the operator's (``task``, ``family``, ...)."""
        self.check(method, config, num_samples, prior_fingerprint(prior),
                   precision=getattr(prior, "precision", None), **kw)

    def check(self, method: str, config: Any, num_samples: int, prior: str | None = None,
              task: dict[str, Any] | Sequence[dict[str, Any]] | None = None, family: str | None = None,
              noise: Any = None, factor: int | None = None, precision: str | None = None) -> None:
        """CalibrationError naming the first of method, sampler config, K, prior, its precision, task
        that differs.

        prior: a :func:`prior_fingerprint`; precision: the prior's (``Prior.precision``), checked
        against the recorded one where both are known. task: the run's task config(s) (``TaskConfig.as_dict()``;
        several when a restore reads a simulation: any one may match). Without a task (the Python
        API, which sees only an operator), ``family``, ``noise`` (a Gaussian noise model, against the
        recorded ``noise_sigma``) and ``factor`` are checked."""
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 2:
            raise CalibrationError(f"a calibrated interval needs K >= 2 samples (num_samples / --samples), got "
                                   f"{num_samples!r}; calibration {self.source} is for K = {self.num_samples}")
        if method != self.method:
            raise self._mismatch("method", method, self.method)
        fields = sampler_fields(config)
        gone = sorted(set(self.sampler) - set(fields))
        if gone and not set(fields) - set(self.sampler):
            raise CalibrationError(f"calibration {self.source} records sampler fields that {self.method}/{self.preset} no "
                                   f"longer has ({', '.join(gone[:6])}): it was fitted by an earlier nfc_dps; "
                                   f"calibrate again")
        if fields != self.sampler:
            diff = sorted(k for k in set(fields) | set(self.sampler) if fields.get(k) != self.sampler.get(k))
            shown = ", ".join(f"{k}={fields.get(k)!r} (calibrated {self.sampler.get(k)!r})" for k in diff[:4])
            raise CalibrationError(f"calibration {self.source} was fitted for {self.method}/{self.preset} with other "
                                   f"sampler settings: {shown}; calibrate again for this preset and these settings")
        if int(num_samples) != self.num_samples:
            raise self._mismatch("K (samples)", int(num_samples), self.num_samples)
        if prior is not None and prior != self.prior.get("fingerprint"):
            raise CalibrationError(f"calibration {self.source} was fitted with the prior "
                                   f"{self.prior.get('path', '?')} (fingerprint {self.prior.get('fingerprint')}), this "
                                   f"run's prior has fingerprint {prior} (other weights, or another function's "
                                   f"outputs on a fixed probe); calibrate again with this prior")
        recorded = self.prior.get("precision")
        if precision is not None and isinstance(recorded, str) and precision != recorded:
            from .priors.diffusers_prior import PRECISIONS

            how = (f"pass --precision {recorded} (load_prior(..., precision={recorded!r}) in Python), or calibrate "
                   f"again" if recorded in PRECISIONS and recorded != "auto" else
                   f"no --precision runs a prior in {recorded} (it takes "
                   f"{', '.join(p for p in PRECISIONS if p != 'auto')}): calibrate again with this run's prior")
            raise CalibrationError(f"calibration {self.source} was fitted with the prior in {recorded}, this run's "
                                   f"prior runs in {precision} (other samples, another spread): {how}")
        if not isinstance(self.task, dict) or not isinstance(self.task.get("task"), str):
            raise CalibrationError(f"calibration {self.source} records no task (task {self.task!r}): it holds for the "
                                   f"task it was fitted on only; calibrate again")
        if task is not None:
            tasks = [task] if isinstance(task, dict) else list(task)
            mine = json.loads(json.dumps(self.task))
            if not any(json.loads(json.dumps(t)) == mine for t in tasks):
                t = tasks[0]
                diff = sorted(k for k in set(t) | set(mine) if t.get(k) != mine.get(k))
                shown = ", ".join(f"{k}={t.get(k)!r} (calibrated {mine.get(k)!r})" for k in diff[:4])
                raise CalibrationError(f"calibration {self.source} was fitted for task {mine.get('task')!r} "
                                       f"with other settings: {shown}; calibrate again for this task")
            return
        want = task_family(str(self.task.get("task", "")))
        if family is not None and family != want:
            raise self._mismatch("operator family", family, f"{want} (task {self.task.get('task')})")
        rec_noise = self.task.get("noise_sigma")
        sigma = None if noise is None else noise.gaussian_sigma
        if sigma is not None and rec_noise is not None and abs(sigma - float(rec_noise)) > 1e-9:
            raise self._mismatch("noise sigma", sigma, rec_noise)
        rec_factor = self.task.get("factor") if want == "sr" else None
        if factor is not None and rec_factor is not None and int(factor) != int(rec_factor):
            raise self._mismatch("SR factor", int(factor), rec_factor)


def _checked_fit(fit: Any, source: str) -> dict[str, Any]:
    """A calibration file's ``fit``: an object whose ``mean_spread_range``, where present, is
    [low, high], finite numbers >= 0 with low <= high; CalibrationError naming the key otherwise."""
    if not isinstance(fit, dict):
        raise CalibrationError(f"{source}: key fit must be an object (JSON {{...}}, as 'nfc-dps calibrate' writes), "
                               f"got {fit!r}; calibrate again")
    if "mean_spread_range" not in fit:
        return fit
    seen = fit["mean_spread_range"]
    ok = (isinstance(seen, list) and len(seen) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in seen)
          and seen[0] <= seen[1])
    if not ok:
        raise CalibrationError(f"{source}: key fit.mean_spread_range must be [low, high], two finite numbers >= 0 "
                               f"with low <= high (the calibration images' mean spread), got {seen!r}; calibrate "
                               f"again")
    return fit


def load_calibration(calibration: "Calibration | str | Path | dict") -> Calibration:
    """A :class:`Calibration` from itself, a parsed dict or a JSON file (CalibrationError naming it)."""
    if isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, dict):
        return Calibration.from_dict(calibration)
    if not isinstance(calibration, (str, Path)):
        raise TypeError(f"calibration must be a Calibration, a dict or a path, got {type(calibration).__name__}")
    path = Path(calibration)
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise CalibrationError(f"calibration file {path}: cannot read ({e.strerror or e})") from e
    except ValueError as e:
        raise CalibrationError(f"calibration file {path}: not valid JSON ({e})") from e
    return Calibration.from_dict(d, str(path))

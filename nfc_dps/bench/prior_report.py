"""One-step denoising report of a prior folder against tuned TV and wavelet baselines
(``nfc-dps prior-report``; its JSON is docs/prior_report.json, whose table
:mod:`nfc_dps.bench.report` renders).

Protocol (all numbers reproducible: fixed crops, fixed noise seeds):

* Held-out images: ``HELDOUT_IMAGES`` (scikit-image photos never trained on), each a fixed
  ``crop`` x ``crop`` centre crop (default 256; 0 = whole images, slower).
* Noise: ``y = x + sigma n`` in [0, 1] units, sigma in ``sigmas`` (default 0.05 0.1 0.2), ``n``
  standard normal from ``numpy.random.default_rng([seed, 0, image, sigma_index])``; the same
  noisy image for every method. The prior sees ``2y - 1`` at sigma ``2 sigma`` (model units),
  its estimate is mapped back by ``(D + 1) / 2``.
* PSNR: data range 1, on estimates clipped to [0, 1], per image, then averaged over images.
* Baselines: ``skimage.restoration.denoise_tv_chambolle`` (weight) and ``denoise_wavelet``
  (BayesShrink / VisuShrink, wavelet, YCbCr or not, sigma factor) tuned per sigma by grid search
  on random crops of training photos (``TRAIN_IMAGES`` less documents and the near-black deep
  field; never on held-out images), then applied to the held-out crops; and TV at the weight of
  its grid that scores best on each held-out image itself (an oracle no user has: the harder
  baseline). Wavelet denoising needs
  PyWavelets (the ``bench`` extra); without it that baseline is skipped and the report says so.
* Prior variants: as loaded (the tiled prior the samplers use), ``TiledPrior(inner, tile,
  overlap=True)`` (four half-shifted grids blended), and the untiled network on the whole crop
  (reference only: GroupNorm statistics change with image size, see docs/prior.md, "Why tiles of 48").
* Timing: median wall time of ``timing_runs`` forward passes (no grad) at 256 x 256 after a
  warm-up, with the thread count, load average and whether a ``train-prior`` job was running.

Acceptance: the prior as sampled beats the best of TV and wavelet by >= 1 dB at every sigma, and a
256 x 256 forward pass takes < 1 s; the stronger prior's target is a margin >= 2.5 dB at every
sigma (reported beside it, with what is short per sigma). The markdown and the loss-curve summary
are in :mod:`nfc_dps.priors.report_markdown`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..priors.base import Prior, TiledPrior, reflect_pad
from ..priors.default import default_prior_path, load_prior
from ..priors.training_data import HELDOUT_IMAGES, TRAIN_IMAGES, center_crop, load_skimage_image
from ..training.data import to_channels
from .instruments import machine_description
from .prior_report_markdown import markdown

SIGMAS = (0.05, 0.1, 0.2)
#: training photos used to tune the baselines: documents and the near-black deep field left out
TUNE_IMAGES = tuple(n for n in TRAIN_IMAGES if n not in ("page", "text", "hubble_deep_field"))
TV_FACTORS = tuple(float(f) for f in np.geomspace(0.25, 4.0, 13))  # TV weight = factor * sigma
WAVELET_FACTORS = tuple(float(f) for f in np.geomspace(0.25, 2.0, 10))  # wavelet sigma = factor * sigma
WAVELET_METHODS = ("BayesShrink", "VisuShrink")
WAVELETS = ("db1", "db4")
ACCEPT_MARGIN_DB = 1.0
ACCEPT_SECONDS = 1.0
#: the stronger-prior target: margin over the best of TV/wavelet at every sigma, tiled as sampled
STRONG_MARGIN_DB = 2.5
ROW_LABELS = {"noisy": "noisy input", "tv": "TV (Chambolle), tuned on training crops",
              "tv_oracle": "TV (Chambolle), at its best weight on each image (oracle)",
              "wavelet": "wavelet (skimage), tuned on training crops"}

Log = Callable[[str], None]


@dataclass(frozen=True)
class ReportSettings:
    """What one report measures (the flags of ``nfc-dps prior-report``)."""

    prior: Path | None = None  # prior folder; None: the embedded default
    label: str = ""  # free text recorded with the prior
    tile: int | None = None  # tile of the overlap row when the prior is not tiled
    sigmas: tuple[float, ...] = SIGMAS  # noise levels in [0, 1] units
    crop: int = 256  # centre crop of the held-out images (0: whole images)
    seed: int = 0
    tune_crop: int = 128
    tune_per_image: int = 2
    timing_runs: int = 5
    precision: str = "auto"
    overlap: bool = True  # the overlap=True row (4x the cost)
    whole: bool = True  # the untiled reference row
    command: str = ""  # the command line, recorded in the report


# ----------------------------------------------------------------------------- helpers


def psnr01(est: np.ndarray, ref: np.ndarray) -> float:
    """PSNR (dB, data range 1) of ``est`` clipped to [0, 1] against ``ref``."""
    err = np.mean((np.clip(est, 0.0, 1.0).astype(np.float64) - ref.astype(np.float64)) ** 2)
    return float(10 * np.log10(1.0 / err))


def photo(name: str, channels: int) -> np.ndarray:
    """A package photograph as (H, W, channels) float32 in [0, 1]: RGB, or BT.601 luma for a 1-channel
    prior (the conversion ``train-prior`` trains gray priors on)."""
    return to_channels(load_skimage_image(name), channels)


def noise(shape: tuple[int, ...], *key: int) -> np.ndarray:
    """Standard normal float32 noise of ``shape`` from ``default_rng(key)``."""
    return np.random.default_rng(list(key)).standard_normal(shape).astype(np.float32)


def training_job_pids() -> list[int]:
    """PIDs of running ``train-prior`` jobs (read from /proc; Linux only)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "train-prior" in cmd and int(d.name) != os.getpid():
            pids.append(int(d.name))
    return sorted(pids)


# ----------------------------------------------------------------------------- prior loading


def _exported_step(info_file: Path) -> int | None:
    """The training step an export's ``train_info.json`` records, or None (no file, no step)."""
    try:
        step = json.loads(info_file.read_text()).get("step")
    except (OSError, ValueError, AttributeError):  # no file, or not a JSON object: a label only
        return None
    return int(step) if isinstance(step, int) else None


def snapshot_prior(path: Path, tmp: Path) -> tuple[Path, dict]:
    """Copy a prior folder that a training job may be rewriting; find its training step if it can.

    ``nfc-dps train-prior`` saves ``<workdir>/state.pt`` and then exports the EMA weights, so a
    consistent export has weights no older than state.pt. The step is the one the export's
    train_info.json records; for an export without one, state.pt's when it was saved with it.
    """
    info: dict = {"path": str(path), "step": None}
    weights = sorted((path / "unet").glob("*.safetensors")) + sorted(path.glob("*.safetensors"))
    state = path.parent / "state.pt"
    for _ in range(24):
        m0 = max((w.stat().st_mtime for w in weights), default=0.0)
        dst = tmp / "prior"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(path, dst)
        m1 = max((w.stat().st_mtime for w in weights), default=0.0)
        stable = m0 == m1 and (not weights or time.time() - m1 > 2.0)
        if stable and state.is_file() and state.stat().st_mtime > m1 + 1.0:
            stable = False  # a save is under way: state.pt written, export not yet
        if stable:
            break
        time.sleep(5.0)
    info["weights_mtime"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m1)) if weights else None
    exported_step = _exported_step(dst / "train_info.json")
    if exported_step is not None:  # the export says which step it is (a copied export too)
        info["step"] = exported_step
        info["step_source"] = str(path / "train_info.json")
    elif state.is_file() and weights and abs(state.stat().st_mtime - m1) < 120:
        try:
            st = torch.load(state, map_location="cpu", weights_only=True)  # never more than weights
            info["step"] = int(st["step"])
            info["step_source"] = str(state)
        except Exception as e:  # noqa: BLE001 - a label only
            info["step_error"] = f"{type(e).__name__}: {e}"
    return dst, info


def disk_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class ReportError(Exception):
    """The prior of a report cannot be copied or loaded (the message names it)."""


def load_report_prior(settings: ReportSettings) -> tuple[Prior, Prior | None, dict]:
    """The prior (a snapshot of a folder a training job may be rewriting), the same weights in
    float32 when it runs in another precision (timed for reference), and its record;
    :class:`ReportError` when the folder cannot be copied or loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if settings.prior is None:
                src = local = default_prior_path()
                pinfo = {"path": str(src), "step": _exported_step(src / "train_info.json")}
            else:
                src = settings.prior
                local, pinfo = snapshot_prior(src, Path(tmp))
            prior = load_prior(local, precision=settings.precision)
            prior_float32 = load_prior(local, precision="float32") if prior.precision != "float32" else None
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            raise ReportError(f"cannot load {settings.prior or 'the embedded default prior'}: {e}") from e
        pinfo["label"] = settings.label
        pinfo["disk_bytes"] = disk_size(Path(src))
        pinfo["parameters"] = int(sum(p.numel() for p in prior.parameters()))
        pinfo["type"] = type(prior).__name__
        pinfo["precision"] = prior.precision
        if isinstance(prior, TiledPrior):
            pinfo["tile"] = prior.tile
    return prior, prior_float32, pinfo


class Untiled(Prior):
    """The inner network on the whole image, reflect-padded to its size multiple (reference only)."""

    def __init__(self, inner: Prior) -> None:
        super().__init__()
        self.inner = inner
        self.channels = inner.channels

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        m = self.inner.size_multiple
        h, w = x.shape[-2:]
        xp = reflect_pad(x, 0, (-h) % m, 0, (-w) % m)
        return self.inner.denoise(xp, sigma)[..., :h, :w]


def prior_variants(prior: Prior, tile: int | None) -> dict[str, tuple[str, Prior]]:
    """name -> (label, prior): as loaded, overlapped tiles, untiled."""
    inner = prior.inner if isinstance(prior, TiledPrior) else prior
    t = prior.tile if isinstance(prior, TiledPrior) else tile
    out: dict[str, tuple[str, Prior]] = {}
    if isinstance(prior, TiledPrior):
        out["tiled"] = (f"prior, tiled {t} (as sampled)", prior)
    else:
        out["tiled"] = ("prior as loaded (untiled)", prior)
    if t:
        out["overlap"] = (f"prior, tiled {t}, overlap=True", TiledPrior(inner, t, overlap=True))
    out["whole"] = ("prior, whole image (reference)", Untiled(inner))
    return out


def prior_denoise(prior: Prior, noisy01: np.ndarray, sigma01: float) -> np.ndarray:
    """[0, 1] HWC noisy image -> [0, 1] HWC estimate (clipped), through model units; reflect-padded
    to the prior's size multiple and cropped back (an untiled network needs it)."""
    x = torch.from_numpy(np.ascontiguousarray(noisy01.transpose(2, 0, 1)))[None].float() * 2 - 1
    h, w, m = x.shape[-2], x.shape[-1], prior.size_multiple
    with torch.inference_mode():
        out = prior(reflect_pad(x, 0, (-h) % m, 0, (-w) % m), torch.full((1,), 2.0 * sigma01))[..., :h, :w]
    return ((out[0].permute(1, 2, 0).double().numpy() + 1) / 2).clip(0, 1)


# ----------------------------------------------------------------------------- baselines


def tv_denoise(noisy: np.ndarray, sigma: float, factor: float) -> np.ndarray:
    """Chambolle TV denoising at weight ``factor * sigma``."""
    from skimage.restoration import denoise_tv_chambolle

    return denoise_tv_chambolle(noisy, weight=factor * sigma, channel_axis=-1)


def wavelet_denoise(noisy: np.ndarray, sigma: float, cfg: dict) -> np.ndarray:
    """scikit-image wavelet denoising with a configuration of the tuning grid (needs PyWavelets)."""
    from skimage.restoration import denoise_wavelet

    return denoise_wavelet(
        noisy, sigma=cfg["factor"] * sigma, wavelet=cfg["wavelet"], mode="soft", method=cfg["method"],
        convert2ycbcr=cfg["ycbcr"], channel_axis=-1, rescale_sigma=True,
    )


def have_pywt() -> bool:
    """Whether PyWavelets (the optional dependency of the wavelet baseline) is installed."""
    return importlib.util.find_spec("pywt") is not None


def tuning_crops(size: int, per_image: int, seed: int, channels: int = 3) -> list[tuple[str, np.ndarray]]:
    """Random ``size``^2 crops of the tuning photos (retried until not flat)."""
    rng = np.random.default_rng([seed, 7])
    crops = []
    for name in TUNE_IMAGES:
        img = photo(name, channels)
        h, w = img.shape[:2]
        s = min(size, h, w)
        got = 0
        for _ in range(50):
            y, x = rng.integers(h - s + 1), rng.integers(w - s + 1)
            c = img[y : y + s, x : x + s]
            if c.std() > 0.04:
                crops.append((name, np.ascontiguousarray(c)))
                got += 1
                if got == per_image:
                    break
    return crops


def _tuned_log(s: float, entry: dict, seconds: float) -> str:
    """The log line of one tuned sigma."""
    tv, wv = entry["tv"], entry.get("wavelet")
    return (f"  tuned sigma={s}: TV weight {tv['weight']:.4f} ({tv['train_psnr']:.2f} dB)"
            + (f", wavelet {wv['method']}/{wv['wavelet']}/{'YCbCr' if wv['ycbcr'] else 'RGB'} sigma {wv['sigma']:.4f}"
               f" ({wv['train_psnr']:.2f} dB)" if wv else "")
            + f" [{seconds:.1f} s]")


def tune_baselines(sigmas, crops, seed: int, log: Log) -> dict:
    """Per sigma: the TV factor and wavelet configuration maximising mean PSNR on ``crops``."""
    gray = bool(crops) and crops[0][1].shape[-1] == 1  # no YCbCr variant for gray images
    wavelet_grid = [
        {"method": m, "wavelet": wv, "ycbcr": yc, "factor": f}
        for m, wv, yc, f in product(WAVELET_METHODS, WAVELETS, (False,) if gray else (False, True), WAVELET_FACTORS)
    ]
    use_wavelet = have_pywt()
    result: dict = {"crops": [n for n, _ in crops], "crop_size": int(crops[0][1].shape[0]) if crops else None,
                    "tv_factors": list(TV_FACTORS), "wavelet_available": use_wavelet, "per_sigma": {}}
    for si, s in enumerate(sigmas):
        t0 = time.perf_counter()
        pairs = [(c, c + s * noise(c.shape, seed, 1, ci, si)) for ci, (_, c) in enumerate(crops)]
        tv_scores = [float(np.mean([psnr01(tv_denoise(y, s, f), c) for c, y in pairs])) for f in TV_FACTORS]
        k = int(np.argmax(tv_scores))
        entry = {"tv": {"weight": TV_FACTORS[k] * s, "factor": TV_FACTORS[k], "train_psnr": tv_scores[k],
                        "at_grid_edge": k in (0, len(TV_FACTORS) - 1), "grid_psnr": tv_scores}}
        if use_wavelet:
            wv_scores = [float(np.mean([psnr01(wavelet_denoise(y, s, cfg), c) for c, y in pairs])) for cfg in wavelet_grid]
            j = int(np.argmax(wv_scores))
            best = dict(wavelet_grid[j])
            entry["wavelet"] = {**best, "sigma": best["factor"] * s, "train_psnr": wv_scores[j],
                                "at_grid_edge": best["factor"] in (WAVELET_FACTORS[0], WAVELET_FACTORS[-1]),
                                "grid": [{**cfg, "psnr": p} for cfg, p in zip(wavelet_grid, wv_scores)]}
        result["per_sigma"][str(s)] = entry
        log(_tuned_log(s, entry, time.perf_counter() - t0))
    return result


# ----------------------------------------------------------------------------- timing


def time_forward(prior: Prior, size: int, runs: int, sigma_model: float = 0.2) -> dict:
    """Wall time of ``runs`` forward passes at ``size`` x ``size`` after a warm-up."""
    img = center_crop(photo(HELDOUT_IMAGES[0], prior.channels), size)
    x = torch.from_numpy(img.transpose(2, 0, 1).copy())[None] * 2 - 1
    x = x + sigma_model * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    s = torch.full((1,), sigma_model)
    times = []
    with torch.inference_mode():
        prior(x, s)  # warm-up
        for _ in range(runs):
            t0 = time.perf_counter()
            prior(x, s)
            times.append(time.perf_counter() - t0)
    # the median is the figure of merit; the minimum approximates an idle machine when others share the cores
    return {"size": list(x.shape[-2:]), "runs": runs, "median_s": statistics.median(times), "min_s": min(times),
            "all_s": times}


# ----------------------------------------------------------------------------- the report


def measure_images(images: dict[str, np.ndarray], sigmas: list[float], tuning: dict,
                   variants: dict[str, tuple[str, Prior]], seed: int, log: Log) -> dict:
    """image -> str(sigma) -> method -> PSNR (and each prior variant's seconds)."""
    per_image: dict = {name: {} for name in images}
    for ii, (name, x) in enumerate(images.items()):
        for si, s in enumerate(sigmas):
            y = x + s * noise(x.shape, seed, 0, ii, si)
            e = tuning["per_sigma"][str(s)]
            oracle = [psnr01(tv_denoise(y, s, f), x) for f in TV_FACTORS]
            best = int(np.argmax(oracle))
            r = {"noisy": psnr01(y, x), "tv": psnr01(tv_denoise(y, s, e["tv"]["factor"]), x), "tv_oracle": oracle[best],
                 "tv_oracle_factor": TV_FACTORS[best], "tv_oracle_at_grid_edge": best in (0, len(TV_FACTORS) - 1)}
            if "wavelet" in e:
                r["wavelet"] = psnr01(wavelet_denoise(y, s, e["wavelet"]), x)
            for key, (_, pr) in variants.items():
                t0 = time.perf_counter()
                r[key] = psnr01(prior_denoise(pr, y, s), x)
                r[f"{key}_seconds"] = time.perf_counter() - t0
            per_image[name][str(s)] = r
            log(f"  {name} {x.shape[0]}x{x.shape[1]} sigma={s}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in r.items() if not k.endswith("_seconds")))
    return per_image


def acceptance(margins: dict, timing: dict, margin_over_tv_oracle: dict | None = None) -> dict:
    """The acceptance criteria and whether they hold."""
    def all_above(key: str, required: float) -> bool:
        return bool(margins.get(key)) and all(v >= required for v in margins[key].values())

    return {
        "margin_db_required": ACCEPT_MARGIN_DB,
        "seconds_required": ACCEPT_SECONDS,
        "denoise_margin": all_above("tiled", ACCEPT_MARGIN_DB),
        "denoise_margin_overlap": all_above("overlap", ACCEPT_MARGIN_DB),
        "speed": timing["tiled"]["median_s"] < ACCEPT_SECONDS,
        "strong_margin_db_required": STRONG_MARGIN_DB,
        "strong_margin": all_above("tiled", STRONG_MARGIN_DB),
        "strong_margin_over_tv_oracle": bool(margin_over_tv_oracle)
        and all(v >= STRONG_MARGIN_DB for v in margin_over_tv_oracle.values()),
    }


def prior_report(settings: ReportSettings, log: Log = lambda msg: None) -> dict:
    """The report: every number, the tuned baselines, timing, machine, acceptance and its markdown."""
    t_start = time.time()
    prior, prior_float32, pinfo = load_report_prior(settings)
    log(f"prior {pinfo['path']} step {pinfo.get('step')}: {pinfo['parameters']:,} parameters")
    variants = prior_variants(prior, settings.tile)
    if not settings.overlap:
        variants.pop("overlap", None)
    if not settings.whole:
        variants.pop("whole", None)
    sigmas = [float(s) for s in settings.sigmas]

    log(f"tuning TV/wavelet on training crops ({len(TUNE_IMAGES)} photos x {settings.tune_per_image})")
    crops = tuning_crops(settings.tune_crop, settings.tune_per_image, settings.seed, prior.channels)
    tuning = tune_baselines(sigmas, crops, settings.seed, log)
    images = {name: center_crop(photo(name, prior.channels), settings.crop) for name in HELDOUT_IMAGES}
    per_image = measure_images(images, sigmas, tuning, variants, settings.seed, log)

    keys = ["noisy", "tv", "tv_oracle"] + (["wavelet"] if tuning["wavelet_available"] else []) + list(variants)
    rows = {k: {str(s): float(np.mean([per_image[n][str(s)][k] for n in images])) for s in sigmas} for k in keys}
    best_classical = {str(s): max(rows[k][str(s)] for k in ("tv", "wavelet") if k in rows) for s in sigmas}
    margins = {k: {str(s): rows[k][str(s)] - best_classical[str(s)] for s in sigmas} for k in ("tiled", "overlap") if k in rows}
    # the harder baseline: TV at the weight of its grid that is best on each image (an oracle)
    margin_over_tv_oracle = {str(s): rows["tiled"][str(s)] - rows["tv_oracle"][str(s)] for s in sigmas} \
        if "tiled" in rows else {}
    row_labels = {**ROW_LABELS, **{k: label for k, (label, _) in variants.items()}}

    log(f"timing 256x256 forward passes ({settings.timing_runs} runs each)")
    timing = {k: time_forward(pr, 256, settings.timing_runs) for k, (_, pr) in variants.items()}
    if prior_float32 is not None:
        timing["tiled_float32"] = time_forward(prior_float32, 256, settings.timing_runs)

    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": settings.command,
        "prior": pinfo,
        "sigmas": sigmas,
        "sigma_units": "[0,1] image units; the prior is called at 2*sigma in [-1,1] model units",
        "eval": {"images": list(images), "crop": settings.crop, "shapes": {n: list(x.shape) for n, x in images.items()},
                 "seed": settings.seed, "noise": "numpy default_rng([seed, 0, image_index, sigma_index]).standard_normal",
                 "psnr": "data_range 1, estimate clipped to [0,1], per image then mean"},
        "tuning": tuning,
        "rows": rows,
        "row_labels": {k: v for k, v in row_labels.items() if k in rows},
        "best_classical": best_classical,
        "margins": margins,
        "margin_over_tv_oracle": margin_over_tv_oracle,
        "per_image": per_image,
        "timing": timing,
        # after the work: load average and training job state as timed
        "machine": {**machine_description(), "training_job_pids": training_job_pids()},
        "acceptance": acceptance(margins, timing, margin_over_tv_oracle),
        "wall_seconds": None,
    }
    report["markdown"] = markdown(report)
    report["wall_seconds"] = time.time() - t_start
    return report

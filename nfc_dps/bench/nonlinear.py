"""The tier beyond linear operators and Gaussian noise (``--protocol nonlinear``): DAPS's HDR and
phase retrieval, a camera's over-exposure by 1 and 2 stops, blur in linear light as a camera
records it, and Poisson deblurring and denoising at two photon levels, on the held-out photos (the
local protocol's crops), against DAPS and DPS at NFC's NFE and at their presets, DPIR and each
problem's classical answer (its setting's entry of :data:`nfc_dps.baselines.CLASSICAL`).

Rows (results.csv): setting, method, nfe, image, psnr, ssim, seconds, note. The methods:

* ``nfc``: NFC's default (16 NFE; 8 on denoising); ``nfc-gaussian`` (Poisson settings): the same
  sampler told the noise is Gaussian of the Poisson model's reference std (the likelihood is the difference), the
  counts clipped into the range ``restore`` accepts for that std (a photon spike past it is
  more than Gaussian noise explains);
* ``daps@16``, ``dps@16``: DAPS and DPS at NFC's NFE; ``daps``, ``dps``: at their ``fast`` presets;
  phase retrieval restarts the presets' rows 4 times and keeps the best fit, as DPS and DAPS
  report it (the equal-NFE rows run once);
* ``dpir``: DPIR's default (8 NFE; Gauss-Newton data steps on the nonlinear operators);
* ``classical``: the setting's classical method: HIO + error reduction, the unclipped inverse with
  biharmonic inpainting, TV in linear light, Richardson-Lucy, Anscombe + TV.

Phase retrieval's PSNR is the better of the estimate's and its 180-degree rotation's.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator

import numpy as np
import torch
from torch import Tensor

from ..api import restore
from ..baselines import CLASSICAL, restore_classical
from ..metrics import psnr, rotation_twin_aligned, ssim
from ..noise import GaussianNoise, NoiseModel, PoissonNoise
from ..operators import TASKS, build_operator
from ..restore_inputs import range_tolerance, stable_seed
from ..samplers import get_config
from .runner import Case, Protocol, Row, Table, folder_record, load_bench_prior, prior_record
from .tables import fmt
from .tier_tables import committed_rows, source_note, write_summary

RESULTS = Table("results.csv", ("setting", "method", "nfe", "image", "psnr", "ssim", "seconds", "note"),
                ("setting", "method", "image"), ("setting", "method"))
#: NFC's default NFE: the budget DAPS and DPS get in the equal-NFE rows
EQUAL_NFE = 16
#: restarts of the stochastic samplers on phase retrieval (DPS's and DAPS's reported protocol)
PHASE_RESTARTS = 4


@dataclass(frozen=True)
class Setting:
    """One problem of the tier: its task, the noise, its column label in the tables, its classical
    method (a key of :data:`nfc_dps.baselines.CLASSICAL`), the task's parameters at 64 px
    (``params64``) and at 256 px (``params256``), and the chains the presets' rows run, keeping the
    best fit (``preset_restarts``; the equal-NFE rows run one)."""

    name: str
    task: str
    noise: NoiseModel
    label: str
    classical: str
    params64: tuple = ()
    params256: tuple = ()
    preset_restarts: int = 1

    def params(self, size: int) -> dict[str, Any]:
        return dict(self.params256 if size >= 256 else self.params64)


#: the local protocol's Gaussian blur at 64 px, the paper protocol's at 256 (circular, as the tier was measured)
_BLUR64 = (("kernel_size", 25), ("kernel_std", 2.0), ("boundary", "circular"))
_BLUR256 = (("kernel_size", 61), ("kernel_std", 3.0), ("boundary", "circular"))
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("hdr", "hdr", GaussianNoise(0.025), "HDR", "hdr_inverse_inpaint"),
    Setting("exposure_ev1", "exposure", GaussianNoise(0.01), "exposure +1 EV", "hdr_inverse_inpaint", (("ev", 1.0),),
            (("ev", 1.0),)),
    Setting("exposure_ev2", "exposure", GaussianNoise(0.01), "exposure +2 EV", "hdr_inverse_inpaint", (("ev", 2.0),),
            (("ev", 2.0),)),
    Setting("phase_retrieval", "phase_retrieval", GaussianNoise(0.05), "phase retrieval", "hio_er",
            preset_restarts=PHASE_RESTARTS),
    Setting("deblur_camera", "deblur_camera", GaussianNoise(0.025), "camera deblur", "camera_tv", _BLUR64, _BLUR256),
    Setting("poisson_deblur_10", "deblur_gaussian", PoissonNoise(10), "Poisson deblur, peak 10", "richardson_lucy",
            _BLUR64, _BLUR256),
    Setting("poisson_deblur_50", "deblur_gaussian", PoissonNoise(50), "Poisson deblur, peak 50", "richardson_lucy",
            _BLUR64, _BLUR256),
    Setting("poisson_denoise_10", "denoise", PoissonNoise(10), "Poisson denoise, peak 10", "anscombe_tv"),
    Setting("poisson_denoise_50", "denoise", PoissonNoise(50), "Poisson denoise, peak 50", "anscombe_tv"),
)}
#: the rows' methods, in table order
METHOD_ROWS = ("nfc", "nfc-gaussian", "daps@16", "dps@16", "daps", "dps", "dpir", "classical")


def _run(method: str, setting: Setting) -> tuple[str, str | None, dict[str, Any]] | None:
    """(sampler, preset, restore() keywords) of a sampler's row (``classical``: ("classical", None, {}));
    None where the row does not exist."""
    if method == "classical":
        return "classical", None, {}
    poisson = setting.noise.gaussian_sigma is None
    # restarts at the presets only: the equal-NFE rows stay at NFC's network calls
    restarts = {"restarts": setting.preset_restarts} if setting.preset_restarts > 1 and "@" not in method else {}
    if method == "nfc":
        return "nfc", None, {}
    if method == "nfc-gaussian":
        return ("nfc", None, {"gaussian": True}) if poisson else None
    if method == "dpir":
        return "dpir", None, {}
    base, _, budget = method.partition("@")
    cfg = get_config(base, "fast")
    if budget:
        cfg = cfg.with_nfe(int(budget))
    return base, None, {"config": cfg, **restarts}


class NonlinearTier(Protocol):
    """The tier through the benchmark runner: per setting (a group: its measurements), every method."""

    tables = (RESULTS,)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.settings = [SETTINGS[t] for t in self.chosen(spec.tasks, list(SETTINGS), "--tasks", "settings")]
        self.names = self.photo_names()
        self.methods = [m for m in METHOD_ROWS if not spec.methods or m in spec.methods or m.split("@")[0] in spec.methods]
        self.prior = load_bench_prior(spec, device)
        self.prior_info = prior_record(spec.prior)

    def record(self) -> dict[str, Any]:
        configs = {m: _run(m, SETTINGS["hdr"])[2].get("config") for m in self.methods if "@" in m or m in ("daps", "dps")}
        return folder_record(self.spec, {k: v for k, v in configs.items() if v is not None}, self.prior_info,
                             self.prior.precision)

    def cases(self) -> list[Case]:
        return [Case((s.name, m), s.name, tuple((s.name, m, n) for n in self.names), m)
                for s in self.settings for m in self.methods if _run(m, s) is not None]

    def setup(self, group: Hashable, log: Callable[[str], None] = print) -> SimpleNamespace:
        """The setting's operator, truths x (N, 3, size, size) and seeded measurements y."""
        spec, setting = self.spec, SETTINGS[str(group)]
        zoom = spec.zoom if spec.size < 256 else 1
        x = self.photo_truths(self.names, zoom)
        op = build_operator(setting.task, spec.size, seed=0, **setting.params(spec.size)).to(self.device)
        gens = [torch.Generator(device=self.device).manual_seed(stable_seed(spec.seed, "nonlinear", setting.name, n))
                for n in self.names]
        y = op.measure(x, noise=setting.noise, generator=gens)
        log(f"{setting.name}: {len(self.names)} images of {spec.size} px")
        return SimpleNamespace(setting=setting, op=op, x=x, y=y)

    def _estimate(self, c: SimpleNamespace, method: str) -> tuple[Tensor, int]:
        s, op, y = c.setting, c.op, c.y
        if method == "classical":
            return restore_classical(s.classical, copy.deepcopy(op).cpu(), y.cpu(), s.noise), 0
        name, preset, kw = _run(method, s)
        kw = dict(kw)
        noise = s.noise
        if kw.pop("gaussian", False):
            noise = GaussianNoise(s.noise.reference_std())
            tol = 0.999 * range_tolerance(noise.sigma)  # inside it after float32 rounding
            y = y.clamp(-tol, 1 + tol)
        seeds = [stable_seed(self.spec.seed, "nonlinear-sampler", s.name, n) for n in self.names]
        out = restore(y, op, prior=self.prior, method=name, preset=preset, noise=noise, seed=seeds, progress=False,
                      **kw)
        return out.image, int(out.nfe)

    def measure(self, c: SimpleNamespace, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        setting, method = case.name
        t0 = time.perf_counter()
        try:
            xr, nfe = self._estimate(c, method)
            xr = xr.to(c.x.device).clamp(0, 1)
            note = ""
        except Exception as e:  # noqa: BLE001 - a failing method is a noted row
            xr, nfe, note = None, 0, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        seconds = (time.perf_counter() - t0) / len(self.names)
        for i, name in enumerate(self.names):
            row: Row = {"setting": setting, "method": method, "nfe": nfe, "image": name, "seconds": round(seconds, 2),
                        "psnr": "", "ssim": "", "note": note}
            if xr is not None:
                est, truth = xr[i:i + 1].double(), c.x[i:i + 1].double()
                best = rotation_twin_aligned(est, truth) if TASKS[c.setting.task].rotation_twin else est
                row["psnr"], row["ssim"] = round(float(psnr(best, truth)), 4), round(float(ssim(best, truth)), 4)
            if (setting, method, name) not in done:
                yield RESULTS.file, row
        if xr is not None and TASKS[c.setting.task].rotation_twin:
            xr = rotation_twin_aligned(xr.double(), c.x.double())
        log(f"{setting} {method}: " + (note or f"{float(psnr(xr.double(), c.x.double()).mean()):.2f} dB"))

    def header(self) -> dict[str, Any]:
        return {"images": f"{', '.join(self.names)} ({self.spec.size} px)", "prior": self.prior_info,
                "settings": "; ".join(f"{s.name}: {s.task} {s.params(self.spec.size) or ''} noise {s.noise}"
                                      for s in self.settings)}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        write_summary(self.spec.out, "Nonlinear and Poisson tier", header, nonlinear_table(tables[RESULTS.file]))
        return {}


def nonlinear_doc_table(folder: Path, link: str) -> str:
    """The tier's table from a committed run folder (results.csv, summary.md's header), with its
    source line."""
    rows, h, name = committed_rows(folder, RESULTS.file, RESULTS.columns, ("psnr", "ssim"))
    return (nonlinear_table(rows) + "\n\nPSNR in dB, mean over the images. "
            + source_note(name, link, h, h.get("images", "?")))


def nonlinear_table(rows: list[Row]) -> str:
    """Mean PSNR per (method, setting) in a markdown table (settings as columns; '–' where none)."""
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    L = ["| method | NFE | " + " | ".join(SETTINGS[s].label for s in settings) + " |",
         "|---|---|" + "---|" * len(settings)]
    for m in METHOD_ROWS:
        mine = [r for r in rows if r["method"] == m]
        if not mine:
            continue
        cells, nfes = [], sorted({str(r["nfe"]) for r in mine if str(r.get("psnr", "")) != ""})
        for s in settings:
            vals = [float(r["psnr"]) for r in mine if r["setting"] == s and str(r.get("psnr", "")) not in ("", "nan")]
            cells.append(fmt(float(np.mean(vals)), ".2f") if vals else "–")
        label = "classical (per column: " + ", ".join(CLASSICAL[SETTINGS[s].classical].label for s in settings) + ")" \
            if m == "classical" else m
        L.append(f"| {label} | {'/'.join(nfes) or '–'} | " + " | ".join(cells) + " |")
    return "\n".join(L)

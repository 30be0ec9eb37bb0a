"""The Gaussian-oracle protocol (:class:`Oracle`): GaussianSpectralPrior images, a circulant
blur, and each method's PSNR against the exact MMSE and posterior-sample bounds.

Gray images (alpha 2, pixel std 0.5 model units by default: --oracle-alpha, --oracle-pixel-std),
circulant Gaussian blur std 1.5 px, noise std 0.05 model units (the run's Gaussian noise, 0.025 in [0, 1] units).
PSNR here is on the *unclipped* estimates (the Gaussian's images leave [0, 1]; the bounds are for
unclipped estimators). A case is one method at one budget over all images in one batch."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator

import numpy as np
import torch
from torch import Tensor

from ..baselines import CLASSICAL, classical_methods
from ..io import atomic_write_text
from ..metrics import mse, psnr, ssim
from ..operators import BlurOperator, gaussian_kernel
from ..priors import GaussianSpectralPrior
from ..restore_inputs import stable_seed
from ..samplers import METHODS, Measurement, get_config, sample_chains
from .grid import RESULTS
from .runner import Case, Protocol, Row, Table, folder_record
from .tables import fmt, group_rows, is_failed, mean_std, numbers, row_order

#: the exact estimators' rows (closed form; always run)
EXACT = (("exact-mmse", "deterministic"), ("exact-sample", "sample"))
BLUR_STD = 1.5
DEFAULT_BUDGETS = (50, 200)
DEFAULT_IMAGES = 30


def oracle_blur() -> BlurOperator:
    """The oracle's operator: a circulant Gaussian blur of std ``BLUR_STD`` px."""
    return BlurOperator(gaussian_kernel(2 * math.ceil(4 * BLUR_STD) + 1, BLUR_STD), "circular")


def oracle_classical() -> tuple[str, ...]:
    """The classical methods that restore the oracle's measurement (its blur under Gaussian noise)."""
    return classical_methods(oracle_blur(), "gaussian")


def oracle_methods() -> tuple[str, ...]:
    """The registry names and classical answers the oracle runs (``--methods`` picks among them)."""
    return tuple(METHODS) + oracle_classical()


def oracle_configs(budget: int) -> list[tuple[str, str, Any]]:
    """(label, method, config) of the oracle table at NFE ``budget``: NFC/DAPS with the exact
    inner step, one-step predictor to sigma 1e-5, a posterior *sample* at the last level
    (final_step="sample"), isotropic vs spectral covariance (S from the measurement or the
    prior's true S); NFC with the default final mean step; NFC's ``fast`` and ``fast_psnr``
    presets with fresh and matched re-noising; every other sampler of the registry at its fast preset."""
    base = dataclasses.replace(get_config("nfc", "fast"), num_levels=budget, ode_steps=1, ode_sigma_min=1e-5,
                               inner="exact", final_step="sample")
    out = []
    for tag, cov, src in (("iso", "isotropic", "measurement"), ("spec-y", "spectral", "measurement"),
                          ("spec-S", "spectral", "prior")):
        c = dataclasses.replace(base, prior_covariance=cov, spectrum=src)
        out.append((f"daps-{tag}", "daps", c.as_daps()))
        out.append((f"nfc-{tag}", "nfc", c))
    # the toolkit's default last step returns the conditional mean at sigma_min (not a sample)
    out.append(("nfc-spec-y-final-mean", "nfc", dataclasses.replace(base, prior_covariance="spectral",
                                                                    spectrum="measurement", final_step="mean")))
    # NFC's presets as they ship (their own predictor and last step), each with both re-noisings
    for preset in ("fast", "fast_psnr"):
        for renoise in ("fresh", "matched"):
            out.append((f"nfc-{preset}-{renoise}", "nfc",
                        dataclasses.replace(get_config("nfc", preset).with_nfe(budget), renoise=renoise)))
    for m in METHODS:
        if m not in ("nfc", "daps"):
            out.append((m, m, get_config(m, "fast").with_nfe(budget)))
    return out


class Oracle(Protocol):
    """The Gaussian oracle through the benchmark runner: the exact rows, the classical answers,
    then every (label, method, config) of :func:`oracle_configs` at each budget."""

    tables = (Table(RESULTS.file, RESULTS.columns, RESULTS.key, ("method", "budget")),)

    def prepare(self, device: torch.device) -> None:
        spec = self.spec
        self.device = device
        self.n = spec.num_images or DEFAULT_IMAGES
        self.names = [f"g{i:02d}" for i in range(self.n)]
        self.seeds = [stable_seed(spec.seed, "oracle-sampler", nm) for nm in self.names]
        self.task = f"gauss_blur{BLUR_STD:g}"
        self.runs = [(label, method, cfg, b) for b in spec.budgets or DEFAULT_BUDGETS
                     for label, method, cfg in oracle_configs(b) if method in spec.methods]

    def record(self) -> dict[str, Any]:
        return folder_record(self.spec, {f"{label}@{b}": cfg for label, _, cfg, b in self.runs}, None)

    def _case(self, label: str, estimator: str, budget: int, item: Any) -> Case:
        return Case((label, str(budget)), "oracle",
                    tuple((self.task, nm, label, estimator, str(budget)) for nm in self.names[:1]), item)

    def cases(self) -> list[Case]:
        out = [self._case(label, est, 0, None) for label, est in EXACT]
        out += [self._case(label, "deterministic", 0, None) for label in oracle_classical() if label in self.spec.methods]
        return out + [self._case(label, "deterministic" if cfg.is_deterministic else "sample", b, (method, cfg))
                      for label, method, cfg, b in self.runs]

    def setup(self, group: Hashable = "oracle", log: Callable[[str], None] = print) -> SimpleNamespace:
        """The prior, the images x (n, 1, size, size) in [0, 1] units, the blur, y, its transfer
        function H and the bounds (dB)."""
        spec, device, size = self.spec, self.device, self.spec.size
        prior = GaussianSpectralPrior((size, size), alpha=spec.oracle_alpha, channels=1,
                                      pixel_std=spec.oracle_pixel_std).to(device)
        x_m = prior.sample(self.n, torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-images")),
                           dtype=torch.float64, device=device)
        op = oracle_blur().to(device)
        x = (x_m + 1) / 2
        y = op.measure(x, noise=spec.noise, generator=torch.Generator(device=device).manual_seed(
            stable_seed(spec.seed, "oracle-noise")))
        H = op.transfer_function(size, size, dtype=torch.float64, device=device)
        sig_m = 2 * spec.noise.gaussian_sigma  # the exact posterior's std in model units
        mmse_m = prior.mmse(H, sig_m)
        return SimpleNamespace(prior=prior, x=x, op=op, y=y, H=H, sig_m=sig_m,
                               bound_mmse=-10 * math.log10(mmse_m / 4), bound_sample=-10 * math.log10(2 * mmse_m / 4))

    def _estimate(self, c: SimpleNamespace, case: Case) -> tuple[Tensor, int]:
        """One case's estimates of every image (unclipped, [0, 1] units) and the NFE spent."""
        label, device = case.name[0], self.device
        if label == "exact-mmse":
            return (c.prior.posterior_mean(2 * c.y - 1, c.H, c.sig_m) + 1) / 2, 0
        if label == "exact-sample":
            g = torch.Generator(device=device).manual_seed(stable_seed(self.spec.seed, "oracle-exact-sample"))
            return (c.prior.posterior_sample(2 * c.y - 1, c.H, c.sig_m, g) + 1) / 2, 0
        if case.item is None:
            estimate = CLASSICAL[label].restore(copy.deepcopy(c.op).cpu(), c.y.cpu(), self.spec.noise)
            return estimate.to(device), 0
        method, cfg = case.item
        return sample_chains(method, c.prior, Measurement(c.op, c.y, self.spec.noise, tuple(c.x.shape)), cfg,
                             self.seeds)

    def measure(self, c, case: Case, done: set[tuple], log: Callable[[str], None]) -> Iterator[tuple[str, Row]]:
        label, budget = case.name
        est = case.keys[0][3]
        base = {"protocol": "oracle", "task": self.task, "method": label, "estimator": est, "budget": budget}
        t0 = time.perf_counter()
        try:
            xr, nfe = self._estimate(c, case)
        except Exception as e:  # noqa: BLE001 - a failing config is a noted row
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            for nm, seed in zip(self.names, self.seeds):
                yield RESULTS.file, {**base, "image": nm, "nfe": str(case.item[1].nfe if case.item else 0), "note": msg, "seed": str(seed)}
            log(f"oracle {label} @{budget}: FAILED {msg}")
            return
        secs = time.perf_counter() - t0
        x, xr = c.x.double(), xr.detach().double()
        p, e, s = psnr(xr, x), mse(xr, x), ssim(xr, x)
        for i, (nm, seed) in enumerate(zip(self.names, self.seeds)):
            yield RESULTS.file, {**base, "image": nm, "nfe": str(nfe), "psnr": fmt(float(p[i]), ".4f"),
                                 "ssim": fmt(float(s[i]), ".5f"), "mse": fmt(float(e[i]), ".6e"), "lpips": "",
                                 "seconds": fmt(secs / self.n, ".4f"), "peak_mem_mb": "", "seed": str(seed), "note": ""}
        log(f"oracle {label} @{budget} [{est}]: PSNR(mean MSE) {-10 * math.log10(float(e.mean())):.2f} dB "
            f"(sample bound {c.bound_sample:.2f}, MMSE bound {c.bound_mmse:.2f}) {secs:.1f}s")

    def failed(self, row: Row) -> bool:
        return is_failed(row)

    def order(self, table: Table, cases) -> Callable[[Row], Any]:
        labels = [label for label, _ in EXACT] + list(oracle_classical()) + [label for label, _, _ in oracle_configs(1)]
        return row_order(dataclasses.replace(self.spec, methods=tuple(dict.fromkeys(labels))), self.names)

    def header(self) -> dict[str, Any]:
        spec, k = self.spec, 2 * math.ceil(4 * BLUR_STD) + 1
        return {"prior": f"GaussianSpectralPrior {spec.size}x{spec.size} gray, alpha {spec.oracle_alpha:g}, "
                          f"pixel std {spec.oracle_pixel_std:g} (model units)",
                "images": self.n, "operator": f"circulant Gaussian blur std {BLUR_STD} px ({k}x{k})",
                "sigma_y": f"{2 * spec.noise.gaussian_sigma:g} model units ({spec.noise.gaussian_sigma} in [0, 1])"}

    def finish(self, tables: dict[str, list[Row]], header: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
        c = self.setup()
        atomic_write_text(self.spec.out / "summary.md",
                          oracle_markdown(tables[RESULTS.file], header, c.bound_mmse, c.bound_sample))
        log(f"wrote {self.spec.out / 'results.csv'} and {self.spec.out / 'summary.md'}")
        return {"bound_mmse_db": c.bound_mmse, "bound_sample_db": c.bound_sample}


def oracle_markdown(rows: list[dict[str, str]], header: dict[str, Any], bound_mmse: float, bound_sample: float) -> str:
    """summary.md of the oracle protocol: each method's PSNR against the exact bounds."""
    L = ["# Gaussian-oracle table", ""] + [f"- **{k}**: {v}" for k, v in header.items()]
    L += ["", f"Exact bounds (closed form): posterior mean (MMSE) **{bound_mmse:.2f} dB**, exact posterior "
          f"sample (2 x MMSE) **{bound_sample:.2f} dB**. `PSNR(mean MSE)` = -10 log10 of the MSE averaged over "
          "images (comparable with the bounds); per-image PSNR mean ± std beside it. Unclipped estimates. "
          "A sampler is judged against the *sample* bound, a deterministic estimator against the MMSE bound.", "",
          "| method | NFE | PSNR(mean MSE) | per-image PSNR | to sample bound | to MMSE bound | s / image |",
          "|---|---|---|---|---|---|---|"]
    for (task, m, est, b), rs in group_rows(rows).items():
        mses = numbers(rs, "mse")
        if not mses:
            L.append(f"| {m} | {b} | failed: {rs[0].get('note', '')[:80]} | | | | |")
            continue
        p = -10 * math.log10(float(np.mean(mses)))
        mu, sd = mean_std(numbers(rs, "psnr"))
        secs = numbers(rs, "seconds")
        L.append(f"| {m} | {b} | {p:.2f} | {mu:.2f} ± {sd:.2f} | {p - bound_sample:+.2f} | {p - bound_mmse:+.2f} | "
                 f"{(np.mean(secs) if secs else float('nan')):.3f} |")
    return "\n".join(L) + "\n"

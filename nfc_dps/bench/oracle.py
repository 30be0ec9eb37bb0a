"""The Gaussian-oracle protocol (:func:`run_oracle`): GaussianSpectralPrior images, a circulant
blur, and each method's PSNR against the exact MMSE and posterior-sample bounds."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..api import stable_seed
from ..io import atomic_write_text
from .instruments import machine_description
from ..distributed import init_distributed, resolve_device
from .runner import check_folder_record, folder_record
from .spec import BenchSpec
from .tables import PartWriter, all_rows, fmt, group_rows, is_failed, mean_std, merge_results, numbers, row_key
from ..samplers import get_config, counting, get_method
from ..baselines import tv_restore, wiener
from ..metrics import mse, psnr, ssim
from ..operators import BlurOperator, gaussian_kernel
from ..priors import GaussianSpectralPrior
from ..api import image_generators


def oracle_configs(budget: int) -> list[tuple[str, str, Any]]:
    """(label, method, config) of the oracle table at NFE ``budget``: NFC/DAPS with the exact
    inner step, one-step predictor to sigma 1e-5, a posterior *sample* at the last level
    (final_step="sample"), isotropic vs spectral covariance (S from the measurement or the
    prior's true S); NFC with the default final mean step; NFC's ``fast`` and ``fast_psnr``
    presets with fresh and matched re-noising; the peers at their fast presets."""
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
    for m in ("dps", "diffpir", "ddnm", "ddrm"):
        out.append((m, m, dataclasses.replace(get_config(m, "fast"), num_steps=budget)))
    return out


def run_oracle(spec: BenchSpec, log: Callable[[str], None] = print) -> list[dict[str, str]]:
    """Gaussian-oracle table: GaussianSpectralPrior images (gray, alpha 2, pixel std 0.5 model
    units by default: --oracle-alpha, --oracle-pixel-std), circulant Gaussian blur std 1.5 px, sigma_y = 0.05 model units (spec.sigma_y in
    [0, 1] units); each method's PSNR against the exact MMSE and exact-posterior-sample bounds.
    PSNR here is on the *unclipped* estimates (the Gaussian's images leave [0, 1]; the bounds are
    for unclipped estimators). Single process (rank 0 works, the others wait)."""
    t_start = time.perf_counter()
    d = init_distributed(spec.device)
    device = resolve_device(spec.device, d)
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, str]] = []
    if d.rank == 0:
        n = spec.num_images or 30
        size = spec.size
        prior = GaussianSpectralPrior((size, size), alpha=spec.oracle_alpha, channels=1,
                                      pixel_std=spec.oracle_pixel_std).to(device)
        x_m = prior.sample(n, torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-images")),
                           dtype=torch.float64, device=device)
        x = (x_m + 1) / 2
        std = 1.5
        op = BlurOperator(gaussian_kernel(2 * math.ceil(4 * std) + 1, std), "circular").to(device)
        y = op.measure(x, spec.sigma_y, torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-noise")))
        sig_m = 2 * spec.sigma_y
        H = op.transfer_function(size, size, dtype=torch.float64, device=device)
        mmse_m = prior.mmse(H, sig_m)
        bound_mmse = -10 * math.log10(mmse_m / 4)
        bound_sample = -10 * math.log10(2 * mmse_m / 4)
        names = [f"g{i:02d}" for i in range(n)]
        seeds = [stable_seed(spec.seed, "oracle-sampler", nm) for nm in names]
        task = f"gauss_blur{std:g}"
        existing = all_rows(out)
        done = {row_key(r) for r in existing if not is_failed(r)}  # failed rows are retried
        configs = {f"{label}@{b}": cfg for b in spec.budgets or (50, 200) for label, method, cfg in oracle_configs(b)
                   if method in spec.methods}
        record, notes = check_folder_record(spec, out / "config.json", folder_record(spec, configs, None),
                                            {f"{r['method']}@{r['budget']}" for r in existing})
        for note in notes:
            log(note)
        writer = PartWriter(out / "parts" / "rank0.csv")

        def emit(label: str, est: str, budget: str, xr: Tensor, secs: float, nfe: int, note: str = "") -> None:
            xr = xr.detach().double()
            p, e = psnr(xr, x.double()), mse(xr, x.double())
            s = ssim(xr, x.double())
            for i, nm in enumerate(names):
                writer.write({"protocol": "oracle", "task": task, "image": nm, "method": label, "estimator": est,
                              "budget": budget, "nfe": str(nfe), "psnr": fmt(float(p[i]), ".4f"),
                              "ssim": fmt(float(s[i]), ".5f"), "mse": fmt(float(e[i]), ".6e"), "lpips": "",
                              "seconds": fmt(secs / n, ".4f"), "peak_mem_mb": "", "seed": str(seeds[i]), "note": note})
            log(f"oracle {label} @{budget} [{est}]: PSNR(mean MSE) {-10 * math.log10(float(e.mean())):.2f} dB "
                f"(sample bound {bound_sample:.2f}, MMSE bound {bound_mmse:.2f}) {secs:.1f}s")

        try:
            y_m = 2 * y - 1
            if (task, names[0], "exact-mmse", "deterministic", "0") not in done:
                t0 = time.perf_counter()
                xm = (prior.posterior_mean(y_m, H, sig_m) + 1) / 2
                emit("exact-mmse", "deterministic", "0", xm, time.perf_counter() - t0, 0)
            if (task, names[0], "exact-sample", "sample", "0") not in done:
                t0 = time.perf_counter()
                g = torch.Generator(device=device).manual_seed(stable_seed(spec.seed, "oracle-exact-sample"))
                xs = (prior.posterior_sample(y_m, H, sig_m, g) + 1) / 2
                emit("exact-sample", "sample", "0", xs, time.perf_counter() - t0, 0)
            for label, fn in (("wiener", wiener), ("tv", tv_restore)):
                if label in spec.methods and (task, names[0], label, "deterministic", "0") not in done:
                    t0 = time.perf_counter()
                    xr = fn(op.cpu(), y.cpu(), spec.sigma_y).to(device)
                    op.to(device)
                    emit(label, "deterministic", "0", xr, time.perf_counter() - t0, 0)
            for b in spec.budgets or (50, 200):
                for label, method, cfg in oracle_configs(b):
                    if method not in spec.methods:
                        continue
                    if (task, names[0], label, "sample", str(b)) in done:
                        continue
                    t0 = time.perf_counter()
                    try:
                        counted = counting(prior)
                        gens = image_generators(seeds, 1, device=device)
                        xr = get_method(method).sample(counted, op, y, spec.sigma_y, tuple(x.shape), cfg, gens, None)
                        if not torch.isfinite(xr).all():
                            raise FloatingPointError("NaN/Inf in the output")
                        emit(label, "sample", str(b), xr, time.perf_counter() - t0, counted.nfe)
                    except Exception as e:  # noqa: BLE001 - a failing config is a noted row
                        msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                        for i, nm in enumerate(names):
                            writer.write({"protocol": "oracle", "task": task, "image": nm, "method": label,
                                          "estimator": "sample", "budget": str(b), "nfe": str(cfg.nfe), "note": msg,
                                          "seed": str(seeds[i])})
                        log(f"oracle {label} @{b}: FAILED {msg}")
        finally:
            writer.close()
        oracle_spec = dataclasses.replace(spec, methods=tuple(dict.fromkeys(
            ["exact-mmse", "exact-sample", "wiener", "tv"] + [l for l, _, _ in oracle_configs(1)])))
        rows = merge_results(oracle_spec, names)
        header = {"label": spec.label} if spec.label else {}
        header.update({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "prior": f"GaussianSpectralPrior {size}x{size} gray, alpha {spec.oracle_alpha:g}, "
                                f"pixel std {spec.oracle_pixel_std:g} (model units)",
                       "images": n, "operator": f"circulant Gaussian blur std {std} px ({op.kernel.shape[-1]}x{op.kernel.shape[-1]})",
                       "sigma_y": f"{sig_m:g} model units ({spec.sigma_y} in [0, 1])",
                       "machine": machine_description().get("cpu", ""),
                       "wall time of this invocation": f"{(time.perf_counter() - t_start) / 60:.1f} min"})
        atomic_write_text(out / "summary.md", oracle_markdown(rows, header, bound_mmse, bound_sample))
        atomic_write_text(out / "config.json", json.dumps({**record, "header": header,
                                                            "bound_mmse_db": bound_mmse,
                                                            "bound_sample_db": bound_sample}, indent=1, default=str))
        log(f"wrote {out / 'results.csv'} and {out / 'summary.md'}")
    d.barrier()
    if d.initialised:
        import torch.distributed as dist

        dist.destroy_process_group()
    return rows


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

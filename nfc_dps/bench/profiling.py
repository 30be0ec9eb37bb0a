"""The per-NFE profile (:func:`run_profile`): each diffusion method's time per network evaluation
against the bare network forward, with a phase breakdown read from ``torch.profiler``: the
samplers mark their building blocks with ``record_function("nfc.<phase>")``
(:data:`nfc_dps.samplers.nfc.PHASES`)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from ..api import restore
from ..distributed import Dist, init_distributed, resolve_device
from ..io import atomic_write_text
from ..priors.base import PriorWrapper
from .instruments import machine_description
from .measurements import load_images, measurement
from .runner import load_bench_prior, prior_record
from .spec import BenchSpec, method_runs, task_specs

#: the profile's column of each ``record_function`` range the samplers mark (``nfc.<phase>``)
PHASE_LABELS = {"nfc.predictor": "predictor", "nfc.inner_exact": "inner (exact)",
                "nfc.inner_langevin": "inner (langevin)", "nfc.band": "band mask (FFT)", "nfc.haar": "haar fuse",
                "nfc.spectrum": "spectrum fit", "nfc.renoise": "re-noise"}


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that wall times measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profiled_phases(run: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """(``run()``'s result, seconds spent in each :data:`PHASE_LABELS` range, by label), from a
    ``torch.profiler`` trace of the run (host time of each range, summed over its calls)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key in PHASE_LABELS:
            label = PHASE_LABELS[event.key]
            totals[label] = totals.get(label, 0.0) + event.cpu_time_total / 1e6
    return result, totals


def _timed_prior(inner, device: torch.device, totals: dict[str, float]):
    """A prior wrapper accumulating the wall time of its denoise calls (the network) in totals["network"]."""
    class TimedPrior(PriorWrapper):
        def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
            _sync(device)
            t0 = time.perf_counter()
            out = self.inner.denoise(x, sigma)
            _sync(device)
            totals["network"] = totals.get("network", 0.0) + time.perf_counter() - t0
            return out

    return TimedPrior(inner)


def run_profile(spec: BenchSpec, log: Callable[[str], None] = print, reps: int = 5) -> dict[str, Any]:
    """Per-NFE cost of each diffusion method against the bare network forward (target <= 1.1x),
    with a phase breakdown for NFC/DAPS. Writes profile.md and profile.json (rank 0 only). Each
    method runs twice: once as is (the per-NFE and network times), once under ``torch.profiler``
    (the phase breakdown, CPU activity: host time, so on a GPU a phase is its launch time, and the
    profiler's per-operator cost is in it)."""
    d = init_distributed(spec.device)
    device = resolve_device(spec.device, d)
    try:
        return _profile(spec, d, device, log, reps) if d.rank == 0 else {}
    finally:
        if d.initialised:
            import torch.distributed as dist

            dist.destroy_process_group()


def _profile(spec: BenchSpec, d: Dist, device: torch.device, log: Callable[[str], None], reps: int) -> dict[str, Any]:
    """The profile on rank 0: bare forwards, then each diffusion method's timed run."""
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    prior = load_bench_prior(spec, device)
    task = task_specs(spec.protocol, spec.size, spec.boundary)[spec.tasks[0]]
    images = load_images(spec)
    name, img = images[0]
    pspec = dataclasses.replace(spec, save_images=False)
    op, x, y, _ = measurement(pspec, task, name, img)
    op = op.to(device)
    y = y.to(device)
    xm = (2 * x - 1).to(device)

    def sync() -> None:
        _sync(device)

    def forward_time(sigma: float) -> float:
        sv = torch.full((1,), sigma, device=device)
        noisy = xm + sigma * torch.randn_like(xm)
        sync()
        t0 = time.perf_counter()
        prior.denoise(noisy, sv)
        sync()
        return time.perf_counter() - t0

    with torch.no_grad():
        for _ in range(2):
            forward_time(1.0)
        bare = float(np.median([forward_time(1.0) for _ in range(reps)]))
        # a tiled prior's cost depends on sigma (its tile grid shifts with sigma): average a sweep
        sweep = float(np.mean([forward_time(float(s)) for s in np.geomspace(0.01, 80.0, 2 * reps)]))
    log(f"bare network forward ({spec.size}x{spec.size}, 1 image): {bare * 1000:.1f} ms at sigma 1 (median of {reps}), "
        f"{sweep * 1000:.1f} ms mean over a sigma sweep")
    result: dict[str, Any] = {"size": spec.size, "task": task.name, "image": name, "device": str(device),
                              "bare_forward_s": bare,
                              "bare_forward_sweep_s": sweep, "machine": machine_description(),
                              "prior": prior_record(spec.prior), "precision": prior.precision, "methods": {}}
    # the harness's columns (``nfc:deterministic`` included) at the first budget; classical ones use no network
    columns = [r for r in method_runs(dataclasses.replace(spec, budgets=spec.budgets[:1])) if r.config is not None]
    for run in columns:
        m, cfg = run.label, run.config
        totals: dict[str, float] = {}
        traced: dict[str, float] = {}

        def timed_run(into: dict[str, float], cfg=cfg, run=run) -> Any:
            return restore(y, op, prior=_timed_prior(prior, device, into), method=run.method, config=cfg,
                           noise=spec.noise, seed=0, progress=False)

        try:  # the headline times without the profiler; the phases from a second, profiled run
            sync()
            t0 = time.perf_counter()
            res = timed_run(totals)
            sync()
            total = time.perf_counter() - t0
            _, phases = profiled_phases(lambda: timed_run(traced))
            sync()
            traced_total = time.perf_counter() - t0 - total
        except Exception as e:  # noqa: BLE001
            result["methods"][m] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{m}: FAILED {e}")
            continue
        per = total / max(1, res.nfe)
        net = totals.get("network", 0.0)
        phases = {"network": traced.get("network", 0.0), **phases}
        if "predictor" in phases:
            phases["predictor (non-network)"] = phases.pop("predictor") - phases["network"]
        phases["other"] = traced_total - sum(v for v in phases.values())
        result["methods"][m] = {"nfe": res.nfe, "total_s": total, "per_nfe_s": per,
                                "network_per_call_s": net / max(1, res.nfe), "overhead_ratio": total / max(net, 1e-12),
                                "ratio": per / sweep, "phases_s": phases, "config": dataclasses.asdict(cfg)}
        log(f"{m}: {res.nfe} NFE in {total:.2f}s, {per * 1000:.1f} ms/NFE; total / network time {total / max(net, 1e-12):.3f}x; "
            f"{per / sweep:.2f}x the bare forward (sweep)")
    atomic_write_text(out / "profile.json", json.dumps(result, indent=1, default=str))
    atomic_write_text(out / "profile.md", profile_markdown(result))
    log(f"wrote {out / 'profile.md'}")
    return result


def profile_markdown(result: dict[str, Any]) -> str:
    """profile.md: the per-NFE table and the phase breakdown of :func:`run_profile`'s result."""
    mach = result["machine"]
    L = ["# Profile: time per network evaluation", "",
         f"- image {result['image']} {result['size']}x{result['size']}, task {result['task']}, device {result['device']}, "
         f"{mach.get('cpu', '')} (nproc {mach.get('nproc')})",
         f"- prior: {result['prior'].get('path')} (sha256 {result['prior'].get('sha256', '?')})",
         f"- bare network forward (the prior's denoise, batch 1): {result['bare_forward_s'] * 1000:.1f} ms at sigma 1 "
         f"(median); **{result['bare_forward_sweep_s'] * 1000:.1f} ms** mean over a sigma sweep 0.01..80 (a tiled "
         "prior's cost varies with sigma: its tile grid shifts)",
         "", "Target: time per NFE <= 1.1 x the bare forward. `total / network` divides the run's wall time by the "
         "time spent inside the network calls of that same run (the sampler's own overhead, independent of tiling); "
         "`vs bare` divides the time per NFE by the sweep's mean forward.", "",
         "| method | NFE | total s | ms / NFE | network ms / call (in run) | total / network | vs bare |",
         "|---|---|---|---|---|---|---|"]
    for m, r in result["methods"].items():
        if "error" in r:
            L.append(f"| {m} | – | failed: {r['error'][:80]} | | | | |")
            continue
        L.append(f"| {m} | {r['nfe']} | {r['total_s']:.2f} | {r['per_nfe_s'] * 1000:.1f} | "
                 f"{r['network_per_call_s'] * 1000:.1f} | **{r['overhead_ratio']:.3f}x** | {r['ratio']:.2f}x |")
    L += ["", "Breakdown (seconds, a second run under torch.profiler, whose own cost is in these times; a phase is the host time of its "
          "`record_function` range; the network is timed inside the predictor; for DPS 'other' is mostly "
          "the backward pass through the network):", "",
          "| method | " + " | ".join(["network", "predictor (non-network)", "inner (exact)", "inner (langevin)",
                                      "band mask (FFT)", "haar fuse", "spectrum fit", "re-noise", "other"]) + " |",
          "|---|" + "---|" * 9]
    for m, r in result["methods"].items():
        if "error" in r:
            continue
        ph = r["phases_s"]
        L.append(f"| {m} | " + " | ".join(f"{ph.get(k, 0.0):.3f}" for k in
                                           ["network", "predictor (non-network)", "inner (exact)", "inner (langevin)",
                                            "band mask (FFT)", "haar fuse", "spectrum fit", "re-noise", "other"]) + " |")
    return "\n".join(L) + "\n"

"""The markdown of a prior report (:mod:`nfc_dps.priors.report`): its own section and the docs' table
(:func:`prior_table`), and the summary of a training run's loss log (``nfc-dps prior-report --loss-csv``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def loss_table(rows: list[dict], every: int, window: int = 5) -> str:
    """Markdown table: loss (mean of the ``window`` logged values up to the step) every ``every`` steps."""
    lines = [f"| step | hours | loss (mean of last {window} logs) | crops/s |", "| ---: | ---: | ---: | ---: |"]
    marks = [r for r in rows if r["step"] % every == 0] or rows[-1:]
    if rows and marks[-1] is not rows[-1]:
        marks.append(rows[-1])
    for m in marks:
        i = rows.index(m)
        seg = rows[max(0, i - window + 1) : i + 1]
        lines.append(f"| {m['step']} | {m['hours']:.2f} | {np.mean([r['loss'] for r in seg]):.4f} "
                     f"| {np.median([r['crops_per_s'] for r in seg]):.1f} |")
    return "\n".join(lines)


def fmt(v: float | None) -> str:
    """A PSNR cell: two decimals, or n/a."""
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.2f}"


def markdown(report: dict) -> str:
    """The report's markdown section: the table, the protocol's notes, timing and acceptance."""
    strong = report["acceptance"]["strong_margin_db_required"]
    sig = report["sigmas"]
    rows = report["rows"]
    head = "| method | " + " | ".join(f"σ = {s}" for s in sig) + " |"
    lines = [head, "| --- |" + " ---: |" * len(sig)]
    for key, label in report["row_labels"].items():
        if key in rows:
            lines.append(f"| {label} | " + " | ".join(fmt(rows[key].get(str(s))) for s in sig) + " |")
    for key, label in (("tiled", "margin: tiled − best of TV/wavelet"), ("overlap", "margin: overlap − best of TV/wavelet")):
        if key in report["margins"]:
            lines.append(f"| **{label}** | " + " | ".join(
                f"**{report['margins'][key][str(s)]:+.2f}**" for s in sig) + " |")
    if report.get("margin_over_tv_oracle"):
        lines.append("| **margin: tiled − TV at its best weight per image** | " + " | ".join(
            f"**{report['margin_over_tv_oracle'][str(s)]:+.2f}**" for s in sig) + " |")
    p = report["prior"]
    crop = report["eval"]["crop"]
    where = "whole images" if crop <= 0 else f"{crop}×{crop} centre crops"
    tim = report["timing"]
    m = report["machine"]
    job = "running" if m["training_job_pids"] else "not running"
    lines += [
        "",
        f"PSNR in dB (data range 1, clipped to [0, 1], mean over the held-out {', '.join(report['eval']['images'])}; "
        f"{where}); σ in [0, 1] units (model units 2σ); noise seed {report['eval']['seed']}. "
        f"Prior: `{p['path']}`" + (f", training step {p['step']}" if p.get("step") is not None else "")
        + (f" ({p['label']})" if p.get("label") else "") + f", {p['parameters']:,} parameters, "
        f"{p['disk_bytes'] / 1e6:.1f} MB on disk.",
        "",
        "Baselines tuned per σ on " + f"{len(report['tuning']['crops'])} random "
        f"{report['tuning']['crop_size']}² crops of training photos ({', '.join(sorted(set(report['tuning']['crops'])))}):",
    ]
    for s in sig:
        e = report["tuning"]["per_sigma"][str(s)]
        tv = e["tv"]
        t = f"TV weight {tv['weight']:.4f}" + (" (grid edge!)" if tv["at_grid_edge"] else "")
        if "wavelet" in e:
            w = e["wavelet"]
            t += (f"; wavelet {w['method']}, {w['wavelet']}, {'YCbCr' if w['ycbcr'] else 'RGB'}, sigma {w['sigma']:.4f}"
                  + (" (grid edge!)" if w["at_grid_edge"] else ""))
        lines.append(f"- σ = {s}: {t}")
    if not report["tuning"]["wavelet_available"]:
        lines.append("- wavelet baseline skipped: PyWavelets is not installed")
    lines += [
        "",
        "Forward pass at 256×256 (no grad, batch 1, median of "
        f"{tim['tiled']['runs']} after a warm-up): "
        + ", ".join(f"{report['row_labels'][k]} {tim[k]['median_s']:.2f} s (min {tim[k]['min_s']:.2f} s)"
                    for k in ("tiled", "overlap", "whole") if k in tim)
        + (f"; network precision {p['precision']}" if "precision" in p else "")
        + (f" (as sampled in float32: {tim['tiled_float32']['median_s']:.2f} s, min {tim['tiled_float32']['min_s']:.2f} s)"
           if "tiled_float32" in tim else "")
        + f"; {m['torch_threads']} torch threads on {m['nproc']} cores"
        + (f" ({m['cpu']}, {m['cpu_capability']})" if m.get("cpu") else "") + f", training job {job} "
        f"(load average {m['load_average_1_5_15'][0]:.1f} at the end).",
        "",
        "Acceptance (prior as sampled beats the best of TV/wavelet by ≥ 1 dB at every σ; 256×256 forward < 1 s): "
        f"denoising **{'PASS' if report['acceptance']['denoise_margin'] else 'FAIL'}**, "
        f"speed **{'PASS' if report['acceptance']['speed'] else 'FAIL'}**"
        + (" (timed while the training job shared the cores)" if m["training_job_pids"] else "") + ".",
        f"Stronger-prior target (margin ≥ {strong:g} dB at every σ): "
        f"**{'PASS' if report['acceptance']['strong_margin'] else 'FAIL'}**"
        + "".join(f"; σ = {k}: {v:+.2f}" + (f" (short by {strong - v:.2f})" if v < strong else "")
                  for k, v in report["margins"].get("tiled", {}).items()) + ".",
    ]
    if report.get("margin_over_tv_oracle"):
        ok = report["acceptance"]["strong_margin_over_tv_oracle"]
        lines[-1] += (f" Against TV at its best weight per image: **{'PASS' if ok else 'FAIL'}**"
                      + "".join(f"; σ = {k}: {v:+.2f}" + (f" (short by {strong - v:.2f})" if v < strong else "")
                                for k, v in report["margin_over_tv_oracle"].items()) + ".")
    return "\n".join(lines)


def prior_table(report: Path, link: str) -> str:
    """The one-step denoising report of the shipped prior (``nfc-dps prior-report``'s JSON)."""
    d = json.loads(report.read_text())
    sig = [str(s) for s in d["sigmas"]]
    L = ["| method | " + " | ".join(f"σ = {s}" for s in sig) + " |", "| --- |" + " ---: |" * len(sig)]
    for key, label in d["row_labels"].items():
        vals = d["rows"][key]
        cells = [f"{vals[s]:.2f}" for s in sig]
        if key == "tiled":
            cells = [f"**{c}**" for c in cells]
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    for key, vals in d.get("margins", {}).items():
        L.append(f"| **margin: {d['row_labels'].get(key, key)} − best of TV / wavelet** | "
                 + " | ".join(f"**{vals[s]:+.2f}**" for s in sig) + " |")
    if d.get("margin_over_tv_oracle"):
        L.append(f"| **margin: {d['row_labels'].get('tiled', 'tiled')} − TV at its best weight per image** | "
                 + " | ".join(f"**{d['margin_over_tv_oracle'][s]:+.2f}**" for s in sig) + " |")
    t, m, p = d.get("timing", {}), d.get("machine", {}), d.get("prior", {})
    L.append("")
    bits = [f"Prior `{p.get('label', '')}` ({p.get('parameters', 0):,} parameters, "
            f"{p.get('disk_bytes', 0) / 1e6:.1f} MB on disk, network in {p.get('precision', '?')})",
            f"{len(d['eval']['images'])} held-out photos ({', '.join(d['eval']['images'])}), "
            f"{d['eval']['crop']} × {d['eval']['crop']} centre crops"]
    if "tiled" in t:
        ft = t.get("tiled_float32", {})
        bits.append(f"a 256 × 256 forward pass takes {t['tiled']['median_s']:.2f} s"
                    + (f" ({ft['median_s']:.2f} s in float32)" if ft else "")
                    + f" on {m.get('torch_threads', '?')} threads of an {m.get('cpu', 'unknown CPU')}")
    bits.append(f"measured {d.get('created', '')[:10]}; source [`{report.name}`]({link}{report.name})")
    L.append("; ".join(bits) + ".")
    return "\n".join(L)

"""The benchmark's figures: grid.png (one image across methods and tasks; PIL only) and, when
matplotlib is installed, psnr_vs_nfe.png and bars.png."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..io import atomic_write_bytes
from .spec import BenchSpec
from .tables import group_rows, mean_std, numbers


def make_plots(spec: BenchSpec, rows: list[dict[str, str]], image_names: Sequence[str],
               log: Callable[[str], None]) -> list[str]:
    """grid.png (PIL only) and, with matplotlib, psnr_vs_nfe.png and bars.png. Returns file names."""
    made = []
    if spec.save_images:
        with contextlib.suppress(Exception):
            if _visual_grid(spec, rows, image_names):
                made.append("grid.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: skipping psnr_vs_nfe.png and bars.png (pip install 'nfc_dps[bench]'); "
            "results.csv, summary.md and grid.png are written")
        return made
    groups = group_rows(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not tasks:
        return made
    budgets = sorted({int(b) for (_, _, _, b) in groups if b not in ("0", "")})
    n = len(tasks)
    if len(budgets) > 1:
        fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.4), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            for m in dict.fromkeys(k[1] for k in groups if k[0] == t):
                for est in dict.fromkeys(k[2] for k in groups if k[0] == t and k[1] == m):
                    pts = [(int(b), np.mean(numbers(groups[(t, m, est, b)], "psnr")))
                           for (tt, mm, ee, b) in groups if (tt, mm, ee) == (t, m, est) and b != "0"
                           and numbers(groups[(t, m, est, b)], "psnr")]
                    lab = m if est == "sample" else f"{m} ({est})"
                    if pts:
                        pts.sort()
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
                    elif (t, m, est, "0") in groups and numbers(groups[(t, m, est, "0")], "psnr"):
                        ax.axhline(np.mean(numbers(groups[(t, m, est, "0")], "psnr")), ls="--", lw=1, label=lab,
                                   color="gray" if m == "tv" else None)
            ax.set_xscale("log")
            ax.set_title(t)
            ax.set_xlabel("NFE")
            ax.set_ylabel("PSNR (dB)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="best")
        fig.tight_layout()
        _save_fig(fig, spec.out / "psnr_vs_nfe.png")
        plt.close(fig)
        made.append("psnr_vs_nfe.png")
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.6), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        best: dict[str, tuple[int, float, float]] = {}
        for (tt, m, est, b), rs in groups.items():
            v = numbers(rs, "psnr")
            if tt != t or not v:
                continue
            lab = m if est in ("sample", "deterministic") else f"{m} {est}"
            if lab not in best or int(b) > best[lab][0]:
                best[lab] = (int(b), *mean_std(v))
        labs = list(best)
        ax.bar(range(len(labs)), [best[k][1] for k in labs], yerr=[best[k][2] for k in labs], capsize=2)
        ax.set_xticks(range(len(labs)))
        ax.set_xticklabels(labs, rotation=60, ha="right", fontsize=7)
        lo = min(best[k][1] - best[k][2] for k in labs) if labs else 0
        ax.set_ylim(max(0, lo - 2), None)
        ax.set_title(f"{t} (largest budget)")
        ax.set_ylabel("PSNR (dB)")
    fig.tight_layout()
    _save_fig(fig, spec.out / "bars.png")
    plt.close(fig)
    made.append("bars.png")
    return made


def _save_fig(fig, path: Path) -> None:
    """A matplotlib figure as a PNG (110 dpi), written atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def _visual_grid(spec: BenchSpec, rows: list[dict[str, str]], image_names: Sequence[str]) -> bool:
    """grid.png: for the first image, one row per task: ground truth, measurement, every method
    (largest budget, single sample), labelled. PIL only."""
    from PIL import Image, ImageDraw

    if not rows:
        return False
    image = next((n for n in image_names if any(r["image"] == n for r in rows)), rows[0]["image"])
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cols: dict[str, str] = {}
    for r in rows:
        if r["image"] != image or r["estimator"] not in ("sample", "deterministic") or r.get("note"):
            continue
        prev = cols.get(r["method"])
        if prev is None or int(r["budget"]) > int(prev):
            cols[r["method"]] = r["budget"]
    order = {m: i for i, m in enumerate(spec.methods)}
    methods = sorted(cols, key=lambda m: order.get(m, len(order)))
    heads = ["ground truth", "measurement"] + [m + ("" if cols[m] == "0" else f" @{cols[m]}") for m in methods]
    scale = max(1, 128 // spec.size)
    tile, pad, top, left = spec.size * scale, 4, 16, 110
    W = left + len(heads) * (tile + pad)
    H = top + len(tasks) * (tile + pad)
    canvas = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(canvas)
    for j, h in enumerate(heads):
        draw.text((left + j * (tile + pad), 2), h[: max(6, tile // 6)], fill="black")
    for i, t in enumerate(tasks):
        draw.text((2, top + i * (tile + pad) + tile // 2), t, fill="black")
        folder = spec.out / "images" / t / image
        files = ["gt.png", "measurement.png"] + [f"{m}-{'deterministic' if cols[m] == '0' else 'sample'}-{cols[m]}.png"
                                                for m in methods]
        for j, fn in enumerate(files):
            p = folder / fn
            if p.is_file():
                im = Image.open(p).convert("RGB").resize((tile, tile), Image.NEAREST)
                canvas.paste(im, (left + j * (tile + pad), top + i * (tile + pad)))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    atomic_write_bytes(spec.out / "grid.png", buf.getvalue())
    return True

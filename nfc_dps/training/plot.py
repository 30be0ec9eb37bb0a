"""Loss curves of ``train-prior`` work folders: read ``loss.csv`` and draw it (PIL, no matplotlib).

``loss.csv`` columns: step, loss (mean over the logging interval), seconds, crops_per_s; a
resumed run may restart its clock (``seconds`` falls), which :func:`read_loss_csv` stitches.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np


def read_loss_csv(path: Path) -> list[dict]:
    """Rows of ``train-prior``'s loss.csv with a cumulative ``hours`` column (runs may be resumed)."""
    rows, offset, last = [], 0.0, 0.0
    with open(path) as f:
        for r in csv.DictReader(f):
            sec = float(r["seconds"])
            if sec < last:  # a resumed run restarts its clock
                offset += last
            last = sec
            rows.append({"step": int(r["step"]), "loss": float(r["loss"]), "hours": (offset + sec) / 3600,
                         "crops_per_s": float(r["crops_per_s"])})
    return rows


def render_loss_png(rows: list[dict], out: Path, title: str, window: int = 9) -> None:
    """Loss against step (log y), raw logs in grey and a running mean in blue, drawn with PIL."""
    from PIL import Image, ImageDraw, ImageFont

    W, H, L, R, T, B = 900, 420, 70, 20, 36, 50
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    steps = np.array([r["step"] for r in rows], float)
    loss = np.array([r["loss"] for r in rows], float)
    smooth = np.array([loss[max(0, i - window + 1) : i + 1].mean() for i in range(len(loss))])
    x0, x1 = 0.0, float(steps.max()) if len(steps) else 1.0
    lo, hi = math.log10(max(loss.min(), 1e-6)), math.log10(loss.max())
    lo, hi = math.floor(lo * 10) / 10, math.ceil(hi * 10) / 10
    if hi <= lo:
        hi = lo + 0.1

    def px(s: float, v: float) -> tuple[float, float]:
        return (L + (s - x0) / max(x1 - x0, 1) * (W - L - R), T + (hi - math.log10(v)) / (hi - lo) * (H - T - B))

    # grid and ticks
    for dec in range(math.floor(lo) - 1, math.ceil(hi) + 1):
        for m in (1, 2, 3, 5, 7):
            v = m * 10.0**dec
            if lo <= math.log10(v) <= hi:
                _, y = px(0, v)
                d.line([(L, y), (W - R, y)], fill=(225, 225, 225))
                d.text((8, y - 6), f"{v:g}", fill="black", font=font)
    nt = 6
    tick = 10 ** math.floor(math.log10(max(x1, 1) / nt))
    tick *= min((k for k in (1, 2, 5, 10) if x1 / (tick * k) <= nt), default=10)
    s = 0.0
    while s <= x1:
        x, _ = px(s, 10**hi)
        d.line([(x, T), (x, H - B)], fill=(225, 225, 225))
        d.text((x - 12, H - B + 6), f"{int(s)}", fill="black", font=font)
        s += tick
    d.rectangle([(L, T), (W - R, H - B)], outline="black")
    if len(rows) > 1:
        d.line([px(a, b) for a, b in zip(steps, loss)], fill=(170, 170, 170), width=1)
        d.line([px(a, b) for a, b in zip(steps, smooth)], fill=(30, 80, 200), width=2)
    d.text((L, 10), title, fill="black", font=font)
    d.text((W // 2 - 20, H - 22), "step", fill="black", font=font)
    d.text((W - R - 330, T + 6), f"grey: logged loss (mean of 50 steps); blue: mean of last {window} logs",
           fill=(30, 80, 200), font=font)
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out)

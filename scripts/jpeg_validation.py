"""JPEG restoration's feasibility measured on validation crops (never the held-out photos).

Four 256-px crops of scikit-image's motorcycle (left view: the embedded prior's validation photo), each
written as a real JPEG by Pillow at quality 10, 20 and 40 (4:2:0), read back as a measurement
(``nfc_dps.operators.jpeg.jpeg_measurement``: the stored integers recovered from the decoded pixels), and
restored by:

- ``decoded``: the JPEG as a viewer shows it;
- ``qcs_tv``: the classical deblocking (``nfc_dps.baselines.qcs_tv``: TV denoising alternated with the
  projection onto the quantisation cells);
- ``nfc`` and ``dpir``: ``nfc_dps.restore(operator=JpegOperator, y, sigma_y=q_min / sqrt(12))``, the
  default method and DPIR, each also followed by the projection onto the cells (``+proj``).

``--tune`` instead prints qcs_tv's PSNR over a grid of TV weights (per sigma_y) at every alternation,
the grid its constants were chosen on. Writes a CSV (one row per crop, quality and design) and prints
the means. Run with one torch thread where the cores are shared (``--threads``).

    python scripts/jpeg_validation.py --out docs/notes/jpeg_validation.csv
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from nfc_dps import restore
from nfc_dps.baselines import qcs_tv
from nfc_dps.baselines.linear import _tv_prox
from nfc_dps.io.jpeg import write_jpeg
from nfc_dps.metrics import psnr
from nfc_dps.operators.jpeg import jpeg_measurement
from nfc_dps.priors.training_data import load_skimage_image

CROPS = ((100, 100), (200, 400), (0, 300), (230, 30))
QUALITIES = (10, 20, 40)
SIZE = 256


def crops(count: int) -> list[tuple[str, np.ndarray]]:
    photo = load_skimage_image("motorcycle_left")
    return [(f"moto_r{r}c{c}", np.ascontiguousarray(photo[r:r + SIZE, c:c + SIZE])) for r, c in CROPS[:count]]


def measured(image: np.ndarray, quality: int, folder: Path):
    path = folder / f"q{quality}.jpg"
    write_jpeg(path, image, quality)
    return jpeg_measurement(path)


def score(image: torch.Tensor, truth: torch.Tensor) -> float:
    return round(float(psnr(image.float().clamp(0, 1), truth)), 3)


def tune(count: int, weights: list[float], iters: int) -> None:
    """qcs_tv's PSNR per TV weight (x sigma_y) and alternation, mean over crops and qualities."""
    table = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, image in crops(count):
            truth = torch.from_numpy(image).permute(2, 0, 1)[None]
            for quality in QUALITIES:
                m = measured(image, quality, Path(folder))
                op, k = m.operator, m.integers
                for c in weights:
                    x = op.project(op.A_pinv(m.y.double()), k)
                    for i in range(iters):
                        x = op.project(_tv_prox(x, c * m.sigma_y, 40), k)
                        table.setdefault((quality, c, i + 1), []).append(score(x, truth))
                print(name, quality, {c: table[(quality, c, iters)][-1] for c in weights}, flush=True)
    for quality in QUALITIES:
        for c in weights:
            curve = [np.mean(table[(quality, c, i + 1)]) for i in range(iters)]
            print(f"Q{quality} weight {c} x sigma: " + " ".join(f"{v:.2f}" for v in curve))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="the CSV to write")
    p.add_argument("--crops", type=int, default=4, help="how many of the four crops (default 4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--tune", action="store_true", help="print qcs_tv's grid instead")
    p.add_argument("--weights", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.tune:
        tune(args.crops, args.weights, args.iters)
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, image in crops(args.crops):
            truth = torch.from_numpy(image).permute(2, 0, 1)[None]
            for quality in QUALITIES:
                m = measured(image, quality, Path(folder))
                op, k = m.operator, m.integers

                def row(design: str, x: torch.Tensor, seconds: float) -> None:
                    rows.append({"crop": name, "quality": quality, "design": design, "psnr": score(x, truth),
                                 "seconds": round(seconds, 1)})
                    print(rows[-1], flush=True)

                row("decoded", m.decoded, 0.0)
                t0 = time.perf_counter()
                row("qcs_tv", qcs_tv(op, m.y), time.perf_counter() - t0)
                for method in ("nfc", "dpir"):
                    t0 = time.perf_counter()
                    out = restore(m.y, op, method=method, sigma_y=m.sigma_y, progress=False)
                    seconds = time.perf_counter() - t0
                    row(method, out.image, seconds)
                    row(f"{method}+proj", op.project(out.image.double(), k), seconds)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    designs = list(dict.fromkeys(r["design"] for r in rows))
    print("| design | " + " | ".join(f"Q{q}" for q in QUALITIES) + " |")
    for design in designs:
        cells = [np.mean([r["psnr"] for r in rows if r["design"] == design and r["quality"] == q]) for q in QUALITIES]
        print(f"| {design} | " + " | ".join(f"{v:.2f}" for v in cells) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Throughput of ``nfc-dps restore`` over a folder of small images at --batch-size 1 and 8.

Writes ``--count`` measurements (64 x 64 crops of the package photos, Gaussian deblurring with
the task's kernel, sigma_y 0.025) with ``nfc-dps simulate`` (25 x 25 kernels), then restores the folder with each
batch size into its own output folder (NFC's default preset, the embedded prior), times each
run end to end (model loading included, once per run) and checks that the images are the same
up to float rounding of batched layers. Prints a table, writes ``--out`` (JSON) and, with
matplotlib, ``--figure``.

    python scripts/restore_throughput.py --count 16 --threads 1 --out docs/bench/restore_throughput.json \\
        --figure docs/restore_throughput.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=16, help="images in the folder (default 16)")
    ap.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    ap.add_argument("--batch-sizes", default="1,8", help="comma list (default 1,8)")
    ap.add_argument("--task", default="deblur_gaussian")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="JSON file of the results")
    ap.add_argument("--figure", type=Path, default=None, help="PNG bar chart of images per second")
    args = ap.parse_args(argv)

    from nfc_dps.cli import main as cli
    from nfc_dps.io import read_image, write_image
    from nfc_dps.priors.training_data import HELDOUT_IMAGES, TRAIN_IMAGES, load_skimage_image

    work = Path(tempfile.mkdtemp(prefix="nfc_throughput_"))
    try:
        photos = [load_skimage_image(n) for n in (*HELDOUT_IMAGES, *TRAIN_IMAGES)]
        rng = np.random.default_rng(0)
        gt = work / "gt"
        gt.mkdir()
        for i in range(args.count):
            img = photos[i % len(photos)]
            t, l = (int(rng.integers(0, s - args.size + 1)) for s in img.shape[:2])
            write_image(gt / f"img{i:03d}.png", img[t:t + args.size, l:l + args.size])
        threads = ["--threads", str(args.threads)] if args.threads else []
        sim = work / "sim"
        # 25 x 25 kernels, circular: the local protocol's (the task's default std; the cost does not depend on it)
        params = ["--param", "kernel_size=25", "--param", "boundary=circular"] if args.task.startswith("deblur_") else []
        if cli(["simulate", "-i", str(gt), "-o", str(sim), "--task", args.task, *params, "--quiet"]) != 0:
            raise SystemExit("simulate failed")
        rows, outputs = [], {}
        for b in (int(v) for v in args.batch_sizes.split(",")):
            out = work / f"out_b{b}"
            t0 = time.perf_counter()
            rc = cli(["restore", "-i", str(sim), "-o", str(out), "--batch-size", str(b), "--device", args.device,
                      "--quiet", *threads])
            seconds = time.perf_counter() - t0
            if rc != 0:
                raise SystemExit(f"restore --batch-size {b} failed (exit {rc})")
            summary = json.loads((out / "summary.json").read_text())
            outputs[b] = {p.name: read_image(p)[0] for p in sorted(out.glob("img*.png"))}
            rows.append({"batch_size": b, "images": args.count, "seconds": round(seconds, 2),
                         "images_per_s": round(args.count / seconds, 3), "mean_psnr": summary["mean_psnr"]})
            print(f"--batch-size {b}: {args.count} images in {seconds:.1f} s = {args.count / seconds:.2f} images/s, "
                  f"mean PSNR {summary['mean_psnr']:.2f} dB", flush=True)
        first = next(iter(outputs.values()))
        for b, imgs in outputs.items():
            worst = max(float(np.abs(imgs[n] - first[n]).max()) for n in first)
            for r in rows:
                if r["batch_size"] == b:
                    r["max_abs_diff_vs_first"] = worst
        result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                  "task": args.task, "size": args.size, "device": args.device, "cpus": os.cpu_count(),
                  "threads": args.threads or "torch default", "rows": rows}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
        if args.figure:
            try:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
            except ImportError:
                print("matplotlib not installed: no figure (pip install 'nfc_dps[bench]')", file=sys.stderr)
                return 0
            fig, ax = plt.subplots(figsize=(4, 3))
            ax.bar([f"B = {r['batch_size']}" for r in rows], [r["images_per_s"] for r in rows], color="tab:blue")
            for i, r in enumerate(rows):
                ax.text(i, r["images_per_s"], f"{r['images_per_s']:.2f}", ha="center", va="bottom", fontsize=8)
            ax.set_ylabel("images / s")
            ax.set_title(f"restore, {args.count} images {args.size}², {args.device}, "
                         f"{args.threads or 'default'} thread(s)", fontsize=8)
            fig.tight_layout()
            args.figure.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.figure, dpi=110)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the measurements and outputs of the run


if __name__ == "__main__":
    sys.exit(main())

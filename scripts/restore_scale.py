#!/usr/bin/env python
"""Cost of one restoration at large sizes: seconds per NFE and peak memory (docs/scale.md).

Each (size, task) runs in a fresh child process, so its peak resident set size (CPU) or
allocator peak (CUDA) belongs to that restoration alone. A photo (scikit-image's astronaut,
resized) is measured at ``sigma_y`` 0.025 and restored with ``restore`` at NFC's default preset
cut to ``--levels`` levels (one network call each), the embedded prior; reported:

* ``s/NFE``: wall seconds of ``restore`` divided by its NFE (network calls plus the per-level
  data step; the first call includes nothing else: the model is loaded and warmed up first);
* ``forward s``: one bare prior call at that size (the part of s/NFE that is the network);
* ``peak MB``: peak RSS of the child (CPU; includes Python, torch and the model, ``base MB``
  is the RSS after loading the model) or the CUDA allocator peak.

    python scripts/restore_scale.py --sizes 512,1024,2048 --threads 2 --out docs/scale.json
    python scripts/restore_scale.py --sizes 512,1024,2048,4096 --device cuda --out runs/scale_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure_one(size: int, task: str, levels: int, device: str, threads: int) -> dict:
    """One restoration in this process (run by the child): timings and memory."""
    import numpy as np
    import torch
    from PIL import Image

    import nfc_dps
    from nfc_dps.bench.instruments import PeakMemory
    from nfc_dps.metrics import psnr as psnr_db
    from nfc_dps.operators import TASKS
    from nfc_dps.priors.training_data import load_skimage_image

    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    img = load_skimage_image("astronaut")
    img = np.asarray(Image.fromarray((img * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC), np.float32) / 255
    x = torch.from_numpy(img).permute(2, 0, 1)[None].to(dev)
    # the blur tasks circular, as docs/scale.md was measured
    params = {"boundary": "circular"} if "boundary" in TASKS[task].params else {}
    op = nfc_dps.build_operator(task, image_size=size, seed=0, **params).to(dev)
    y = op.measure(x, 0.025, torch.Generator(device=dev).manual_seed(0))
    prior = nfc_dps.load_prior(device=dev)
    rss = PeakMemory.resident_bytes()
    base_mb = rss / 2**20 if dev.type == "cpu" and rss is not None else None

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    with torch.no_grad():
        prior.denoise(torch.zeros(1, 3, 96, 96, device=dev), torch.full((1,), 0.5, device=dev))  # warm-up
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        prior.denoise(torch.zeros_like(x) * 2 - 1, torch.full((1,), 0.5, device=dev))
        sync()
        forward = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = nfc_dps.restore(y, op, prior=prior, sigma_y=0.025, num_levels=levels)
    sync()
    seconds = time.perf_counter() - t0
    psnr = float(psnr_db(res.image.clamp(0, 1), x))
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    return {"size": size, "task": task, "device": device, "threads": torch.get_num_threads(), "nfe": res.nfe,
            "seconds": round(seconds, 3), "s_per_nfe": round(seconds / res.nfe, 3), "forward_s": round(forward, 3),
            "peak_mb": round(peak), "base_mb": None if base_mb is None else round(base_mb), "psnr": round(psnr, 2),
            "megapixels": round(size * size / 1e6, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1024,2048", help="square image sides in pixels")
    ap.add_argument("--tasks", default="deblur_gaussian,sr_bicubic,inpaint_random", help="operator factory tasks")
    ap.add_argument("--levels", type=int, default=2, help="NFC levels (= NFE) per restoration (default 2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file of the rows")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        size, task = args.child.split(":")
        print(json.dumps(measure_one(int(size), task, args.levels, args.device, args.threads)))
        return 0
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for task in args.tasks.split(","):
            cmd = [sys.executable, __file__, "--child", f"{size}:{task}", "--levels", str(args.levels),
                   "--device", args.device, "--threads", str(args.threads)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{size} {task}: FAILED (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                rows.append({"size": size, "task": task, "device": args.device, "error": p.stderr.strip()[-300:]})
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{size}² {task}: {row['s_per_nfe']:.2f} s/NFE (forward {row['forward_s']:.2f} s), "
                  f"{row['nfe']} NFE, peak {row['peak_mb']} MB (after load {row['base_mb']} MB), "
                  f"PSNR {row['psnr']:.2f} dB", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                                        "machine": platform.processor() or platform.machine(),
                                        "cpus": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

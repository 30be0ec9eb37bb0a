#!/usr/bin/env python
"""Training throughput (crops/s) of the default prior's UNet: the earlier numpy crop loop vs device-side crops.

Both pipelines draw crops of the built-in set (photos at 3 scales + 25 % dead leaves, flips and
90-degree rotations) and take the same EDM training step (loss, backward, clipped Adam, EMA).

* ``numpy``: the per-sample loop of the earlier scripts/train_prior.py (kept here for the
  comparison): numpy RNG, one crop at a time, then a host-to-device copy;
* ``device``: :class:`nfc_dps.training.data.CropSampler`: one gather on the training device.

Reported: data-only crops/s (batches drawn, nothing trained) and training crops/s (data + step),
medians over timed steps after warm-up.

    python scripts/train_throughput.py --threads 1 --steps 8
    python scripts/train_throughput.py --threads 2 --steps 8 --precision bfloat16   # autocast on the CPU too
    python scripts/train_throughput.py --threads 2 --steps 8 --layout channels_last  # or --compile
    python scripts/train_throughput.py --device cuda --batch 256 --widths 64,128,256 --layers 2 --crop 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from nfc_dps.priors.archs import build_unet
from nfc_dps.priors.base import EDMDenoiser
from nfc_dps.priors.diffusers_prior import _UNetCall
from nfc_dps.priors.training_data import dead_leaves
from nfc_dps.training.data import BUILTIN_DEAD_LEAVES, DEFAULT_SCALES, CropSampler, DeadLeaves, load_builtin, multiscale


class NumpyCropSampler:
    """The earlier scripts/train_prior.py sampler: a Python loop over samples, numpy RNG."""

    def __init__(self, pool: list[np.ndarray], crop: int, rng: np.random.Generator, fraction: float = 0.25) -> None:
        self.pool, self.crop, self.rng, self.frac = pool, crop, rng, fraction
        w = np.array([im.shape[0] * im.shape[1] for im in pool], float)
        self.p = w / w.sum()
        self.leaves = [dead_leaves(256, rng) for _ in range(16)]

    def batch(self, n: int) -> torch.Tensor:
        c = self.crop
        out = np.empty((n, c, c, 3), np.float32)
        for i in range(n):
            im = self.leaves[self.rng.integers(16)] if self.rng.random() < self.frac else \
                self.pool[self.rng.choice(len(self.pool), p=self.p)]
            y, x = self.rng.integers(im.shape[0] - c + 1), self.rng.integers(im.shape[1] - c + 1)
            patch = np.rot90(im[y : y + c, x : x + c], self.rng.integers(4))
            out[i] = patch[:, ::-1] if self.rng.random() < 0.5 else patch
        return torch.from_numpy(out).permute(0, 3, 1, 2).mul(2).sub(1)


def median_rate(fn, batch: int, runs: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--crop", type=int, default=48)
    ap.add_argument("--widths", default="48,96,192")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="timed training steps per pipeline (after 2 warm-up steps)")
    ap.add_argument("--data-batches", type=int, default=40, help="timed data-only batches per pipeline")
    ap.add_argument("--precision", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="network compute precision (auto: bfloat16 autocast on CUDA, float32 else; as train-prior)")
    ap.add_argument("--layout", choices=("auto", "channels_last", "contiguous"), default="auto",
                    help="memory layout of the network (auto: channels_last on CUDA, contiguous else; as train-prior)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the network (the warm-up steps then include the compilation)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    precision = args.precision if args.precision != "auto" else ("bfloat16" if dev.type == "cuda" else "float32")
    channels_last = dev.type == "cuda" if args.layout == "auto" else args.layout == "channels_last"
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    data = load_builtin(3)
    pool = multiscale([im for _, im in data.train], DEFAULT_SCALES, args.crop)
    old = NumpyCropSampler(pool, args.crop, np.random.default_rng(0))
    new = CropSampler(pool, args.crop, dev, DeadLeaves(0, 3), BUILTIN_DEAD_LEAVES)
    new.sync_leaves(0)
    gen = torch.Generator(device=dev).manual_seed(0)
    torch.manual_seed(0)
    net = build_unet("unet", 3, tuple(int(w) for w in args.widths.split(",")), args.layers, args.crop).to(dev, memory_format=fmt)
    ema = build_unet("unet", 3, tuple(int(w) for w in args.widths.split(",")), args.layers, args.crop).to(dev, memory_format=fmt)
    opt = torch.optim.Adam(net.parameters(), lr=2e-4, fused=dev.type == "cuda")
    call = _UNetCall(net, precision, channels_last)
    den = EDMDenoiser(torch.compile(call) if args.compile else call)
    params, ema_params = list(net.parameters()), list(ema.parameters())

    def step(x0: torch.Tensor) -> None:
        x0 = x0.to(dev, non_blocking=True).contiguous(memory_format=fmt)
        sigma = (torch.randn(x0.shape[0], generator=gen, device=dev) * 1.2 - 1.2).exp()
        noisy = x0 + sigma.view(-1, 1, 1, 1) * torch.randn(x0.shape, generator=gen, device=dev)
        w = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
        loss = (w * (den.denoise(noisy, sigma) - x0).square().mean(dim=(1, 2, 3))).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1e-3)

    b = args.batch
    res = {
        "data_numpy": median_rate(lambda: old.batch(b).to(dev), b, args.data_batches, 2, sync),
        "data_device": median_rate(lambda: new.batch(b, gen), b, args.data_batches, 2, sync),
        "train_numpy": median_rate(lambda: step(old.batch(b)), b, args.steps, 2, sync),
        "train_device": median_rate(lambda: step(new.batch(b, gen)), b, args.steps, 2, sync),
    }
    info = {"device": str(dev), "threads": args.threads, "batch": b, "crop": args.crop, "widths": args.widths,
            "layers": args.layers, "parameters": sum(p.numel() for p in params), "precision": precision,
            "layout": "channels_last" if channels_last else "contiguous", "compiled": args.compile,
            "crops_per_s": {k: round(v, 1) for k, v in res.items()}}
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Train the embedded default prior: a small fully convolutional diffusers UNet2DModel, EDM-style.

Data ship inside packages (see nfc_dps/priors/training_data.py): scikit-image's bundled photos
(held-out evaluation images excluded) at several scales, plus procedural dead-leaves images.
Random crops of --crop pixels with flips and 90-degree rotations. Loss: EDM's preconditioned
denoising loss with log-normal sigma (P_mean, P_std) in [-1, 1] units.

Resumable: the state (model, EMA, optimiser, step, RNG) is saved to --workdir every
--save-every steps and on exit; rerunning the same command continues. --export writes the EMA
weights (fp16 safetensors) as a prior folder that nfc_dps loads.

    python scripts/train_prior.py --workdir runs/prior --hours 2 --export assets/default_prior

To continue the shipped prior on a fresh machine (the optimiser state is not shipped):

    python scripts/train_prior.py --workdir runs/prior2 --init-from assets/default_prior --hours 2 \
        --export runs/prior2/export --device cuda
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import time
from pathlib import Path

import numpy as np
import torch

from nfc_dps.priors.base import EDMDenoiser
from nfc_dps.priors.diffusers_prior import PRIOR_CONFIG_NAME, _UNetCall
from nfc_dps.priors.training_data import TRAIN_IMAGES, dead_leaves, load_skimage_image, training_power_law

UNET_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    block_out_channels=(48, 96, 192),
    down_block_types=("DownBlock2D",) * 3,
    up_block_types=("UpBlock2D",) * 3,
    layers_per_block=1,
    norm_num_groups=16,
)


def build_unet(crop: int):
    from diffusers import UNet2DModel

    return UNet2DModel(sample_size=crop, **UNET_CONFIG)


class CropSampler:
    """Random crops (B, 3, crop, crop) in [-1, 1] from a multi-scale photo pool and dead leaves."""

    def __init__(self, crop: int, rng: np.random.Generator, dead_leaves_fraction: float = 0.25) -> None:
        from skimage.transform import rescale

        self.crop, self.rng, self.dl_frac = crop, rng, dead_leaves_fraction
        self.pool = []
        for name in TRAIN_IMAGES:
            img = load_skimage_image(name)
            for scale in (1.0, 0.75, 0.5):
                im = img if scale == 1.0 else rescale(img, scale, channel_axis=2, anti_aliasing=True).astype(np.float32)
                if min(im.shape[:2]) >= crop:
                    self.pool.append(im)
        weights = np.array([im.shape[0] * im.shape[1] for im in self.pool], float)
        self.p = weights / weights.sum()
        self.leaves = [dead_leaves(256, rng) for _ in range(16)]

    def refresh_leaves(self) -> None:
        self.leaves[self.rng.integers(len(self.leaves))] = dead_leaves(256, self.rng)

    def batch(self, n: int) -> torch.Tensor:
        out = np.empty((n, self.crop, self.crop, 3), np.float32)
        c = self.crop
        for i in range(n):
            if self.rng.random() < self.dl_frac:
                im = self.leaves[self.rng.integers(len(self.leaves))]
            else:
                im = self.pool[self.rng.choice(len(self.pool), p=self.p)]
            y = self.rng.integers(im.shape[0] - c + 1)
            x = self.rng.integers(im.shape[1] - c + 1)
            patch = im[y : y + c, x : x + c]
            patch = np.rot90(patch, self.rng.integers(4))
            if self.rng.random() < 0.5:
                patch = patch[:, ::-1]
            out[i] = patch
        return torch.from_numpy(out).permute(0, 3, 1, 2).mul(2).sub(1)


def export(ema_unet, out_dir: Path, crop: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    half = build_unet(crop)
    half.load_state_dict(ema_unet.state_dict())
    half.half().save_pretrained(out_dir / "unet", safe_serialization=True)
    with open(out_dir / PRIOR_CONFIG_NAME, "w") as f:
        json.dump({"parameterization": "edm", "sigma_data": 0.5, "sigma_min": 0.002, "sigma_max": 80.0, "tile": crop,
                   "power_law": [round(v, 6) for v in training_power_law()]}, f, indent=2)


def _interrupt_on_sigterm(signum, frame) -> None:
    """A plain `kill` then runs the `finally: save()` below, so no training is lost."""
    raise KeyboardInterrupt("SIGTERM")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("runs/prior"))
    ap.add_argument("--crop", type=int, default=48)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--p-mean", type=float, default=-1.2)
    ap.add_argument("--p-std", type=float, default=1.2)
    ap.add_argument("--steps", type=int, default=10**9, help="stop at this total step count")
    ap.add_argument("--hours", type=float, default=1e9, help="stop after this much wall time in this run")
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--export", type=Path, default=None, help="write the EMA prior folder here at every save")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="warm start a NEW run (no state in --workdir) from an exported prior folder, "
                         "e.g. assets/default_prior: its weights seed both the model and the EMA")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    args.workdir.mkdir(parents=True, exist_ok=True)
    state_path = args.workdir / "state.pt"
    log_path = args.workdir / "loss.csv"
    device = torch.device(args.device)

    unet = build_unet(args.crop).to(device)
    ema = build_unet(args.crop).to(device).requires_grad_(False)
    ema.load_state_dict(unet.state_dict())
    opt = torch.optim.Adam(unet.parameters(), lr=args.lr)
    step, rng_state = 0, None
    if state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        unet.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        step, rng_state = st["step"], st["rng"]
        torch.set_rng_state(st["torch_rng"])
        print(f"resumed from {state_path} at step {step}")
    else:
        torch.manual_seed(args.seed)
        if args.init_from:
            from diffusers import UNet2DModel

            src = UNet2DModel.from_pretrained(args.init_from / "unet", torch_dtype=torch.float32)
            unet.load_state_dict(src.state_dict())
            ema.load_state_dict(src.state_dict())
            print(f"warm start from {args.init_from}")
    rng = np.random.default_rng(args.seed)
    if rng_state is not None:
        rng.bit_generator.state = rng_state
    data = CropSampler(args.crop, rng)
    denoiser = EDMDenoiser(_UNetCall(unet))

    def save() -> None:
        tmp = state_path.with_suffix(".tmp")
        torch.save({"model": unet.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
                    "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "args": vars(args)}, tmp)
        tmp.replace(state_path)
        if args.export:
            export(ema, args.export, args.crop)

    new_log = not log_path.exists()
    log = open(log_path, "a", newline="")
    writer = csv.writer(log)
    if new_log:
        writer.writerow(["step", "loss", "seconds", "crops_per_s"])
    t_start = time.time()
    t_last, running = t_start, []
    try:
        while step < args.steps and time.time() - t_start < args.hours * 3600:
            x0 = data.batch(args.batch).to(device)
            sigma = (torch.randn(args.batch, device=device) * args.p_std + args.p_mean).exp()
            noisy = x0 + sigma.view(-1, 1, 1, 1) * torch.randn_like(x0)
            weight = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
            err = (denoiser.denoise(noisy, sigma) - x0).square().mean(dim=(1, 2, 3))
            loss = (weight * err).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), unet.parameters()):
                    pe.lerp_(p, 1 - args.ema)
            step += 1
            running.append(loss.item())
            if step % 50 == 0:
                data.refresh_leaves()
                now = time.time()
                rate = 50 * args.batch / (now - t_last)
                writer.writerow([step, f"{np.mean(running):.5f}", f"{now - t_start:.1f}", f"{rate:.1f}"])
                log.flush()
                print(f"step {step} loss {np.mean(running):.4f} {rate:.1f} crops/s", flush=True)
                running, t_last = [], now
            if step % args.save_every == 0:
                save()
    finally:
        save()
        log.close()
        print(f"saved step {step} to {state_path}")


if __name__ == "__main__":
    main()

"""Export a trained network as a prior folder, and measure its held-out denoising PSNR.

The folder is the layout :func:`nfc_dps.load_prior` reads (see nfc_dps/priors/diffusers_prior.py):

    OUT/nfc_dps_prior.json   {"parameterization": "edm", "sigma_data": 0.5, "sigma_min": 0.002,
                              "sigma_max": 80.0, "tile": CROP (design "unet" only),
                              "power_law": [amplitude, alpha], "arch": "unet" | "unet-pixelnorm"}
    OUT/unet/config.json, OUT/unet/diffusion_pytorch_model.safetensors   (fp16 EMA weights)
    OUT/train_info.json      step, data, held-out PSNR, the training settings (not read by the loader)

Each file is replaced atomically (written in a temporary folder beside OUT, then ``os.replace``),
so a reader never sees a torn file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .. import io as nio
from ..priors.archs import ARCHS, DEFAULT_ARCH, size_independent, unet_config
from ..priors.base import Prior, reflect_pad
from ..priors.diffusers_prior import PRIOR_CONFIG_NAME, _find_unet_dir, _read_json
from ..priors.training_data import center_crop
from .data import TrainingError

EVAL_SIGMAS = (0.05, 0.1, 0.2)
INFO_NAME = "train_info.json"


def prior_json(arch: str, crop: int, power_law: tuple[float, float]) -> dict:
    """The ``nfc_dps_prior.json`` of a trained EDM network of design ``arch``."""
    cfg: dict = {"parameterization": "edm", "sigma_data": 0.5, "sigma_min": 0.002, "sigma_max": 80.0}
    if not size_independent(arch):
        cfg["tile"] = int(crop)  # GroupNorm/attention: apply in tiles of the training size
    cfg["power_law"] = [round(float(v), 6) for v in power_law]
    cfg["arch"] = arch
    return cfg


def export_prior(net: torch.nn.Module, out: str | Path, arch: str, crop: int, power_law: tuple[float, float],
                 info: dict | None = None) -> Path:
    """Write ``net`` (a UNet2DModel of design ``arch``, any device) as a prior folder ``out`` (fp16)."""
    from diffusers import UNet2DModel

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    half = UNet2DModel.from_config(net.config)
    half.load_state_dict({k: v.detach().float().cpu() for k, v in net.state_dict().items()})
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    try:
        half.half().save_pretrained(tmp / "unet", safe_serialization=True)
        nio.write_json(tmp / PRIOR_CONFIG_NAME, prior_json(arch, crop, power_law))
        if info is not None:
            nio.write_json(tmp / INFO_NAME, info)
        (out / "unet").mkdir(parents=True, exist_ok=True)
        # weights first: a folder whose json is older than its weights is still one design
        for f in sorted((tmp / "unet").iterdir(), key=lambda p: p.suffix != ".safetensors"):
            os.replace(f, out / "unet" / f.name)
        for f in sorted(tmp.iterdir()):
            if f.is_file():
                os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_holds(folder: str | Path, step: int, fingerprint: object, workdir: str) -> bool:
    """Whether the prior folder holds the weights of ``step`` of the work folder ``workdir`` (its
    train_info.json's step, config fingerprint and work folder)."""
    try:
        info = json.loads((Path(folder) / INFO_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(info, dict) and info.get("step") == step and info.get("config") == fingerprint
            and info.get("settings", {}).get("workdir") == workdir)


def evaluate_heldout(prior: Prior, images: Sequence[tuple[str, np.ndarray]], sigmas: Sequence[float] = EVAL_SIGMAS,
                     crop: int = 128, seed: int = 0) -> dict:
    """One-step denoising PSNR (dB) of ``prior`` on held-out (H, W, C) [0, 1] images.

    The protocol of ``nfc-dps prior-report`` (:mod:`nfc_dps.bench.prior_report`): centre ``crop`` crops, y = x + sigma n ([0, 1] units)
    with n from ``numpy.random.default_rng([seed, 0, image index, sigma index])``, the prior called
    at 2 sigma on 2y - 1 (reflect-padded to its size multiple), PSNR with data range 1 on the
    estimate clipped to [0, 1], averaged over images. Returns {"mean": {sigma: dB}, "per_image":
    {name: {sigma: dB}}, "crop": crop, "images": n}.
    """
    dev = next((p.device for p in prior.parameters()), torch.device("cpu"))
    m = prior.size_multiple
    per_image: dict = {}
    for ii, (name, img) in enumerate(images):
        x = center_crop(img, crop).astype(np.float32)
        per_image[name] = {}
        for si, s in enumerate(sigmas):
            n = np.random.default_rng([seed, 0, ii, si]).standard_normal(x.shape).astype(np.float32)
            y = torch.from_numpy(np.ascontiguousarray((x + s * n).transpose(2, 0, 1)))[None].to(dev) * 2 - 1
            h, w = y.shape[-2:]
            with torch.inference_mode():
                est = prior(reflect_pad(y, 0, (-h) % m, 0, (-w) % m), torch.full((1,), 2.0 * s, device=dev))
            est = ((est[0, :, :h, :w].float().cpu().permute(1, 2, 0).double().numpy() + 1) / 2).clip(0, 1)
            err = np.mean((est - x.astype(np.float64)) ** 2)
            per_image[name][s] = float(10 * np.log10(1.0 / max(err, 1e-20)))
    mean = {s: float(np.mean([per_image[n][s] for n in per_image])) for s in sigmas} if per_image else {}
    return {"mean": mean, "per_image": per_image, "crop": crop, "images": len(per_image)}


def init_network_keys(folder: str | Path) -> dict:
    """arch, widths, layers, channels and crop of a prior folder to warm-start from (``--init-from``).

    A TrainingError naming the file when it is not an EDM prior of a design train-prior builds.
    """
    folder = Path(folder)
    try:
        unet_dir = _find_unet_dir(folder)
        ucfg = _read_json(unet_dir / "config.json")
        pcfg = _read_json(folder / PRIOR_CONFIG_NAME) if (folder / PRIOR_CONFIG_NAME).is_file() else {}
    except (OSError, ValueError) as e:
        raise TrainingError(f"--init-from {folder}: {e}") from e
    if pcfg.get("parameterization") != "edm":
        raise TrainingError(f"--init-from {folder}: {folder / PRIOR_CONFIG_NAME} must say parameterization 'edm' "
                            f"(train-prior trains EDM priors), got {pcfg.get('parameterization')!r}")
    arch = pcfg.get("arch", DEFAULT_ARCH)
    if arch not in ARCHS:
        raise TrainingError(f"--init-from {folder}: arch {arch!r} is not one of {', '.join(ARCHS)}")
    keys = {"arch": arch, "widths": tuple(ucfg.get("block_out_channels", ())), "layers": ucfg.get("layers_per_block"),
            "channels": ucfg.get("in_channels"), "crop": int(pcfg.get("tile") or ucfg.get("sample_size") or 48)}
    try:
        want = unet_config(arch, keys["channels"], keys["widths"], keys["layers"], keys["crop"])
    except (TypeError, ValueError) as e:
        raise TrainingError(f"--init-from {folder}: {unet_dir / 'config.json'}: {e}") from e
    differ = [k for k, v in want.items() if k != "sample_size" and _as_list(ucfg.get(k, v)) != _as_list(v)]
    if differ:
        raise TrainingError(f"--init-from {folder}: {unet_dir / 'config.json'} is not a network train-prior builds "
                            f"(differs in {', '.join(differ)})")
    return keys


def _as_list(v: object) -> object:
    return list(v) if isinstance(v, (list, tuple)) else v


def load_init_weights(net: torch.nn.Module, folder: str | Path, arch: str) -> None:
    """Copy the weights of prior folder ``folder`` into ``net`` (same design; checked by name and shape)."""
    from diffusers import UNet2DModel

    unet_dir = _find_unet_dir(Path(folder))
    try:
        src = UNet2DModel.from_pretrained(unet_dir, torch_dtype=torch.float32, low_cpu_mem_usage=False,
                                          local_files_only=True)
        net.load_state_dict(src.state_dict())
    except (OSError, ValueError, RuntimeError) as e:
        raise TrainingError(f"--init-from {folder}: cannot load its weights into a {arch} network: {e}") from e

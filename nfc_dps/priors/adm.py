"""The OpenAI guided-diffusion (ADM) UNet in diffusers' terms: the public checkpoints' presets
(:data:`ADM_PRESETS`), their hyper-parameters resolved (:func:`resolve_adm_preset`) and the
diffusers ``UNet2DModel`` config that reproduces the network (:func:`adm_unet_config`); the
weights are converted by :mod:`nfc_dps.priors.adm_convert`.

Architecture mapping (ADM ``unet.py`` -> diffusers), for ``resblock_updown=True`` and
``use_scale_shift_norm=True`` models such as the FFHQ ``ffhq_10m.pt`` (DPS/DAPS/DiffPIR) and
OpenAI's ``256x256_diffusion_uncond.pt``:

* level ``L`` of the encoder (``num_res_blocks`` ResBlocks [+ AttentionBlock] and a down-ResBlock)
  -> ``down_blocks[L]``: ``ResnetDownsampleBlock2D`` or, where ADM has attention,
  ``AttnDownBlock2D`` with ``downsample_type="resnet"``;
* ``middle_block`` (ResBlock, AttentionBlock, ResBlock) -> ``mid_block`` (``UNetMidBlock2D`` with
  ``attn_norm_num_groups=32``: with scale-shift resnets diffusers otherwise drops the attention's
  GroupNorm);
* decoder level ``L`` (``num_res_blocks + 1`` ResBlocks on concatenated skips [+ attention],
  up-ResBlock last) -> ``up_blocks[n-1-L]``: ``ResnetUpsampleBlock2D`` / ``AttnUpBlock2D`` with
  ``upsample_type="resnet"``;
* timestep embedding cat[cos, sin] -> ``flip_sin_to_cos=True, freq_shift=0``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .archs import unet2d_model_class

# Hyper-parameters of the public ADM checkpoints (Dhariwal & Nichol 2021, guided-diffusion model cards). attention_resolutions are
# feature-map resolutions (ADM's "16" = attention where the map is 16x16); the middle block always
# has attention.
#: what the public ADM checkpoints share
_ADM_COMMON: dict[str, Any] = {
    "image_size": 256,
    "in_channels": 3,
    "channel_mult": (1, 1, 2, 2, 4, 4),
    "num_head_channels": 64,
    "learn_sigma": True,
    "use_scale_shift_norm": True,
    "resblock_updown": True,
    "use_new_attention_order": False,
    "class_cond": False,
}
ADM_PRESETS: dict[str, dict[str, Any]] = {
    # DPS/DAPS ffhq_10m.pt
    "ffhq256": {**_ADM_COMMON, "num_channels": 128, "num_res_blocks": 1, "attention_resolutions": (16,)},
    # OpenAI 256x256_diffusion_uncond.pt (DPS/DAPS "imagenet256.pt")
    "imagenet256": {**_ADM_COMMON, "num_channels": 256, "num_res_blocks": 2, "attention_resolutions": (32, 16, 8)},
}

# ADM's channel_mult="" default per image size (guided-diffusion create_model).
_DEFAULT_CHANNEL_MULT = {256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}

_REQUIRED = ("image_size", "num_channels", "num_res_blocks", "attention_resolutions", "learn_sigma")
_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "channel_mult": "",
    "num_head_channels": 64,
    "num_heads": -1,
    "use_scale_shift_norm": True,
    "resblock_updown": True,
    "use_new_attention_order": False,
    "class_cond": False,
}

# Schedule of every public ADM checkpoint (guided-diffusion "linear", 1000 steps, epsilon).
ADM_SCHEDULER_CONFIG = {
    "_class_name": "DDPMScheduler",
    "num_train_timesteps": 1000,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "prediction_type": "epsilon",
    "clip_sample": False,
}


def _int_tuple(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"ADM preset: {name} must be a sequence of integers or a comma string, got {value!r}") from e
    return out


def resolve_adm_preset(preset: str | Mapping[str, Any]) -> dict[str, Any]:
    """Name (``ADM_PRESETS`` key) or dict -> a complete, validated hyper-parameter dict.

    A custom dict needs ``image_size, num_channels, num_res_blocks, attention_resolutions,
    learn_sigma`` and either ``num_head_channels`` or ``num_heads``; ``channel_mult`` defaults to
    ADM's per-size default. Only what the converter supports is accepted: unconditional,
    ``use_scale_shift_norm=True``, ``resblock_updown=True``, ``channel_mult[0] == 1``.
    """
    if isinstance(preset, str):
        if preset not in ADM_PRESETS:
            raise ValueError(f"unknown ADM preset {preset!r}; known: {sorted(ADM_PRESETS)} (or pass a dict)")
        preset = ADM_PRESETS[preset]
    if not isinstance(preset, Mapping):
        raise TypeError(f"ADM preset must be a name or a dict, got {type(preset).__name__}")
    allowed = set(_REQUIRED) | set(_DEFAULTS) | {"dropout"}
    unknown = set(preset) - allowed
    if unknown:
        raise ValueError(f"ADM preset: unknown keys {sorted(unknown)}; allowed {sorted(allowed)}")
    missing = [k for k in _REQUIRED if k not in preset]
    if missing:
        raise ValueError(f"ADM preset: missing keys {missing}")
    p = {**_DEFAULTS, **dict(preset)}
    p["image_size"] = int(p["image_size"])
    if p["channel_mult"] in ("", None):
        if p["image_size"] not in _DEFAULT_CHANNEL_MULT:
            raise ValueError(f"ADM preset: no default channel_mult for image_size {p['image_size']}; give one")
        p["channel_mult"] = _DEFAULT_CHANNEL_MULT[p["image_size"]]
    p["channel_mult"] = _int_tuple(p["channel_mult"], "channel_mult")
    p["attention_resolutions"] = _int_tuple(p["attention_resolutions"], "attention_resolutions")
    for k in ("num_channels", "num_res_blocks", "in_channels", "num_head_channels", "num_heads"):
        p[k] = int(p[k])
    for k in ("learn_sigma", "use_scale_shift_norm", "resblock_updown", "use_new_attention_order", "class_cond"):
        p[k] = bool(p[k])
    if p["class_cond"]:
        raise ValueError("class-conditional ADM checkpoints (class_cond=True, label_emb.*) are not supported")
    if not p["use_scale_shift_norm"] or not p["resblock_updown"]:
        raise ValueError(
            "only ADM models with use_scale_shift_norm=True and resblock_updown=True are supported "
            "(all public 256x256 checkpoints); got "
            f"use_scale_shift_norm={p['use_scale_shift_norm']}, resblock_updown={p['resblock_updown']}"
        )
    if p["channel_mult"][0] != 1:
        raise ValueError(
            f"channel_mult[0] must be 1 (diffusers sizes the timestep embedding by the first block's channels), got {p['channel_mult']}"
        )
    if p["num_res_blocks"] < 1 or p["num_channels"] < 1 or not p["channel_mult"]:
        raise ValueError("ADM preset: num_res_blocks, num_channels and channel_mult must be positive / non-empty")
    for r in p["attention_resolutions"]:
        if r <= 0 or p["image_size"] % r:
            raise ValueError(f"ADM preset: attention resolution {r} does not divide image_size {p['image_size']}")
    head_dim = attention_head_dim(p)
    for level in attention_levels(p) | {len(p["channel_mult"]) - 1}:
        ch = p["channel_mult"][level] * p["num_channels"]
        if ch % head_dim:
            raise ValueError(f"ADM preset: {ch} channels at level {level} are not a multiple of the head size {head_dim}")
    for ch in {m * p["num_channels"] for m in p["channel_mult"]}:
        if ch % 32:
            raise ValueError(f"ADM preset: GroupNorm(32) needs channel counts divisible by 32, got {ch}")
    return p


def attention_levels(p: Mapping[str, Any]) -> set[int]:
    """Encoder/decoder levels (0 = full resolution) that carry attention."""
    rates = {p["image_size"] // r for r in p["attention_resolutions"]}
    return {level for level in range(len(p["channel_mult"])) if 2**level in rates}


def attention_head_dim(p: Mapping[str, Any]) -> int:
    """diffusers' single ``attention_head_dim``; ADM's ``num_heads`` mode must imply one head size."""
    if p["num_head_channels"] > 0:
        return p["num_head_channels"]
    if p["num_heads"] <= 0:
        raise ValueError("ADM preset: give num_head_channels (> 0) or num_heads (> 0)")
    levels = attention_levels(p) | {len(p["channel_mult"]) - 1}
    dims = {p["channel_mult"][lv] * p["num_channels"] // p["num_heads"] for lv in levels}
    if len(dims) != 1:
        raise ValueError(
            f"ADM preset: num_heads={p['num_heads']} gives head sizes {sorted(dims)} at different levels; "
            "diffusers' UNet2DModel needs one attention_head_dim"
        )
    return dims.pop()


def adm_unet_config(preset: str | Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of a diffusers ``UNet2DModel`` with the ADM architecture of ``preset``."""
    p = resolve_adm_preset(preset)
    n = len(p["channel_mult"])
    attn = attention_levels(p)
    down = tuple("AttnDownBlock2D" if lv in attn else "ResnetDownsampleBlock2D" for lv in range(n))
    up = tuple("AttnUpBlock2D" if lv in attn else "ResnetUpsampleBlock2D" for lv in reversed(range(n)))
    mc = p["num_channels"]
    return {
        "sample_size": p["image_size"],
        "in_channels": p["in_channels"],
        "out_channels": 2 * p["in_channels"] if p["learn_sigma"] else p["in_channels"],
        "center_input_sample": False,
        "time_embedding_type": "positional",
        "time_embedding_dim": 4 * mc,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "down_block_types": down,
        "up_block_types": up,
        "mid_block_type": "UNetMidBlock2D",
        "block_out_channels": tuple(m * mc for m in p["channel_mult"]),
        "layers_per_block": p["num_res_blocks"],
        "mid_block_scale_factor": 1,
        "downsample_type": "resnet",
        "upsample_type": "resnet",
        "dropout": float(p.get("dropout", 0.0)),
        "act_fn": "silu",
        "attention_head_dim": attention_head_dim(p),
        "norm_num_groups": 32,
        "attn_norm_num_groups": 32,
        "norm_eps": 1e-5,
        "resnet_time_scale_shift": "scale_shift",
        "add_attention": True,
    }


def build_adm_unet(config: Mapping[str, Any], device: str | torch.device = "meta") -> torch.nn.Module:
    with torch.device(device):
        return unet2d_model_class()(**config)

"""Convert an OpenAI guided-diffusion (ADM) UNet checkpoint into a diffusers ``UNet2DModel`` folder.

The folder written by :func:`convert_adm_checkpoint` is what :func:`~nfc_dps.priors.load_diffusers_prior`
loads: ``OUT/unet/{config.json, diffusion_pytorch_model.safetensors}`` and
``OUT/scheduler/scheduler_config.json`` (DDPM linear betas 1e-4 -> 0.02, 1000 steps, epsilon
prediction). The learned-variance output channels (``learn_sigma``) are kept in the network;
``EpsilonDenoiser`` uses only the first ``in_channels`` outputs (epsilon). The network itself is
:mod:`nfc_dps.priors.adm`'s.

Weights: ResBlock ``in_layers.{0,2}`` -> ``norm1``/``conv1``, ``emb_layers.1`` -> ``time_emb_proj``,
``out_layers.{0,3}`` -> ``norm2``/``conv2``, ``skip_connection`` -> ``conv_shortcut``;
AttentionBlock ``norm`` -> ``group_norm``, ``qkv`` (conv1d, 3C x C x 1) -> ``to_q``/``to_k``/``to_v``,
``proj_out`` -> ``to_out.0``. ADM's default ``QKVAttentionLegacy`` lays the 3C qkv channels out
head-first, (heads, [q|k|v], head_channels): a plain ``chunk(3)`` would be wrong; with
``use_new_attention_order=True`` the layout is ([q|k|v], heads, head_channels).

Nothing is downloaded. Verified numerically against an independent ADM forward pass in
``tests/test_adm_convert.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from ..io.files import weights_only_refusal
from .adm import ADM_SCHEDULER_CONFIG, adm_unet_config, attention_head_dim, attention_levels, build_adm_unet, resolve_adm_preset

# (ADM sub-key, diffusers sub-key) of the plain (no reshaping) module parts.
_RES_PARTS = (
    ("in_layers.0", "norm1"),
    ("in_layers.2", "conv1"),
    ("emb_layers.1", "time_emb_proj"),
    ("out_layers.0", "norm2"),
    ("out_layers.3", "conv2"),
    ("skip_connection", "conv_shortcut"),
)


def _module_map(p: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(ADM module prefix, diffusers module prefix, kind) for every module, kind in res/attn/plain."""
    n, nrb = len(p["channel_mult"]), p["num_res_blocks"]
    attn = attention_levels(p)
    m: list[tuple[str, str, str]] = [
        ("time_embed.0", "time_embedding.linear_1", "plain"),
        ("time_embed.2", "time_embedding.linear_2", "plain"),
        ("input_blocks.0.0", "conv_in", "plain"),
    ]
    k = 1
    for lv in range(n):
        for j in range(nrb):
            m.append((f"input_blocks.{k}.0", f"down_blocks.{lv}.resnets.{j}", "res"))
            if lv in attn:
                m.append((f"input_blocks.{k}.1", f"down_blocks.{lv}.attentions.{j}", "attn"))
            k += 1
        if lv != n - 1:
            m.append((f"input_blocks.{k}.0", f"down_blocks.{lv}.downsamplers.0", "res"))
            k += 1
    m += [
        ("middle_block.0", "mid_block.resnets.0", "res"),
        ("middle_block.1", "mid_block.attentions.0", "attn"),
        ("middle_block.2", "mid_block.resnets.1", "res"),
    ]
    k = 0
    for u, lv in enumerate(reversed(range(n))):
        for i in range(nrb + 1):
            m.append((f"output_blocks.{k}.0", f"up_blocks.{u}.resnets.{i}", "res"))
            idx = 1
            if lv in attn:
                m.append((f"output_blocks.{k}.1", f"up_blocks.{u}.attentions.{i}", "attn"))
                idx = 2
            if lv and i == nrb:
                m.append((f"output_blocks.{k}.{idx}", f"up_blocks.{u}.upsamplers.0", "res"))
            k += 1
    m += [("out.0", "conv_norm_out", "plain"), ("out.2", "conv_out", "plain")]
    return m


def _key_plan(p: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]]) -> list[tuple[str, str, str]]:
    """(ADM key, diffusers key(s) joined by '|', conversion) for every expected diffusers parameter.

    Conversions: "copy", "qkv" (split into to_q|to_k|to_v), "squeeze" (conv1d 1x1 -> linear).
    Optional parts (conv_shortcut) are included only where the diffusers model has them.
    """
    plan: list[tuple[str, str, str]] = []
    for adm, dif, kind in _module_map(p):
        for suffix in ("weight", "bias"):
            if kind == "plain":
                plan.append((f"{adm}.{suffix}", f"{dif}.{suffix}", "copy"))
            elif kind == "res":
                for a, d in _RES_PARTS:
                    if f"{dif}.{d}.{suffix}" in expected:
                        plan.append((f"{adm}.{a}.{suffix}", f"{dif}.{d}.{suffix}", "copy"))
            else:
                plan.append((f"{adm}.norm.{suffix}", f"{dif}.group_norm.{suffix}", "copy"))
                qkv = "|".join(f"{dif}.to_{c}.{suffix}" for c in "qkv")
                plan.append((f"{adm}.qkv.{suffix}", qkv, "qkv"))
                plan.append((f"{adm}.proj_out.{suffix}", f"{dif}.to_out.0.{suffix}", "squeeze"))
    return plan


def _split_qkv(w: Tensor, head_dim: int, legacy: bool, key: str) -> tuple[Tensor, Tensor, Tensor]:
    """ADM qkv weight (3C, C[, 1]) or bias (3C,) -> q, k, v ((C, C) or (C,))."""
    if w.ndim == 3:
        if w.shape[-1] != 1:
            raise ValueError(f"ADM key {key}: expected a 1x1 conv1d weight (3C, C, 1), got shape {tuple(w.shape)}")
        w = w[..., 0]
    if w.shape[0] % 3 or (w.ndim == 2 and w.shape[0] != 3 * w.shape[1]) or w.ndim not in (1, 2):
        raise ValueError(f"ADM key {key}: expected qkv of shape (3C, C, 1) or (3C,), got {tuple(w.shape)}")
    c = w.shape[0] // 3
    if c % head_dim:
        raise ValueError(f"ADM key {key}: {c} channels are not a multiple of the head size {head_dim}")
    heads = c // head_dim
    rest = tuple(w.shape[1:])
    if legacy:  # head-first: (heads, [q|k|v], head_dim, ...)
        w = w.reshape(heads, 3, head_dim, *rest)
        q, k, v = (w[:, j].reshape(c, *rest) for j in range(3))
    else:  # [q|k|v]-first
        q, k, v = (z.reshape(c, *rest) for z in w.reshape(3, c, *rest).unbind(0))
    return q.contiguous(), k.contiguous(), v.contiguous()


def _few(keys: list[str] | set[str], n: int = 8) -> str:
    keys = sorted(keys)
    more = f" ... ({len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def convert_adm_state_dict(sd: Mapping[str, Tensor], preset: str | Mapping[str, Any]) -> dict[str, Tensor]:
    """ADM state dict -> diffusers ``UNet2DModel`` state dict for ``adm_unet_config(preset)``.

    Checks that the key sets match exactly (lists a few missing/unexpected ADM keys otherwise) and
    that every converted tensor has the diffusers shape (naming the ADM and diffusers keys). Works
    on tensors of any device, including "meta" (no memory). Dtypes are kept.
    """
    p = resolve_adm_preset(preset)
    config = adm_unet_config(p)
    expected = {k: tuple(v.shape) for k, v in build_adm_unet(config, "meta").state_dict().items()}
    sd = _strip_prefix(dict(sd))
    plan = _key_plan(p, expected)
    adm_keys = {a for a, _, _ in plan}
    missing = adm_keys - set(sd)
    unexpected = set(sd) - adm_keys
    if missing or unexpected:
        hint = ""
        if any(k.startswith("label_emb") for k in unexpected):
            hint = " (label_emb.*: a class-conditional checkpoint, not supported)"
        elif missing or unexpected:
            hint = (f" (is the preset right? image_size={p['image_size']}, num_channels={p['num_channels']}, "
                    f"num_res_blocks={p['num_res_blocks']}, channel_mult={p['channel_mult']}, "
                    f"attention_resolutions={p['attention_resolutions']})")
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys: {_few(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {_few(unexpected)}")
        raise ValueError("ADM state dict does not match the preset: " + "; ".join(parts) + hint)

    head_dim = attention_head_dim(p)
    legacy = not p["use_new_attention_order"]
    out: dict[str, Tensor] = {}
    for adm, dif, how in plan:
        w = sd[adm]
        if not isinstance(w, Tensor):
            raise ValueError(f"ADM key {adm}: expected a tensor, got {type(w).__name__}")
        if how == "qkv":
            tensors = dict(zip(dif.split("|"), _split_qkv(w, head_dim, legacy, adm)))
        elif how == "squeeze":
            if w.ndim == 3 and w.shape[-1] == 1:
                w = w[..., 0]
            tensors = {dif: w}
        else:
            tensors = {dif: w}
        for dk, t in tensors.items():
            if tuple(t.shape) != expected[dk]:
                raise ValueError(
                    f"shape mismatch: ADM key {adm} {tuple(sd[adm].shape)} -> diffusers key {dk} "
                    f"{tuple(t.shape)}, expected {expected[dk]} (wrong preset?)"
                )
            out[dk] = t
    missing_dif = set(expected) - set(out)
    if missing_dif:  # an internal inconsistency between the layout and diffusers, never user error
        raise RuntimeError(f"converter left diffusers keys unset: {_few(missing_dif)}")
    return out


def _strip_prefix(sd: dict[str, Any]) -> dict[str, Any]:
    """Drop a DataParallel/DDP 'module.' prefix present on every key."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def load_adm_state_dict(ckpt_path: str | Path, trust_pickle: bool = False) -> dict[str, Tensor]:
    """Read an ADM checkpoint (.pt/.pth state dict, or .safetensors) on the CPU.

    ``torch.load(weights_only=True)`` is used, so a plain state dict of tensors loads safely. A
    ``{"state_dict": ...}``, ``{"model": ...}`` or ``{"ema": ...}`` wrapper is unwrapped. A file
    that pickles other objects is refused unless ``trust_pickle=True`` (only for files you trust:
    unpickling can run arbitrary code).
    """
    path = Path(ckpt_path)
    if not path.exists():
        raise FileNotFoundError(f"ADM checkpoint {path} does not exist")
    if not path.is_file():
        raise IsADirectoryError(f"ADM checkpoint {path} is not a file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(str(path), device="cpu")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
            raise ValueError(f"{path}: not a readable safetensors file: {e}") from e
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
        except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError...
            if trust_pickle:
                raise ValueError(f"{path}: could not read the checkpoint: {e}") from e
            raise ValueError(
                f"{path}: refused: a weights-only load of it failed ({weights_only_refusal(e)}). "
                "The file is corrupt or pickles objects besides tensors. If you trust it, pass "
                "trust_pickle=True (nfc-dps convert-adm --trust-pickle), or re-save it elsewhere as a plain state dict: "
                "torch.save(model.state_dict(), 'adm.pt')"
            ) from e
    for wrapper in ("state_dict", "model", "ema"):
        if isinstance(obj, Mapping) and wrapper in obj and isinstance(obj[wrapper], Mapping):
            obj = obj[wrapper]
            break
    if not isinstance(obj, Mapping) or not obj:
        raise ValueError(f"{path}: not a state dict (got {type(obj).__name__}); expected a mapping of parameter names to tensors")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ValueError(f"{path}: not a state dict of tensors; offending entries: {_few([str(b) for b in bad], 5)}")
    return dict(obj)


def convert_adm_checkpoint(
    ckpt_path: str | Path,
    out_dir: str | Path,
    preset: str | Mapping[str, Any] = "ffhq256",
    dtype: torch.dtype = torch.float32,
    overwrite: bool = False,
    trust_pickle: bool = False,
) -> Path:
    """Convert an ADM (guided-diffusion) UNet checkpoint to a folder ``load_diffusers_prior`` loads.

    Args:
        ckpt_path: the ADM ``.pt`` state dict (e.g. ``ffhq_10m.pt``, ``256x256_diffusion_uncond.pt``)
            or a ``.safetensors`` file with the same keys.
        out_dir: output folder (created).
        preset: ``"ffhq256"``, ``"imagenet256"`` (see ``ADM_PRESETS``) or a hyper-parameter dict.
        dtype: dtype of the saved weights (float32 by default).
        overwrite: replace an existing conversion in ``out_dir``.
        trust_pickle: allow a checkpoint that is not a plain tensor state dict (unsafe unpickling).

    Writes:
        ``out_dir/unet/config.json`` and ``out_dir/unet/diffusion_pytorch_model.safetensors``: a
        diffusers ``UNet2DModel`` (``adm_unet_config(preset)``) with the converted weights; it
        outputs 2*C channels when ``learn_sigma`` (epsilon first; the sampler drops the rest);
        ``out_dir/scheduler/scheduler_config.json``: DDPMScheduler, linear betas 1e-4 -> 0.02,
        1000 steps, epsilon prediction (the ADM training schedule);
        ``out_dir/adm_conversion.json``: provenance (source file name, resolved preset).
        The prior then is ``load_diffusers_prior(out_dir)`` (an ``EpsilonDenoiser``; inputs must be
        multiples of 2^(levels-1) pixels, and the network was trained at ``image_size``).

    Returns:
        ``Path(out_dir)``.
    """
    p = resolve_adm_preset(preset)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {out} exists and is not a folder")
    if (out / "unet" / "config.json").exists() and not overwrite:
        raise FileExistsError(f"{out / 'unet'} already holds a model; pass overwrite=True "
                              f"(nfc-dps convert-adm --overwrite) to replace it")
    sd = load_adm_state_dict(ckpt_path, trust_pickle=trust_pickle)
    converted = convert_adm_state_dict(sd, p)
    del sd
    config = adm_unet_config(p)
    unet = build_adm_unet(config, "meta")
    converted = {k: v.to(dtype) for k, v in converted.items()}
    unet.load_state_dict(converted, strict=True, assign=True)
    (out / "unet").mkdir(parents=True, exist_ok=True)
    unet.save_pretrained(out / "unet", safe_serialization=True)
    (out / "scheduler").mkdir(parents=True, exist_ok=True)
    sched = dict(ADM_SCHEDULER_CONFIG, variance_type="learned_range" if p["learn_sigma"] else "fixed_small")
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched, indent=2) + "\n")
    meta = {"source": Path(ckpt_path).name, "preset": {k: list(v) if isinstance(v, tuple) else v for k, v in p.items()}}
    (out / "adm_conversion.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out

"""ADM (guided-diffusion) -> diffusers conversion, checked against an independent ADM forward pass."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from adm_reference import ADMUNet, randomize_  # noqa: E402

from nfc_dps.priors import EpsilonDenoiser, load_diffusers_prior  # noqa: E402
from nfc_dps.priors.adm import ADM_PRESETS, adm_unet_config, resolve_adm_preset  # noqa: E402
from nfc_dps.priors.adm_convert import convert_adm_checkpoint, convert_adm_state_dict  # noqa: E402

# Tiny ADMs: every block kind (attention at level 0 / inner levels / none, 1 and 2 res blocks,
# legacy and new qkv order, with and without learned sigma) at 32x32.
TINY = {
    "nrb1_attn16_8": dict(image_size=32, num_channels=32, num_res_blocks=1, channel_mult=(1, 2, 2),
                          attention_resolutions=(16, 8), num_head_channels=16, learn_sigma=True),
    "nrb2_attn32_8": dict(image_size=32, num_channels=32, num_res_blocks=2, channel_mult=(1, 2, 2),
                          attention_resolutions=(32, 8), num_head_channels=8, learn_sigma=True),
    "neworder_nosigma": dict(image_size=32, num_channels=32, num_res_blocks=1, channel_mult=(1, 2),
                             attention_resolutions=(16,), num_head_channels=16, learn_sigma=False,
                             use_new_attention_order=True),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def make_reference(preset: dict, seed: int = 0) -> ADMUNet:
    ref = ADMUNet(**preset).double()
    return randomize_(ref, torch.Generator().manual_seed(seed)).eval()


@pytest.fixture(scope="module", params=sorted(TINY))
def converted(request, tmp_path_factory):
    """(preset, float64 reference, float64 prior loaded from the converted folder, ckpt path)."""
    preset = TINY[request.param]
    ref = make_reference(preset, seed=len(request.param))
    d = tmp_path_factory.mktemp(request.param)
    ckpt = d / "adm.pt"
    torch.save(ref.state_dict(), ckpt)
    convert_adm_checkpoint(ckpt, d / "diffusers", preset, dtype=torch.float64)
    prior = load_diffusers_prior(d / "diffusers", dtype=torch.float64)
    return preset, ref, prior, ckpt


def test_network_matches_reference_float64(converted):
    preset, ref, prior, _ = converted
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 32, 32, generator=g, dtype=torch.float64)
    t = torch.tensor([0.0, 417.0, 998.37])
    with torch.no_grad():
        out, want = prior.network(x, t), ref(x, t)
    assert out.shape == want.shape == (3, 6 if preset["learn_sigma"] else 3, 32, 32)
    assert want.std() > 0.1  # random weights give a non-trivial output
    assert rel_err(out, want) <= 1e-9


def test_network_matches_reference_float32(converted, tmp_path):
    preset, ref, _, ckpt = converted
    convert_adm_checkpoint(ckpt, tmp_path / "f32", preset)  # default float32 weights
    prior = load_diffusers_prior(tmp_path / "f32", precision="float32")
    assert next(prior.network.parameters()).dtype == torch.float32
    ref32 = ADMUNet(**preset).float()
    ref32.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 32, 32, generator=g)
    t = torch.tensor([12.0, 640.5])
    with torch.no_grad():
        assert rel_err(prior.network(x, t), ref32(x, t)) <= 1e-5


def test_denoiser_matches_eps_to_x0_formula(converted):
    """D(x, sigma) = (x_t - sqrt(1 - abar) eps(x_t, t)) / sqrt(abar), x_t = sqrt(abar) x, at discrete sigmas."""
    preset, ref, prior, _ = converted
    assert isinstance(prior, EpsilonDenoiser) and prior.channels == 3
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    steps = torch.tensor([0, 250, 999])
    sigma = ((1 - abar[steps]) / abar[steps]).sqrt()
    g = torch.Generator().manual_seed(3)
    x0 = torch.rand(3, 3, 32, 32, generator=g, dtype=torch.float64) * 2 - 1
    x = x0 + sigma.view(-1, 1, 1, 1) * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    t = prior.sigma_to_t(sigma)
    assert torch.allclose(t.double(), steps.double(), atol=1e-3)
    with torch.no_grad():
        got = prior(x, sigma)
        a = abar[steps].view(-1, 1, 1, 1)
        x_t = a.sqrt() * x
        eps = ref(x_t, t)[:, :3]
        want = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
    assert got.shape == x.shape
    assert rel_err(got, want) <= 1e-9


def test_parameter_counts_match(converted):
    preset, ref, prior, _ = converted
    n_ref = sum(p.numel() for p in ref.parameters())
    n_dif = sum(p.numel() for p in prior.network.parameters())
    assert n_ref == n_dif


@pytest.mark.parametrize("name", ["ffhq256", "imagenet256"])
def test_presets_map_every_key(name):
    """Full-size presets: every ADM key maps onto a UNet2DModel key of the same size (meta tensors, no memory)."""
    preset = {k: v for k, v in ADM_PRESETS[name].items() if k not in ("resblock_updown", "class_cond")}
    with torch.device("meta"):
        ref = ADMUNet(**preset)
    sd = ref.state_dict()
    out = convert_adm_state_dict(sd, name)
    assert sum(v.numel() for v in out.values()) == sum(v.numel() for v in sd.values())
    cfg = adm_unet_config(name)
    assert cfg["out_channels"] == 6 and cfg["attention_head_dim"] == 64
    assert cfg["flip_sin_to_cos"] is True and cfg["freq_shift"] == 0
    assert cfg["resnet_time_scale_shift"] == "scale_shift"
    attn = [i for i, b in enumerate(cfg["down_block_types"]) if b.startswith("Attn")]
    assert attn == ([4] if name == "ffhq256" else [3, 4, 5])
    assert cfg["up_block_types"] == tuple(b.replace("Down", "Up") for b in reversed(cfg["down_block_types"]))
    if name == "ffhq256":  # the published size of ffhq_10m.pt
        assert sum(v.numel() for v in sd.values()) == 93_563_910


def test_ffhq_config_builds_real_model():
    from diffusers import UNet2DModel

    m = UNet2DModel(**adm_unet_config("ffhq256"))
    assert sum(p.numel() for p in m.parameters()) == 93_563_910
    assert m.mid_block.attentions[0].group_norm is not None  # ADM's mid attention has a GroupNorm


def test_wrong_attention_order_is_detected(converted, tmp_path):
    """Sensitivity: reading legacy (head-first) qkv weights as [q|k|v]-first changes the output."""
    preset, ref, prior, ckpt = converted
    flipped = dict(preset, use_new_attention_order=not preset.get("use_new_attention_order", False))
    convert_adm_checkpoint(ckpt, tmp_path / "wrong", flipped, dtype=torch.float64)
    wrong = load_diffusers_prior(tmp_path / "wrong", dtype=torch.float64)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    t = torch.tensor([500.0])
    with torch.no_grad():
        assert rel_err(wrong.network(x, t), ref(x, t)) > 1e-3


# ----------------------------------------------------------------------------- input handling

TINY_A = TINY["nrb1_attn16_8"]


@pytest.fixture(scope="module")
def small_sd():
    return make_reference(TINY_A, seed=7).float().state_dict()


def test_wrappers_and_module_prefix(small_sd, tmp_path):
    ref = convert_adm_state_dict(small_sd, TINY_A)
    for i, obj in enumerate([{"state_dict": small_sd}, {"model": small_sd}, {f"module.{k}": v for k, v in small_sd.items()}]):
        torch.save(obj, tmp_path / f"c{i}.pt")
        convert_adm_checkpoint(tmp_path / f"c{i}.pt", tmp_path / f"o{i}", TINY_A)
        prior = load_diffusers_prior(tmp_path / f"o{i}")
        got = prior.network.unet.state_dict()
        assert all(torch.equal(got[k], v) for k, v in ref.items())
    assert (tmp_path / "o0" / "scheduler" / "scheduler_config.json").is_file()
    assert (tmp_path / "o0" / "unet" / "diffusion_pytorch_model.safetensors").is_file()


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert_adm_checkpoint(tmp_path / "nope.pt", tmp_path / "out", TINY_A)


def test_not_a_state_dict(tmp_path):
    torch.save([torch.zeros(3)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="not a state dict"):
        convert_adm_checkpoint(tmp_path / "list.pt", tmp_path / "out", TINY_A)
    torch.save({"a": 1}, tmp_path / "ints.pt")
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        convert_adm_checkpoint(tmp_path / "ints.pt", tmp_path / "out", TINY_A)
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(ValueError, match="refused: a weights-only load of it failed"):
        convert_adm_checkpoint(tmp_path / "junk.pt", tmp_path / "out", TINY_A)


def test_pickled_objects_refused_unless_trusted(small_sd, tmp_path):
    import argparse  # training scripts often pickle their args next to the weights

    torch.save({"state_dict": small_sd, "args": argparse.Namespace(lr=1e-4)}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match="trust_pickle"):
        convert_adm_checkpoint(tmp_path / "pickled.pt", tmp_path / "out", TINY_A)
    convert_adm_checkpoint(tmp_path / "pickled.pt", tmp_path / "out", TINY_A, trust_pickle=True)
    assert (tmp_path / "out" / "unet" / "config.json").is_file()


def test_missing_and_unexpected_keys_are_listed(small_sd):
    sd = dict(small_sd)
    del sd["middle_block.1.qkv.weight"]
    sd["label_emb.weight"] = torch.zeros(10, 128)
    with pytest.raises(ValueError, match=r"missing keys: middle_block\.1\.qkv\.weight.*unexpected keys: label_emb\.weight"):
        convert_adm_state_dict(sd, TINY_A)


def test_shape_mismatch_names_key(small_sd):
    sd = dict(small_sd)
    sd["out.2.weight"] = torch.zeros(6, 32, 5, 5)
    with pytest.raises(ValueError, match=r"out\.2\.weight.*conv_out\.weight"):
        convert_adm_state_dict(sd, TINY_A)


def test_wrong_preset_is_reported(small_sd):
    with pytest.raises(ValueError, match="does not match the preset"):
        convert_adm_state_dict(small_sd, TINY["nrb2_attn32_8"])
    with pytest.raises(ValueError, match="unknown ADM preset"):
        convert_adm_state_dict(small_sd, "ffhq512")
    with pytest.raises(ValueError, match="unknown keys"):
        resolve_adm_preset(dict(TINY_A, use_fp17=True))
    with pytest.raises(ValueError, match="class-conditional"):
        resolve_adm_preset(dict(TINY_A, class_cond=True))


def test_existing_output_not_overwritten(small_sd, tmp_path):
    torch.save(small_sd, tmp_path / "a.pt")
    convert_adm_checkpoint(tmp_path / "a.pt", tmp_path / "out", TINY_A)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        convert_adm_checkpoint(tmp_path / "a.pt", tmp_path / "out", TINY_A)
    convert_adm_checkpoint(tmp_path / "a.pt", tmp_path / "out", TINY_A, overwrite=True)


def test_preset_strings_like_guided_diffusion_flags():
    p = resolve_adm_preset(dict(image_size=256, num_channels=128, num_res_blocks=1, channel_mult="",
                                attention_resolutions="16", num_head_channels=64, learn_sigma=True))
    ffhq = resolve_adm_preset("ffhq256")
    assert {k: p[k] for k in ffhq} == ffhq
    assert math.prod(p["channel_mult"]) == 64

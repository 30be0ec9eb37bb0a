"""Load a diffusers ``UNet2DModel`` from a local folder as a :class:`~nfc_dps.priors.base.Prior`.

Accepted layouts (nothing is ever downloaded):

* a pipeline-style folder ``DIR/unet/{config.json, *.safetensors|*.bin}`` with an optional
  ``DIR/scheduler/scheduler_config.json`` (betas, prediction_type);
* a bare UNet folder ``DIR/{config.json, weights}``; its schedule then defaults to DDPM's linear
  betas 1e-4 -> 0.02 over 1000 steps with epsilon prediction (``DEFAULT_SCHEDULE``);
* either of the above with ``DIR/nfc_dps_prior.json``, our own description of the network's
  parameterisation, e.g. ``{"parameterization": "edm", "sigma_data": 0.5, "tile": 48}`` for the
  embedded default prior (EDM-preconditioned, applied in tiles of its training size), and
  ``"arch"``: the network design of :mod:`nfc_dps.priors.archs` (``"unet"`` when absent;
  ``"unet-pixelnorm"`` rebuilds the size-independent UNet with per-pixel channel norms).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .archs import ARCHS, DEFAULT_ARCH, adapt_loaded_unet, size_independent, unet2d_model_class
from .base import PREDICTION_TYPES, EDMDenoiser, EpsilonDenoiser, Prior, TiledPrior

PRIOR_CONFIG_NAME = "nfc_dps_prior.json"
DEFAULT_SCHEDULE = {
    "num_train_timesteps": 1000,
    "beta_schedule": "linear",
    "beta_start": 1e-4,
    "beta_end": 0.02,
    "prediction_type": "epsilon",
}
_PRIOR_CONFIG_KEYS = {"parameterization", "sigma_data", "sigma_min", "sigma_max", "tile", "tile_overlap", "prediction_type",
                      "power_law", "arch"}


def alphas_cumprod_from_config(cfg: dict) -> torch.Tensor:
    """(T,) cumulative alphas of a diffusers DDPM/DDIM scheduler config (linear, scaled_linear, cosine)."""
    n = int(cfg.get("num_train_timesteps", 1000))
    kind = cfg.get("beta_schedule", "linear")
    b0, b1 = float(cfg.get("beta_start", 1e-4)), float(cfg.get("beta_end", 0.02))
    if cfg.get("trained_betas") is not None:
        betas = torch.tensor(cfg["trained_betas"], dtype=torch.float64)
    elif kind == "linear":
        betas = torch.linspace(b0, b1, n, dtype=torch.float64)
    elif kind == "scaled_linear":
        betas = torch.linspace(b0**0.5, b1**0.5, n, dtype=torch.float64) ** 2
    elif kind == "squaredcos_cap_v2":
        t = torch.arange(n + 1, dtype=torch.float64) / n
        f = torch.cos((t + 0.008) / 1.008 * torch.pi / 2) ** 2
        betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
    else:
        raise ValueError(f"unsupported beta_schedule {kind!r} (linear, scaled_linear, squaredcos_cap_v2)")
    return torch.cumprod(1 - betas, 0)


PRECISIONS = ("auto", "float32", "bfloat16")
PARAMETERIZATIONS = ("edm", "ddpm")
#: diffusers schedulers whose config is a discrete variance-preserving beta schedule (what
#: :func:`alphas_cumprod_from_config` reads); others (e.g. ScoreSdeVeScheduler) are refused
BETA_SCHEDULERS = frozenset({
    "DDPMScheduler", "DDIMScheduler", "PNDMScheduler", "DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler",
    "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "HeunDiscreteScheduler", "LMSDiscreteScheduler",
    "KDPM2DiscreteScheduler", "KDPM2AncestralDiscreteScheduler", "UniPCMultistepScheduler", "DEISMultistepScheduler",
    "DDPMParallelScheduler", "DDIMParallelScheduler", "LCMScheduler", "TCDScheduler",
})


def native_bfloat16(device: str | torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware (CUDA: Ampere or newer; CPU:
    the AVX512-BF16 or AMX-BF16 instructions, read from /proc/cpuinfo; elsewhere False)."""
    device = torch.device(device)
    if device.type == "cuda":  # not is_bf16_supported()'s default, which counts emulation as support
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
        return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


def resolve_precision(precision: str, device: str | torch.device, dtype: torch.dtype = torch.float32) -> str:
    """``"auto"`` -> ``"bfloat16"`` for float32 weights on a device with native bfloat16, else
    ``"float32"`` (weights of another dtype, e.g. float64 for checks, run as they are)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bfloat16" if dtype == torch.float32 and native_bfloat16(device) else "float32"
    if precision == "bfloat16" and dtype != torch.float32:
        raise ValueError(f"precision='bfloat16' autocasts float32 weights; got dtype={dtype}")
    return precision


class _UNetCall(torch.nn.Module):
    """Adapts ``UNet2DModel.forward`` (returns an output object) to ``net(x, t) -> Tensor``.

    ``precision="bfloat16"`` runs the network under ``torch.autocast`` (convolutions and matrix
    products in bfloat16, normalisations in float32); the output comes back in ``x``'s dtype, so
    the preconditioning around the network and every sampler stay in float32 (or float64).
    ``channels_last=True`` (weights in that layout): inputs are converted to it, outputs back.
    """

    def __init__(self, unet: torch.nn.Module, precision: str = "float32", channels_last: bool = False) -> None:
        super().__init__()
        self.unet, self.precision, self.channels_last = unet, precision, channels_last

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.precision == "bfloat16":
            # bfloat16 kernels round a batch of one image differently from a batch of several (the
            # same image, other bits): a lone image goes through as a batch of two copies, so its
            # result never depends on how many images share its call
            lone = x.shape[0] == 1
            if lone:
                x, t = torch.cat([x, x]), (torch.cat([t, t]) if t.ndim else t)
            with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
                out = self.unet(x, t).sample.to(x.dtype)
            if lone:
                out = out[:1]
        else:
            out = self.unet(x, t).sample
        return out.contiguous() if self.channels_last else out


def _find_unet_dir(folder: Path) -> Path:
    for cand in (folder / "unet", folder):
        if (cand / "config.json").is_file():
            return cand
    raise FileNotFoundError(
        f"{folder}: not a diffusers UNet folder (expected {folder / 'unet' / 'config.json'} "
        f"or {folder / 'config.json'})"
    )


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``; a clear ValueError naming the file otherwise."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _number(v: object) -> bool:
    """A finite JSON number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_prior_config(cfg: dict, where: Path) -> None:
    """ValueError naming ``where`` and the key for a value of ``nfc_dps_prior.json`` that cannot
    describe a network (a sigma_data of -1, a tile of 0, ...)."""
    def bad(key: str, want: str) -> ValueError:
        return ValueError(f"{where}: {key} must be {want}, got {cfg[key]!r}")

    if cfg.get("parameterization", "ddpm") not in PARAMETERIZATIONS:
        raise ValueError(f"{where}: parameterization {cfg['parameterization']!r} is not one of "
                         f"{', '.join(PARAMETERIZATIONS)}")
    for key in ("sigma_data", "sigma_min", "sigma_max"):
        if key in cfg and not (_number(cfg[key]) and cfg[key] > 0):
            raise bad(key, "a number > 0")
    if float(cfg.get("sigma_min", 0.002)) >= float(cfg.get("sigma_max", 80.0)):
        raise ValueError(f"{where}: sigma_min {cfg.get('sigma_min', 0.002)!r} must be below sigma_max "
                         f"{cfg.get('sigma_max', 80.0)!r}")
    if "tile" in cfg and cfg["tile"] is not None and not (isinstance(cfg["tile"], int) and not isinstance(cfg["tile"], bool)
                                                           and cfg["tile"] >= 1):
        raise bad("tile", "an integer >= 1 (pixels), or absent for an untiled network")
    if "tile_overlap" in cfg and not isinstance(cfg["tile_overlap"], bool):
        raise bad("tile_overlap", "true or false")
    if "prediction_type" in cfg and cfg["prediction_type"] not in PREDICTION_TYPES:
        raise bad("prediction_type", f"one of {', '.join(PREDICTION_TYPES)}")
    if "power_law" in cfg:
        pl = cfg["power_law"]
        if not (isinstance(pl, list) and len(pl) == 2 and all(_number(v) and v > 0 for v in pl)):
            raise bad("power_law", "[amplitude, alpha], two numbers > 0")


def _check_unet_config(ucfg: dict, where: Path, parameterization: str) -> None:
    """ValueError naming ``where`` and the key for a UNet that cannot be a denoiser of its own
    images: output channels other than the input's (or, for a DDPM network, twice them: learned
    variance), or a class-conditional network (nothing here gives it a class label)."""
    cin, cout = ucfg.get("in_channels", 3), ucfg.get("out_channels", 3)
    for key, v in (("in_channels", cin), ("out_channels", cout)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    allowed = (cin,) if parameterization == "edm" else (cin, 2 * cin)
    if cout not in allowed:
        raise ValueError(f"{where}: out_channels {cout} with in_channels {cin}: a denoiser returns an image of its "
                         f"input's channels (out_channels {' or '.join(map(str, allowed))}"
                         + (", the second half a learned variance" if len(allowed) > 1 else "") + ")")
    for key in ("num_class_embeds", "class_embed_type"):
        if ucfg.get(key) is not None:
            raise ValueError(f"{where}: {key} is {ucfg[key]!r}: a class-conditional network is not "
                             f"supported (no class label is given to it)")


def load_diffusers_prior(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                         precision: str = "auto") -> Prior:
    """Load a local diffusers UNet folder as a prior (see module docstring for layouts).

    dtype: the weights' dtype. precision: the network's compute precision, ``"float32"`` (no
    autocast: the weights' own dtype), ``"bfloat16"`` (autocast; faster where the hardware
    multiplies bfloat16 natively; its effect on the default prior is measured in docs/prior.md) or
    ``"auto"`` (bfloat16 where the device has it natively, see :func:`native_bfloat16`). The
    resolved choice is the prior's ``precision`` attribute.
    """
    precision = resolve_precision(precision, device, dtype)
    folder = Path(path)
    unet_dir, prior_cfg = _checked_folder(folder)  # every setting is checked before the weights load
    arch = prior_cfg.get("arch", DEFAULT_ARCH)
    unet = adapt_loaded_unet(_load_unet(unet_dir, dtype), arch, where=str(unet_dir / "config.json"))
    unet = unet.to(device=device).eval().requires_grad_(False)  # dtype already set by torch_dtype
    network = _UNetCall(unet, precision, channels_last=size_independent(arch))
    size_multiple = 2 ** (len(unet.config.block_out_channels) - 1)
    channels = int(unet.config.in_channels)
    if prior_cfg.get("parameterization", "ddpm") == "edm":
        prior: Prior = EDMDenoiser(
            network,
            channels=channels,
            sigma_data=float(prior_cfg.get("sigma_data", 0.5)),
            sigma_min=float(prior_cfg.get("sigma_min", 0.002)),
            sigma_max=float(prior_cfg.get("sigma_max", 80.0)),
            size_multiple=size_multiple,
        )
    else:
        sched = _vp_schedule(folder, prior_cfg)
        prior = EpsilonDenoiser(
            network,
            alphas_cumprod_from_config(sched),
            prediction_type=sched["prediction_type"],
            channels=channels,
            size_multiple=size_multiple,
        )
    if "power_law" in prior_cfg:
        pl = prior_cfg["power_law"]
        prior.power_law = (float(pl[0]), float(pl[1]))
    prior.precision = precision  # before tiling: TiledPrior copies it from the prior it wraps
    if prior_cfg.get("tile") is not None:
        try:
            prior = TiledPrior(prior, int(prior_cfg["tile"]), overlap=bool(prior_cfg.get("tile_overlap", False)))
        except ValueError as e:
            raise ValueError(f"{folder / PRIOR_CONFIG_NAME}: {e}") from e
    return prior.to(device)


def _checked_folder(folder: Path) -> tuple[Path, dict]:
    """(the UNet's folder, the checked nfc_dps_prior.json settings, {} without the file) of a prior
    folder whose UNet config and prior settings are checked; an error naming the file otherwise."""
    if not folder.exists():
        raise FileNotFoundError(f"prior folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"prior {folder} is not a folder (expected a diffusers UNet folder)")
    unet_dir = _find_unet_dir(folder)
    unet_cfg = _read_json(unet_dir / "config.json")
    cls = unet_cfg.get("_class_name", "UNet2DModel")
    if cls != "UNet2DModel":
        raise ValueError(f"{unet_dir / 'config.json'}: _class_name is {cls!r}; only UNet2DModel is supported")
    prior_cfg: dict = {}
    if (folder / PRIOR_CONFIG_NAME).is_file():
        prior_cfg = _read_json(folder / PRIOR_CONFIG_NAME)
        unknown = set(prior_cfg) - _PRIOR_CONFIG_KEYS
        if unknown:
            raise ValueError(f"{folder / PRIOR_CONFIG_NAME}: unknown keys {sorted(unknown)}; allowed {sorted(_PRIOR_CONFIG_KEYS)}")
    _check_prior_config(prior_cfg, folder / PRIOR_CONFIG_NAME)
    if prior_cfg.get("arch", DEFAULT_ARCH) not in ARCHS:
        raise ValueError(f"{folder / PRIOR_CONFIG_NAME}: arch {prior_cfg['arch']!r} is not one of {', '.join(ARCHS)}")
    _check_unet_config(unet_cfg, unet_dir / "config.json", prior_cfg.get("parameterization", "ddpm"))
    return unet_dir, prior_cfg


def _load_unet(unet_dir: Path, dtype: torch.dtype):
    """The UNet2DModel of ``unet_dir`` in ``dtype``; OSError naming the folder when its weights do
    not load or do not match its config (diffusers only warns and initialises them at random)."""
    UNet2DModel = unet2d_model_class()
    try:
        unet, info = UNet2DModel.from_pretrained(
            unet_dir, local_files_only=True, low_cpu_mem_usage=False, torch_dtype=dtype, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise OSError(f"{unet_dir}: could not load UNet2DModel weights: {e}") from e
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        detail = "; ".join(f"{k.replace('_', ' ')}: {v[:5]}{' ...' if len(v) > 5 else ''}" for k, v in bad.items() if v)
        raise OSError(f"{unet_dir}: weights do not match config.json ({detail})")
    return unet


def _vp_schedule(folder: Path, prior_cfg: dict) -> dict:
    """The beta schedule of a DDPM-parameterised prior: :data:`DEFAULT_SCHEDULE` updated by the
    folder's scheduler/scheduler_config.json and the prior settings' ``prediction_type``."""
    sched_file = folder / "scheduler" / "scheduler_config.json"
    sched = dict(DEFAULT_SCHEDULE)
    if sched_file.is_file():
        sched.update(_read_json(sched_file))
        kind = sched.get("_class_name", "DDPMScheduler")
        if kind not in BETA_SCHEDULERS:
            raise ValueError(f"{sched_file}: {kind} is not a discrete beta-schedule (variance-preserving) "
                             f"scheduler; supported: {', '.join(sorted(BETA_SCHEDULERS))}")
        if sched.get("rescale_betas_zero_snr"):
            raise ValueError(f"{sched_file}: rescale_betas_zero_snr is not supported (its last timestep has "
                             f"infinite noise, no sigma to map it to)")
    if "prediction_type" in prior_cfg:
        sched["prediction_type"] = prior_cfg["prediction_type"]
    return sched

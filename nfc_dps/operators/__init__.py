"""Linear forward operators (blur, inpainting, super-resolution, denoising, any linear function), their
decompositions and their makers."""

from .base import (
                   LinearOperator,
                   check_image,
                   conjugate_gradient,
                   noise_sigma_problem,
                   normal_equations_prox,
                   per_image,
                   prox_scales,
                   randn_per_image,
)
from .blind import BlindBlur
from .blur import BlurOperator, mirror_indices
from .colorize import LUMA_WEIGHTS, Colorization
from .decomposition import ChannelDecomposition, Decomposition, FourierDecomposition, PixelDecomposition
from .denoising import Denoising
from .function import FunctionOperator
from .inpainting import Inpainting, box_mask, load_mask, random_mask
from .kernels import gaussian_kernel, load_kernel, motion_kernel, normalize_kernel, shake_kernel
from .nonlinear import (
                   CameraBlur,
                   Exposure,
                   HighDynamicRange,
                   LinearizedOperator,
                   NonlinearFunctionOperator,
                   NonlinearOperator,
                   PhaseRetrieval,
                   is_linear,
)
from .padding import CroppedOperator, padded_size
from .superres import SuperResolution, bicubic_matrix, keys_cubic
from .tasks import TASKS, Task, build_operator, check_task_params, task_reading
from .weighted import WeightedOperator

__all__ = [
    "LinearOperator", "check_image", "conjugate_gradient", "noise_sigma_problem", "per_image", "prox_scales",
    "randn_per_image", "normal_equations_prox",
    "Decomposition", "FourierDecomposition", "PixelDecomposition", "ChannelDecomposition",
    "BlurOperator", "BlindBlur", "mirror_indices",
    "Colorization", "LUMA_WEIGHTS", "Denoising", "Inpainting", "box_mask", "random_mask", "load_mask",
    "gaussian_kernel", "motion_kernel", "shake_kernel", "load_kernel", "normalize_kernel",
    "SuperResolution", "bicubic_matrix", "keys_cubic", "TASKS", "Task", "build_operator", "check_task_params", "task_reading",
    "CroppedOperator", "padded_size", "FunctionOperator", "WeightedOperator",
    "NonlinearOperator", "LinearizedOperator", "NonlinearFunctionOperator", "HighDynamicRange", "Exposure", "PhaseRetrieval", "CameraBlur",
    "is_linear",
]

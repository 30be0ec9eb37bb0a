"""Classical restorations a user would pick instead of a diffusion sampler: no prior, no network.

* :mod:`~nfc_dps.baselines.catalogue`: every method's entry in :data:`CLASSICAL` (its function, the
  name tables show, what it restores), :func:`applicable` and :func:`restore_classical`;
* :mod:`~nfc_dps.baselines.linear`: linear operators under Gaussian noise (Wiener, TV, bicubic,
  biharmonic inpainting) and JPEG files (QCS + TV);
* :mod:`~nfc_dps.baselines.nonlinear`: the nonlinear and Poisson problems (HIO + ER, the unclipped
  inverse with inpainting, TV in linear light, Richardson-Lucy, Anscombe + TV).
"""

from .catalogue import (
    CLASSICAL,
    OPERATOR_KINDS,
    ClassicalMethod,
    applicable,
    classical_method,
    classical_methods,
    operator_kind,
    restore_classical,
)
from .linear import (
    QCS_TV_ITERATIONS,
    QCS_TV_WEIGHT_PER_SIGMA,
    TV_LAMBDA_FLOOR,
    TV_LAMBDA_PER_SIGMA,
    NotApplicable,
    bicubic_upsample,
    biharmonic_inpaint,
    calibrate_tv,
    fit_measurement_spectrum,
    has_quantisation_cells,
    operator_dtype,
    operator_family,
    qcs_tv,
    tv_lambda,
    tv_restore,
    wiener,
    wiener_problem,
)
from .nonlinear import (
    ANSCOMBE_TV_WEIGHT,
    RL_ITERATIONS,
    anscombe_tv,
    camera_tv,
    hdr_inverse_inpaint,
    hio_er,
    richardson_lucy,
    tune_poisson,
)

__all__ = [
    "CLASSICAL", "OPERATOR_KINDS", "ClassicalMethod", "applicable", "classical_method", "classical_methods",
    "operator_kind", "restore_classical", "NotApplicable", "wiener", "wiener_problem", "tv_restore",
    "bicubic_upsample", "biharmonic_inpaint", "qcs_tv", "fit_measurement_spectrum", "tv_lambda", "operator_family",
    "operator_dtype", "has_quantisation_cells", "calibrate_tv", "TV_LAMBDA_PER_SIGMA", "TV_LAMBDA_FLOOR",
    "QCS_TV_WEIGHT_PER_SIGMA", "QCS_TV_ITERATIONS", "richardson_lucy", "anscombe_tv", "hio_er",
    "hdr_inverse_inpaint", "camera_tv", "tune_poisson", "RL_ITERATIONS", "ANSCOMBE_TV_WEIGHT",
]

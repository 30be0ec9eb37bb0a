"""DPIR's periodical geometric self-ensemble (Zhang et al., "Plug-and-Play Image Restoration with
Deep Denoiser Prior", TPAMI 2021): the k-th call of the denoiser sees its input under the
(k mod 8)-th symmetry of the square (quarter turns and mirrors) and its output is mapped back.

Over an iterative method's calls the eight orientations take turns, so the orientation-dependent
part of the network's error (and of a tiled prior's seams) partly averages out across iterations at
no extra network evaluation. A denoiser that is itself equivariant (a Gaussian prior with a
spectrum invariant under the square's symmetries) is unchanged by it. A quarter turn swaps H and
W: on a non-square image a prior built for one size (:attr:`Prior.fixed_size`) takes only the four
symmetries that keep the shape (identity, mirror, half turn, half turn and mirror), in turn.
"""

from __future__ import annotations

from torch import Tensor

from ..priors.base import Prior, PriorWrapper

#: the symmetries of the square: 4 quarter turns, each with or without a left-right mirror
DIHEDRAL_ORDER = 8
#: those of them that keep a non-square image's shape (no quarter turn), as indices k of dihedral()
SHAPE_KEEPING = (0, 4, 2, 6)


def dihedral(x: Tensor, k: int) -> Tensor:
    """The k-th (0..7) symmetry on the last two axes: k % 4 quarter turns, then a mirror if k >= 4.
    A quarter turn swaps H and W."""
    x = x.rot90(k % 4, dims=(-2, -1))
    return x.flip(-1) if k >= 4 else x


def dihedral_inverse(x: Tensor, k: int) -> Tensor:
    """Undoes :func:`dihedral` (x, k)."""
    if k >= 4:
        x = x.flip(-1)
    return x.rot90(-(k % 4), dims=(-2, -1))


class SelfEnsemblePrior(PriorWrapper):
    """Wraps a prior: call number j (from 0) denoises ``dihedral(x, j % 8)`` and maps the result back
    (for a prior built for one size, on a non-square image: ``dihedral(x, SHAPE_KEEPING[j % 4])``).

    Deterministic and independent of the batch (every image of a call gets the same symmetry);
    a fresh wrapper starts again at the identity. Network evaluations are those of the wrapped prior.
    """

    def __init__(self, inner: Prior) -> None:
        super().__init__(inner)
        self.calls = 0

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        if x.shape[-2] == x.shape[-1] or self.fixed_size is None:
            k = self.calls % DIHEDRAL_ORDER
        else:
            k = SHAPE_KEEPING[self.calls % len(SHAPE_KEEPING)]
        self.calls += 1
        return dihedral_inverse(self.inner.denoise(dihedral(x, k), sigma), k)

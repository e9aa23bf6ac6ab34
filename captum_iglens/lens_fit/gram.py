r"""
The closed-form fit of linear shortcuts (Din et al. 2023, "Jump to
Conclusions"): for every hidden state ``h_i`` of a model, the affine map
``h_i ↦ h_i M_i + b_i`` closest to the last block's output ``h_L`` in least
squares, with a ridge that pulls ``M_i`` towards the identity.

The statistics are streamed: :class:`GramStats` adds batches of states to float64
sums (``Σx``, ``Σy``, ``Σxxᵀ``, ``Σxyᵀ`` per state), so the fit never holds the
corpus; :func:`solve_ridge` turns them into translators in the tuned-lens layout
(``h + h Wᵀ + b``, ``W`` the delta from the identity).
"""

import copy
from typing import Any, Dict, Tuple

import torch
from torch import Tensor


class GramStats:
    r"""
    Streamed float64 sums of the states ``x = h_i`` (``i = 0 … L−1``) and the
    target ``y = h_L``, over the rows added so far.

    Args:

        n_states (int): ``L``, the number of states fitted (the final state
                    gets no translator).
        width (int): ``d``, the hidden size.
        device (torch.device, optional): Where the sums live. Default: cpu
    """

    def __init__(
        self, n_states: int, width: int, device: torch.device = torch.device("cpu")
    ) -> None:
        if n_states < 1 or width < 1:
            raise ValueError(
                f"n_states, width: expected ints >= 1, got {n_states}, {width}"
            )
        options: Dict[str, Any] = dict(dtype=torch.float64, device=device)
        self.rows = 0
        self.sum_x = torch.zeros(n_states, width, **options)
        self.sum_y = torch.zeros(width, **options)
        self.xx = torch.zeros(n_states, width, width, **options)
        self.xy = torch.zeros(n_states, width, width, **options)

    @property
    def width(self) -> int:
        r"""The hidden size ``d``."""
        return self.sum_y.shape[0]

    def add(self, states: Tensor) -> None:
        r"""
        Adds rows to the sums.

        Args:

            states (Tensor): ``(L + 1, N, d)``: per row, the states ``h_0 …
                        h_{L−1}`` and the target ``h_L`` (last).
        """
        n_states = self.sum_x.shape[0]
        if (
            states.dim() != 3
            or states.shape[0] != n_states + 1
            or (states.shape[2] != self.width)
        ):
            raise ValueError(
                f"states: expected shape ({n_states + 1}, N, {self.width}), got "
                f"{tuple(states.shape)}"
            )
        x = states[:-1].to(self.xx.device, torch.float64)
        y = states[-1].to(self.xx.device, torch.float64)
        self.rows += states.shape[1]
        self.sum_x += x.sum(1)
        self.sum_y += y.sum(0)
        self.xx += x.transpose(1, 2) @ x
        self.xy += x.transpose(1, 2) @ y

    def copy(self) -> "GramStats":
        r"""An independent copy (a snapshot of the sums so far)."""
        return copy.deepcopy(self)


def solve_ridge(stats: GramStats, ridge: float) -> Tuple[Tensor, Tensor]:
    r"""
    The affine maps ``y ≈ x M_i + b_i`` minimising
    ``Σ ‖y − x M_i − b_i‖² + λ_i ‖M_i − I‖²`` over the rows of ``stats``, with
    ``λ_i = ridge · tr(C_i) / d`` (``C_i`` the centred Gram matrix of state
    ``i``), so the ridge is relative to the state's own scale:
    ``(C_i + λ_i I) M_i = C_{xy,i} + λ_i I`` and ``b_i = ȳ − x̄_i M_i``.

    Args:

        stats (GramStats): The sums, with at least two rows.
        ridge (float): The relative ridge, ``> 0``.

    Returns:
        2-element tuple of **weight** and **bias**, float32, in the tuned-lens
        layout (the translator of state ``i`` is ``h + h Wᵢᵀ + bᵢ``):
        - **weight** (*Tensor*): ``(L, d, d)``, ``W_i = (M_i − I)ᵀ``.
        - **bias** (*Tensor*): ``(L, d)``.
    """
    if not ridge > 0:
        raise ValueError(f"ridge: expected a number > 0, got {ridge!r}")
    if stats.rows < 2:
        raise ValueError(f"stats: expected at least 2 rows, got {stats.rows}")
    n, d = stats.rows, stats.width
    mean_x = stats.sum_x / n  # (L, d)
    mean_y = stats.sum_y / n  # (d,)
    cov_xx = stats.xx - n * mean_x[:, :, None] * mean_x[:, None, :]
    cov_xy = stats.xy - n * mean_x[:, :, None] * mean_y[None, None, :]
    eye = torch.eye(d, dtype=torch.float64, device=cov_xx.device)
    scale = ridge * cov_xx.diagonal(dim1=1, dim2=2).sum(-1) / d  # (L,)
    # Degenerate states (all rows equal) keep the identity.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    lhs = cov_xx + scale[:, None, None] * eye
    rhs = cov_xy + scale[:, None, None] * eye
    maps = torch.linalg.solve(lhs, rhs)  # (L, d, d): M_i
    bias = mean_y[None] - (mean_x[:, None, :] @ maps)[:, 0]
    weight = (maps - eye).transpose(1, 2)
    return weight.float(), bias.float()

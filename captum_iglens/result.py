r"""The token-by-layer result of IG-Lens, with onset detection and JSON export."""

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
from torch import Tensor

_TENSOR_FIELDS = (
    "attributions",
    "lens",
    "base_prob",
    "model_prob",
    "delta",
    "targets",
    "positions",
    "mask",
)
_DTYPES = {"targets": torch.long, "positions": torch.long, "mask": torch.bool}


@dataclass
class IGLensResult:
    r"""
    The IG-Lens map for ``B`` sequences, ``P`` attributed positions and ``k`` layers.

    Attributes:

        attributions (Tensor): ``(B, P, k)`` float32. Layer ``j``'s credit
                    ``f(h_{L_j}) - f(h_{L_{j-1}})``. Zero at padding.
        lens (Tensor): ``(B, P, k)`` float32. The logit-lens level ``f(h_{L_j})``,
                    the target's probability read out of each chosen layer.
        base_prob (Tensor): ``(B, P)`` float32. ``f(h_base)``.
        model_prob (Tensor): ``(B, P)`` float32. The model's own probability of
                    the target, from its real output logits.
        delta (Tensor): ``(B, P)`` float32. Convergence delta,
                    ``Σ_j attributions - (model_prob - base_prob)``.
        targets (Tensor): ``(B, P)`` long. The attributed token ids.
        positions (Tensor): ``(P,)`` long. The attributed positions (each
                    predicts the token at the next position).
        mask (Tensor): ``(B, P)`` bool. False where the position is padding.
        layer_names (list[str]): ``k`` names of the chosen layers.
        method (str): The estimator used.
        n_steps (int): The number of steps used by the estimator.
        tokens (list[list[str]], optional): ``B`` lists of ``P`` strings, the
                    target tokens as text, when a tokenizer was available.
        metadata (dict): Free-form settings (prompt, model, versions...); must be
                    JSON-serialisable.
    """

    attributions: Tensor
    lens: Tensor
    base_prob: Tensor
    model_prob: Tensor
    delta: Tensor
    targets: Tensor
    positions: Tensor
    mask: Tensor
    layer_names: List[str]
    method: str
    n_steps: int
    tokens: Optional[List[List[str]]] = None
    metadata: Dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> Tensor:
        """``(B, P)``: the sum of the layer credits, ``Σ_j attributions``."""
        return self.attributions.sum(-1)

    def onset(self, frac: float = 0.5) -> Tensor:
        r"""
        The onset layer ``L*`` of every token: the earliest chosen layer at which the
        cumulative ``|credit|`` reaches ``frac`` of the token's total ``|credit|``.

        Args:

            frac (float, optional): Fraction of the absolute credit mass, in
                        ``(0, 1]``. Default: 0.5.

        Returns:
            *Tensor* of shape ``(B, P)``, long: an index into ``layer_names``, or
            ``-1`` where the token has no credit at all (or is padding).
        """
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"frac: expected a number in (0, 1], got {frac}")
        mass = self.attributions.abs().cumsum(-1)
        total = mass[..., -1:]
        reached = mass >= frac * total * (1 - 1e-6)
        index = reached.long().argmax(-1)
        return torch.where((total[..., 0] > 0) & self.mask, index, -1)

    def to(self, device: Union[str, torch.device]) -> "IGLensResult":
        """A copy with every tensor on ``device``."""
        moved = {name: getattr(self, name).to(device) for name in _TENSOR_FIELDS}
        return replace(self, **moved)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary of every field (tensors as nested lists)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, Tensor) else value
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "IGLensResult":
        """Inverse of :meth:`to_dict`."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"data: unknown IGLensResult fields {sorted(unknown)}")
        kwargs = dict(data)
        for name in _TENSOR_FIELDS:
            kwargs[name] = torch.tensor(
                data[name], dtype=_DTYPES.get(name, torch.float32)
            )
        return cls(**kwargs)

    def save(self, path: Union[str, Path]) -> None:
        """Write the result as JSON (no pickle: loading it never runs code)."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Union[str, Path]) -> "IGLensResult":
        """Read a result written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

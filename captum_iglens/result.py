r"""The token-by-layer result of IG-Lens, with onset detection and JSON export."""

import csv
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

    def format_table(
        self, batch_index: int = 0, *, width: int = 100, onset_frac: float = 0.5
    ) -> str:
        r"""
        A plain-text table of one sequence: a row per attributed token with the
        layer credits, the logit-lens level at the last layer, ``Σ``, ``Δp``, the
        model's probability and the onset layer.

        Args:

            batch_index (int, optional): The sequence to show. Default: 0.
            width (int, optional): Characters available. When every layer does
                        not fit, the layers with the largest ``|credit|`` are shown
                        (in order) and a note says so; ``Σ`` always includes every
                        layer. Default: 100.
            onset_frac (float, optional): As in :meth:`onset`. Default: 0.5.

        Returns:
            *str*: the table, with a final completeness line
            ``max |Σ - Δp|``.
        """
        if not 0 <= batch_index < self.attributions.shape[0]:
            raise ValueError(
                f"batch_index: expected 0 <= batch_index < "
                f"{self.attributions.shape[0]}, got {batch_index}"
            )
        rows = self.mask[batch_index].nonzero()[:, 0].tolist()
        credits = self.attributions[batch_index]
        labels = self._token_labels(batch_index)
        token_w = max([5] + [len(labels[r]) for r in rows])
        col_w = max(7, 1 + max(len(n) for n in self.layer_names))
        fixed = token_w + 4 * 9 + col_w + 6
        k = len(self.layer_names)
        fits = max(1, (width - fixed) // (col_w + 1))
        if fits >= k:
            shown = list(range(k))
        else:
            score = credits[rows].abs().amax(0) if rows else credits.abs().amax(0)
            shown = sorted(score.topk(fits).indices.tolist())
        onset = self.onset(onset_frac)[batch_index]
        change = self.model_prob[batch_index] - self.base_prob[batch_index]
        head = [f"{'token':<{token_w}}"]
        head += [f"{'L' + self.layer_names[j]:>{col_w}}" for j in shown]
        head += [f"{c:>8}" for c in ("lens@top", "Σ", "Δp", "p_model")]
        head.append(f"{'onset':>{col_w}}")
        lines = [" ".join(head)]
        for r in rows:
            cells = [f"{labels[r]:<{token_w}}"]
            cells += [f"{credits[r, j]:>+{col_w}.3f}" for j in shown]
            cells += [
                f"{self.lens[batch_index, r, -1]:>8.4f}",
                f"{credits[r].sum():>+8.4f}",
                f"{change[r]:>+8.4f}",
                f"{self.model_prob[batch_index, r]:>8.4f}",
                f"{self.layer_names[onset[r]] if onset[r] >= 0 else '-':>{col_w}}",
            ]
            lines.append(" ".join(cells))
        if len(shown) < k:
            lines.append(
                f"(showing {len(shown)} of {k} layers, those with the largest "
                "|credit|; Σ includes all layers)"
            )
        residual = (credits.sum(-1) - change)[rows].abs().max().item() if rows else 0.0
        lines.append(
            f"completeness: max |Σ - Δp| = {residual:.2e} over {len(rows)} tokens"
        )
        return "\n".join(lines)

    def _token_labels(self, batch_index: int) -> List[str]:
        if self.tokens is not None:
            return [repr(t)[1:-1][:16] for t in self.tokens[batch_index]]
        return [f"#{int(t)}" for t in self.targets[batch_index]]

    def to_csv(self, path: Union[str, Path]) -> None:
        """Write a long-format CSV: batch, position, token, layer, credit, lens."""
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["batch", "position", "token", "layer", "credit", "lens"])
            for b in range(self.attributions.shape[0]):
                labels = self.tokens[b] if self.tokens is not None else None
                for p in self.mask[b].nonzero()[:, 0].tolist():
                    token = labels[p] if labels else int(self.targets[b, p])
                    for j, name in enumerate(self.layer_names):
                        writer.writerow(
                            [
                                b,
                                int(self.positions[p]),
                                token,
                                name,
                                float(self.attributions[b, p, j]),
                                float(self.lens[b, p, j]),
                            ]
                        )

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
        b, p = len(data["targets"]), len(data["positions"])
        shapes = {"attributions": (b, p, -1), "lens": (b, p, -1), "positions": (p,)}
        for name in _TENSOR_FIELDS:
            value = torch.tensor(data[name], dtype=_DTYPES.get(name, torch.float32))
            # Nested lists keep no shape when a dimension is empty.
            shape = shapes.get(name, (b, p))
            if value.numel() == 0:
                shape = tuple(len(data["layer_names"]) if n == -1 else n for n in shape)
            kwargs[name] = value.reshape(shape)
        return cls(**kwargs)

    def save(self, path: Union[str, Path]) -> None:
        """Write the result as JSON (no pickle: loading it never runs code)."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Union[str, Path]) -> "IGLensResult":
        """Read a result written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

r"""
The per-(head, source) terms of ``granularity="source"`` in factored form.

A term is ``u_{h,j} = f ⊙ s · A^h_{tj} W_O^h v^h_j`` (``f`` a post-norm block's
factor per row, else ones): its weight ``A`` at the attributed row, the value
``v`` of its source position and the head's slice of the attention output
projection. :class:`SourceComponents` keeps only these factors, the weights of
the attributed rows ``(R, H, T)`` and the values ``(B, H_kv, T, e)`` per block, so what
the source split holds grows with ``T``, never with ``T · d`` per head. The
estimators read the terms through their products with gradients, their norms
and their heads' sums (:meth:`SourceComponents.dots`,
:meth:`SourceComponents.norms`), which never build a ``(rows, H·T, d)`` array;
only per-dimension attributions, whose output has that size, build the terms
(``[rows]``).
"""

from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor


class SourceComponents:
    r"""
    The terms ``u_{h,j}`` (and the bias; a parallel block's MLP) of every row
    and chosen block: read as a ``(*rows, C, d)`` float32 array with ``C = H·T
    (+ 1) (+ 1)``, the terms ordered head-major (``c = h·T + j``), then the bias,
    then the MLP.

    Args:

        weights (Tensor): ``(R, H, T)`` float32: the attention weights of each
                    row, ``R = B·P·k`` rows ordered ``(b, p, l)``.
        values (list[Tensor]): Per block, ``(B, H_kv, T, e)`` float32: the
                    values (``e`` may differ between blocks).
        projections (list[Tensor]): Per block, the attention output
                    projection's weight ``(d, H·e)``.
        scale (float): ``s``, the residual multiplier (1 where ``factor`` is
                    given).
        bias (Tensor, optional): ``(k, d)`` float32: ``s · b`` per block.
        rows (tuple[int, ...]): The leading shape, ``(B, P, k)`` or a flattening
                    of it.
        per_example (int): ``P · k``, the rows of one example.
        factor (Tensor, optional): ``(R, d)`` float32: a post-norm block's
                    factor per row. Default: None
        extra (Tensor, optional): ``(R, d)`` float32: a parallel block's MLP
                    output per row, the last component. Default: None
        correction (Tensor, optional): ``(R, H, e)`` float32 (``e`` the
                    largest head size, zero-padded): per row and head, added
                    to every value the row reads, so that the head's terms sum
                    to the real forward's head output. Default: None
    """

    def __init__(
        self,
        weights: Tensor,
        values: Sequence[Tensor],
        projections: Sequence[Tensor],
        scale: float,
        bias: Optional[Tensor],
        rows: Tuple[int, ...],
        per_example: int,
        factor: Optional[Tensor] = None,
        extra: Optional[Tensor] = None,
        correction: Optional[Tensor] = None,
    ) -> None:
        self.weights = weights
        self.values = list(values)
        self.projections = list(projections)
        self.scale = scale
        self.bias = bias
        self.rows = tuple(rows)
        self.per_example = per_example
        self.factor = factor
        self.extra = extra
        self.correction = correction
        self._grams: List[Optional[Tensor]] = [None] * len(self.projections)

    @property
    def blocks(self) -> int:
        return len(self.projections)

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def n_sources(self) -> int:
        return self.weights.shape[2]

    @property
    def shape(self) -> torch.Size:
        c = self.n_heads * self.n_sources + (self.bias is not None)
        c += self.extra is not None
        return torch.Size([*self.rows, c, self.projections[0].shape[0]])

    @property
    def parents(self) -> Tensor:
        """``(C,)`` long: each term's head; the bias and a parallel block's MLP
        are groups of their own."""
        heads = torch.arange(self.n_heads).repeat_interleave(self.n_sources)
        others = (self.bias is not None) + (self.extra is not None)
        heads = torch.cat([heads, self.n_heads + torch.arange(others)])
        return heads.to(self.weights.device)

    def flatten(self, start: int, end: int) -> "SourceComponents":
        """The same terms with leading dimensions ``start..end`` merged."""
        if start < 0 or end >= len(self.rows):
            raise ValueError("only leading (row) dimensions can be flattened")
        size = 1
        for n in self.rows[start : end + 1]:
            size *= n
        rows = (*self.rows[:start], size, *self.rows[end + 1 :])
        return SourceComponents(
            self.weights,
            self.values,
            self.projections,
            self.scale,
            self.bias,
            rows,
            self.per_example,
            self.factor,
            self.extra,
            self.correction,
        )

    def __getitem__(self, index: Union[slice, Tensor]) -> Tensor:
        """The terms of the rows ``index`` of the flat row axis, ``(g, C, d)``."""
        flat = self._flat(index)
        d = self.projections[0].shape[0]
        terms = self.weights.new_empty(len(flat), self.n_heads, self.n_sources, d)
        for block, sel in self._by_block(flat):
            weighted = self.weights[flat[sel]].unsqueeze(-1) * self._values(
                block, flat[sel]
            )
            terms[sel] = torch.einsum("ghte,dhe->ghtd", weighted, self._heads(block))
        factor = None if self.factor is None else self.factor[flat]
        if factor is not None:
            terms = terms * factor[:, None, None]
        return torch.cat([terms.flatten(1, 2), *self._others(flat, factor)], dim=1)

    def dots(self, index: Union[slice, Tensor], grads: Tensor) -> Tensor:
        r"""
        ``g_s · u_c`` for the rows ``index`` and their vectors ``grads``
        ``(g, S, d)``: ``(g, S, C)``, through ``(s W_O^h)^T (f ⊙ g_s)`` per head,
        never the terms themselves.
        """
        flat = self._flat(index)
        raw = grads
        if self.factor is not None:
            grads = grads * self.factor[flat].unsqueeze(1)
        g, steps = grads.shape[:2]
        out = grads.new_empty(g, steps, self.n_heads, self.n_sources)
        for block, sel in self._by_block(flat):
            projected = torch.einsum("gsd,dhe->gshe", grads[sel], self._heads(block))
            along = torch.einsum(
                "gshe,ghte->gsht", projected, self._values(block, flat[sel])
            )
            out[sel] = along * self.weights[flat[sel]].unsqueeze(1)
        parts = [out.flatten(2)]
        if self.bias is not None:
            parts.append(grads @ self.bias[self._block(flat)].unsqueeze(-1))
        if self.extra is not None:
            parts.append(raw @ self.extra[flat].unsqueeze(-1))
        return torch.cat(parts, dim=2)

    def norms(self, index: Union[slice, Tensor]) -> Tuple[Tensor, Tensor]:
        r"""
        ``‖u_c‖²`` ``(g, C)`` for the rows ``index``, and the squared norms of
        the groups of :attr:`parents` (each head's terms summed: the head's
        output), ``(g, G)``.
        """
        flat = self._flat(index)
        factor = None if self.factor is None else self.factor[flat]
        terms = self.weights.new_empty(len(flat), self.n_heads, self.n_sources)
        heads = self.weights.new_empty(len(flat), self.n_heads)
        for block, sel in self._by_block(flat):
            values, weights = self._values(block, flat[sel]), self.weights[flat[sel]]
            scaled = self._heads(block)
            f = None if factor is None else factor[sel]
            if f is None:
                gram = self._gram(block)
                quadratic = torch.einsum("ghte,hef,ghtf->ght", values, gram, values)
            else:
                gram = torch.einsum("dhe,gd,dhf->ghef", scaled, f.square(), scaled)
                quadratic = torch.einsum("ghte,ghef,ghtf->ght", values, gram, values)
            terms[sel] = weights.square() * quadratic.clamp_min(0)
            outputs = torch.einsum("ght,ghte,dhe->ghd", weights, values, scaled)
            if f is not None:
                outputs = outputs * f.unsqueeze(1)
            heads[sel] = outputs.square().sum(-1)
        others = [o.square().sum(-1) for o in self._others(flat, factor)]
        others_cat = [o.view(len(flat), -1) for o in others]
        return (
            torch.cat([terms.flatten(1), *others_cat], dim=1),
            torch.cat([heads, *others_cat], dim=1),
        )

    def __len__(self) -> int:
        return self.rows[0]

    def _flat(self, index: Union[slice, Tensor]) -> Tensor:
        if len(self.rows) != 1:
            raise ValueError("flatten the rows to one axis before indexing")
        return torch.arange(self.weights.shape[0], device=self.weights.device)[index]

    def _block(self, flat: Tensor) -> Tensor:
        return flat % self.blocks

    def _by_block(self, flat: Tensor) -> Iterator[Tuple[int, Tensor]]:
        """Each block among the rows ``flat`` and where its rows are."""
        blocks = self._block(flat)
        for block in blocks.unique().tolist():
            yield block, (blocks == block).nonzero()[:, 0]

    def _values(self, block: int, flat: Tensor) -> Tensor:
        """``(g, H, T, e)``: the values each row of ``block`` reads, over the
        query heads."""
        example = torch.div(flat, self.per_example, rounding_mode="floor")
        values = self.values[block][example]
        values = values.repeat_interleave(self.n_heads // values.shape[1], dim=1)
        if self.correction is None:
            return values
        shift = self.correction[flat][:, :, None, : values.shape[-1]]
        return values + shift

    def _heads(self, block: int) -> Tensor:
        """``(d, H, e)`` float32: ``s W_O`` per head."""
        weight = self.projections[block].float().to(self.weights.device)
        per_head = weight.view(weight.shape[0], self.n_heads, -1)
        return per_head * self.scale if self.scale != 1.0 else per_head

    def _gram(self, block: int) -> Tensor:
        """``(H, e, e)``: ``(s W_O^h)^T (s W_O^h)`` per head, kept per block."""
        found = self._grams[block]
        if found is None:
            heads = self._heads(block)
            found = self._grams[block] = torch.einsum("dhe,dhf->hef", heads, heads)
        return found

    def _others(self, flat: Tensor, factor: Optional[Tensor]) -> List[Tensor]:
        """The bias and the MLP components of the rows, ``(g, 1, d)`` each."""
        parts = []
        if self.bias is not None:
            bias = self.bias[self._block(flat)]
            parts.append((bias if factor is None else bias * factor).unsqueeze(1))
        if self.extra is not None:
            parts.append(self.extra[flat].unsqueeze(1))
        return parts

r"""The token-by-layer result of IG-Lens: checked on construction, sliced,
concatenated, saved and loaded."""

import csv
import io
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor

from captum_iglens._utils.schema import (
    Array,
    Default,
    Integer,
    Maybe,
    Record,
    Text,
    Texts,
)
from captum_iglens._utils.serialization import (
    JsonDocument,
    check_writable,
    plain,
    write_atomic,
)
from captum_iglens._utils.source_columns import (
    SourceLayout,
    format_sources,
    source_layout,
)
from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.readout.layer_readout import READOUT_KINDS
from captum_iglens.readout.scores import PAD
from captum_iglens.viewer import Viewable
from captum_iglens.viewer._map import map_page

#: The estimators a result may name in ``method``, as data (the names of
#: :data:`captum_iglens.ESTIMATORS`, kept equal by a test), so that a result
#: loads without importing an algorithm.
ESTIMATOR_NAMES = (
    "prediction_aware",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
    "gausslegendre",
)

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
#: Optional tensors: the views of each layer's distribution (``top_k >= 1``)
#: and what was attributed in place of the single target.
_VIEW_FIELDS = ("top_ids", "top_probs", "entropy", "kl", "rank")
_SET_FIELDS = ("target_sets", "foils")
#: Under a learned readout per layer: the lens-change part of each credit.
_READOUT_FIELDS = ("lens_change",)
_OPTIONAL_FIELDS = _VIEW_FIELDS + _SET_FIELDS + _READOUT_FIELDS
_DTYPES = {
    "targets": torch.long,
    "positions": torch.long,
    "mask": torch.bool,
    "top_ids": torch.long,
    "rank": torch.long,
    "target_sets": torch.long,
    "foils": torch.long,
}
# Probabilities may overshoot [0, 1] by float rounding only.
_PROB_SLACK = 1e-4
# |Σ credits − Δp − delta|: summation order only.
_DELTA_SLACK = 1e-3

Index = Union[None, int, slice, Sequence[int], Tensor]

#: What a saved :class:`IGLensResult` holds, one declaration per field (see
#: :mod:`captum_iglens._utils.schema`): ``B`` sequences, ``P`` positions, ``k``
#: layers, ``K`` top tokens, ``S`` set members, ``F`` foils. Sizes are set by
#: the first field that shows them, so the fields that name them come first.
IGLENS_SCHEMA = Record(
    layer_names=Texts("k", nonempty=True),
    targets=Array("int", "B", "P"),
    positions=Array("int", "P"),
    mask=Array("bool", "B", "P"),
    attributions=Array("float", "B", "P", "k"),
    lens=Array("float", "B", "P", "k"),
    base_prob=Array("float", "B", "P"),
    model_prob=Array("float", "B", "P"),
    delta=Array("float", "B", "P"),
    method=Text(ESTIMATOR_NAMES),
    n_steps=Integer(low=1),
    tokens=Maybe(Texts("B", "P")),
    metadata=Default(Record(open=True, source_tokens=Maybe(Texts("B", "T")))),
    top_ids=Maybe(Array("int", "B", "P", "k", "K")),
    top_probs=Maybe(Array("float", "B", "P", "k", "K")),
    top_tokens=Maybe(Texts("B", "P", "k", "K")),
    entropy=Maybe(Array("float", "B", "P", "k")),
    kl=Maybe(Array("float", "B", "P", "k")),
    rank=Maybe(Array("int", "B", "P", "k")),
    target_sets=Maybe(Array("int", "B", "P", "S")),
    foils=Maybe(Array("int", "B", "P", "F")),
    lens_change=Maybe(Array("float", "B", "P", "k")),
    readout_kind=Default(Text(READOUT_KINDS)),
    readout_checksum=Maybe(Text()),
)


def _visible(text: str) -> str:
    """Text with its non-printable characters (newlines, tabs) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass
class IGLensResult(JsonDocument, Viewable):
    r"""
    The IG-Lens map for ``B`` sequences, ``P`` attributed positions and ``k`` layers.

    Attributes:

        attributions (Tensor): ``(B, P, k)`` float32. Layer ``j``'s credit
                    ``f(h_{L_j}) - f(h_{L_{j-1}})``. Zero at padding. ``f`` is
                    the target's probability, or with ``target_sets`` and
                    ``foils`` the score ``Σ_{y∈S} p(y) - Σ_{y∈F} p(y)`` (then
                    ``lens``, ``base_prob`` and ``model_prob`` hold that score,
                    in ``[-1, 1]`` with foils).
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
        top_ids (Tensor, optional): ``(B, P, k, K)`` long. The ``K`` most
                    probable tokens of the distribution read out after each
                    layer (the points of ``lens``; at the last layer, the model's
                    own output distribution), most probable first.
        top_probs (Tensor, optional): ``(B, P, k, K)`` float32. Their
                    probabilities.
        top_tokens (list, optional): ``B x P x k x K`` nested lists of strings,
                    ``top_ids`` as text, when a tokenizer was available.
        entropy (Tensor, optional): ``(B, P, k)`` float32. Entropy of each
                    layer's distribution, in nats.
        kl (Tensor, optional): ``(B, P, k)`` float32. ``KL(final ‖ layer)`` in
                    nats: the divergence of the layer's distribution from the
                    model's final one (zero at the last layer), as the tuned
                    lens reports it.
        rank (Tensor, optional): ``(B, P, k)`` long. The 1-based rank of the
                    target in each layer's distribution (1: the layer's top
                    token); with ``target_sets``, of the best-ranked member.
        target_sets (Tensor, optional): ``(B, P, S)`` long, padded with -1. The
                    token sets whose total probability was attributed in place
                    of ``targets`` (which then only label the positions).
        foils (Tensor, optional): ``(B, P, F)`` long, padded with -1. The foils
                    whose probability was subtracted (contrastive targets).
        lens_change (Tensor, optional): ``(B, P, k)`` float32, under a learned
                    readout per layer (``readout_kind`` ``"linear"`` or
                    ``"tuned"``): the part of each credit that is a change of
                    readout at a fixed state; the rest, :attr:`block_part`, is
                    the block's own. ``attributions`` hold their sum, the
                    column's whole term ``f_j(h_{L_j}) - f_{j-1}(h_{L_{j-1}})``,
                    and ``lens`` each point's level under its own readout.
                    None under the logit readout.
        readout_kind (str): ``"logit"`` (the model's readout at every layer),
                    ``"linear"`` or ``"tuned"``.
        readout_checksum (str, optional): The learned readout's checksum
                    (``Translators.checksum()``); None for ``"logit"``.

    The view fields (``top_ids`` ... ``rank``) are all set or all None.
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
    top_ids: Optional[Tensor] = None
    top_probs: Optional[Tensor] = None
    top_tokens: Optional[List[List[List[List[str]]]]] = None
    entropy: Optional[Tensor] = None
    kl: Optional[Tensor] = None
    rank: Optional[Tensor] = None
    target_sets: Optional[Tensor] = None
    foils: Optional[Tensor] = None
    lens_change: Optional[Tensor] = None
    readout_kind: str = "logit"
    readout_checksum: Optional[str] = None

    KIND = "IGLensResult"

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this map's viewer page (see
        :func:`~captum_iglens.viewer._map.map_page`)."""
        return map_page(self)

    @property
    def block_part(self) -> Tensor:
        """``(B, P, k)``: each credit less its lens-change part (the credits
        themselves under the logit readout)."""
        if self.lens_change is None:
            return self.attributions
        return self.attributions - self.lens_change

    # ------------------------------------------------------------ source tokens

    def source_layout(self) -> Optional[SourceLayout]:
        """Where each block's per-source credits are among the columns, for
        ``granularity="source"`` or ``"source_head"`` (else None)."""
        return source_layout(self.layer_names)

    def source_map(self, by_head: bool = False) -> Tensor:
        r"""
        Each block's attention credit split over the source positions, for
        ``granularity="source"`` or ``"source_head"``: how much probability
        block ``l`` gave the target at position ``t`` from the value of source
        ``j`` (summed over its heads, or per head with ``by_head``). With the
        bias and MLP columns it adds up to the block's credit.

        Args:
            by_head (bool, optional): Keep the heads apart (``"source_head"``
                        only). Default: False

        Returns:
            *Tensor* ``(B, P, k, T)``, or ``(B, P, k, H, T)`` with ``by_head``,
            float32, with ``k`` the blocks of :meth:`source_layout`.

        Raises:
            ValueError: If the result has no source columns, or ``by_head``
                without head-resolved ones.
        """
        layout = self.source_layout()
        if layout is None:
            raise ValueError(
                "source_map: this result has no per-source columns; attribute "
                'with granularity="source" (or "source_head")'
            )
        if by_head and layout.n_heads is None:
            raise ValueError(
                "by_head: the heads are summed in this result; attribute with "
                'granularity="source_head"'
            )
        return layout.source_map(self.attributions, by_head)

    def format_sources(self, batch_index: int = 0, *, top: int = 5) -> str:
        r"""
        Per attributed token of one sequence, its ``top`` source tokens (credit
        summed over blocks and heads) and its ``top`` routes, source → block
        (→ head with ``"source_head"``), with their exact credits.

        Args:
            batch_index (int, optional): The sequence. Default: 0.
            top (int, optional): How many of each. Default: 5.

        Returns:
            *str*: two lines per token.

        Raises:
            ValueError: If the result has no source columns.
        """
        layout = self.source_layout()
        if layout is None:
            raise ValueError(
                "format_sources: this result has no per-source columns; attribute "
                'with granularity="source" (or "source_head")'
            )
        if not 0 <= batch_index < self.attributions.shape[0]:
            raise ValueError(f"batch_index: out of range, got {batch_index}")
        rows = self.mask[batch_index].nonzero()[:, 0].tolist()
        labels = self._token_labels(batch_index)
        width = max([5] + [len(labels[r]) for r in rows])
        sources = self.metadata.get("source_tokens")
        return format_sources(
            layout,
            self.attributions[batch_index, rows],
            [labels[r].ljust(width) for r in rows],
            None if sources is None else sources[batch_index],
            top,
        )

    def __post_init__(self) -> None:
        for name in _TENSOR_FIELDS:
            if not isinstance(getattr(self, name), Tensor):
                found = type(getattr(self, name)).__name__
                raise TypeError(f"{name}: expected a tensor, got {found}")
        if self.attributions.dim() != 3:
            raise ValueError(
                "attributions: expected shape (B, P, k), got "
                f"{tuple(self.attributions.shape)}"
            )
        b, p, k = self.attributions.shape
        expected = {"lens": (b, p, k), "positions": (p,)}
        for name in _TENSOR_FIELDS:
            shape = expected.get(name, (b, p) if name != "attributions" else (b, p, k))
            value = getattr(self, name)
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"{name}: expected shape {shape} to match attributions "
                    f"(B={b}, P={p}, k={k}), got {tuple(value.shape)}"
                )
            want = _DTYPES.get(name)
            if want is not None and value.dtype != want:
                raise TypeError(f"{name}: expected dtype {want}, got {value.dtype}")
            if want is None and not value.is_floating_point():
                raise TypeError(f"{name}: expected a float tensor, got {value.dtype}")
            if want is None and not torch.isfinite(value).all():
                raise ValueError(f"{name}: contains NaN or inf")
        if (self.targets < 0).any() or (self.positions < 0).any():
            raise ValueError("targets/positions: expected non-negative ids")
        self._check_optional(b, p, k)
        low = 0.0 if self.foils is None else -1.0
        for name in ("lens", "base_prob", "model_prob"):
            value = getattr(self, name)
            if ((value < low - _PROB_SLACK) | (value > 1 + _PROB_SLACK)).any():
                raise ValueError(
                    f"{name}: probabilities must lie in [{low:g}, 1]"
                    + ("" if self.foils is None else " (a contrastive score)")
                )
        if not (
            isinstance(self.layer_names, list)
            and len(self.layer_names) == k
            and all(isinstance(n, str) for n in self.layer_names)
        ):
            raise ValueError(
                f"layer_names: expected {k} strings, one per credit column, got "
                f"{self.layer_names!r}"
            )
        if self.method not in ESTIMATOR_NAMES:
            raise ValueError(
                f"method: expected one of {list(ESTIMATOR_NAMES)}, got {self.method!r}"
            )
        if (
            isinstance(self.n_steps, bool)
            or not isinstance(self.n_steps, int)
            or (self.n_steps < 1)
        ):
            raise ValueError(f"n_steps: expected an int >= 1, got {self.n_steps!r}")
        if self.tokens is not None and not (
            isinstance(self.tokens, list)
            and len(self.tokens) == b
            and all(
                isinstance(row, list)
                and len(row) == p
                and all(isinstance(t, str) for t in row)
                for row in self.tokens
            )
        ):
            raise ValueError(f"tokens: expected {b} lists of {p} strings")
        if not isinstance(self.metadata, dict):
            raise TypeError(f"metadata: expected a dict, got {self.metadata!r}")
        self._check_readout()
        change = self.model_prob - self.base_prob
        mismatch = (self.attributions.sum(-1) - change - self.delta).abs()
        if (mismatch > _DELTA_SLACK)[self.mask].any():
            raise ValueError(
                "delta: does not equal Σ attributions − (model_prob − base_prob) "
                f"(off by up to {mismatch[self.mask].max().item():.3g})"
            )

    def _check_readout(self) -> None:
        """The readout's kind and checksum, and the lens-change parts exactly
        when the readout is learned."""
        if self.readout_kind not in READOUT_KINDS:
            raise ValueError(
                f"readout_kind: expected one of {list(READOUT_KINDS)}, got "
                f"{self.readout_kind!r}"
            )
        learned = self.readout_kind != "logit"
        if learned != (self.lens_change is not None) or learned != isinstance(
            self.readout_checksum, str
        ):
            raise ValueError(
                "lens_change/readout_checksum: expected both under a learned "
                f"readout and neither under the logit readout (readout_kind "
                f"{self.readout_kind!r})"
            )

    def _check_optional(self, b: int, p: int, k: int) -> None:
        """The views and token sets: types, shapes and ranges."""
        present = [name for name in _VIEW_FIELDS if getattr(self, name) is not None]
        if present and len(present) != len(_VIEW_FIELDS):
            raise ValueError(
                f"{', '.join(_VIEW_FIELDS)}: expected all or none, got only "
                f"{', '.join(present)}"
            )
        top = -1 if self.top_ids is None else self.top_ids.shape[-1]
        shapes = {"top_ids": (b, p, k, top), "top_probs": (b, p, k, top)}
        for name in _OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, Tensor):
                raise TypeError(f"{name}: expected a tensor or None")
            want = shapes.get(name, (b, p, k))
            if name in _SET_FIELDS:  # any set size S >= 1
                want = (b, p, max(1, value.shape[-1]) if value.dim() == 3 else 1)
            if tuple(value.shape) != want:
                raise ValueError(
                    f"{name}: expected shape {want} (B={b}, P={p}, k={k}), got "
                    f"{tuple(value.shape)}"
                )
            dtype = _DTYPES.get(name, torch.float32)
            if value.dtype != dtype:
                raise TypeError(f"{name}: expected dtype {dtype}, got {value.dtype}")
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise ValueError(f"{name}: contains NaN or inf")
        if present:
            if top < 1:
                raise ValueError("top_ids: expected at least one token per layer")
            probs = self._view("top_probs")
            if ((probs < -_PROB_SLACK) | (probs > 1 + _PROB_SLACK)).any():
                raise ValueError("top_probs: probabilities must lie in [0, 1]")
            if (self._view("top_ids") < 0).any() or (self._view("rank") < 1).any():
                raise ValueError("top_ids/rank: expected ids >= 0 and ranks >= 1")
            for name in ("entropy", "kl"):
                if (getattr(self, name) < -_PROB_SLACK).any():
                    raise ValueError(f"{name}: expected non-negative nats")
        for name in _SET_FIELDS:
            value = getattr(self, name)
            if value is not None and (value < PAD).any():
                raise ValueError(f"{name}: expected token ids, padded with {PAD}")
        if self.top_tokens is not None:
            shape = (b, p, k, top)
            found = _nested_shape(self.top_tokens, 4)
            if (
                self.top_ids is None
                or found is None
                or found != shape[: len(found)]
                or (len(found) < 4 and found[-1] != 0)
            ):
                raise ValueError(
                    f"top_tokens: expected {b} x {p} x {k} x {top} nested lists of "
                    "strings, with top_ids"
                )

    @property
    def has_views(self) -> bool:
        """Whether the result holds each layer's top tokens, entropy, KL, rank."""
        return self.top_ids is not None

    def _view(self, name: str) -> Tensor:
        """A view field (``top_ids``, ``rank``, ...), refused without views."""
        value = getattr(self, name)
        if value is None:
            raise ValueError("result: no views; attribute with top_k >= 1")
        return value

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
        lines += self._lens_change_lines(
            batch_index, rows, labels, shown, token_w, col_w
        )
        lines.append(
            f"completeness: max |Σ - Δp| = {residual:.2e} over {len(rows)} tokens"
        )
        return "\n".join(lines)

    def _lens_change_lines(
        self,
        batch_index: int,
        rows: List[int],
        labels: List[str],
        shown: List[int],
        token_w: int,
        col_w: int,
    ) -> List[str]:
        """Under a learned readout: the lens-change part of each shown credit,
        and its sum per token (nothing under the logit readout)."""
        if self.lens_change is None:
            return []
        parts = self.lens_change[batch_index]
        lines = [
            f"lens-change part ({self.readout_kind} readout; in the credits above, "
            "block part = credit - lens change):"
        ]
        for r in rows:
            cells = [f"{labels[r]:<{token_w}}"]
            cells += [f"{parts[r, j]:>+{col_w}.3f}" for j in shown]
            cells.append(f"{'':>8} {parts[r].sum():>+8.4f}")
            lines.append(" ".join(cells))
        return lines

    def format_views(self, batch_index: int = 0, *, width: int = 100) -> str:
        r"""
        What each layer predicts, for one sequence (a result with views): a row
        per attributed token with each layer's top-1 token (``*`` where it is
        the target), then each token's rank of the target per layer and the
        model's own top ``K`` tokens.

        Args:

            batch_index (int, optional): The sequence to show. Default: 0.
            width (int, optional): Characters available; when every layer does
                        not fit, evenly spaced layers (always the last) are shown
                        and a note says so. Default: 100.

        Returns:
            *str*: the table.
        """
        if not self.has_views:
            raise ValueError("result: no views; attribute with top_k >= 1")
        if not 0 <= batch_index < self.attributions.shape[0]:
            raise ValueError(
                f"batch_index: expected 0 <= batch_index < "
                f"{self.attributions.shape[0]}, got {batch_index}"
            )
        b, k = batch_index, len(self.layer_names)
        rows = self.mask[b].nonzero()[:, 0].tolist()
        labels = self._token_labels(b)
        token_w = max([5] + [len(labels[r]) for r in rows])
        col_w = max(10, 1 + max(len(n) for n in self.layer_names))
        fits = max(2, (width - token_w - 1) // (col_w + 1))
        shown = list(range(k))
        if fits < k:
            shown = sorted({round(i * (k - 1) / (fits - 1)) for i in range(fits)})
        head = [f"{'token':<{token_w}}"]
        head += [f"{'L' + self.layer_names[j]:>{col_w}}" for j in shown]
        lines = ["what each layer predicts (top-1 token; * = the target)"]
        lines.append(" ".join(head))
        for r in rows:
            cells = [f"{labels[r]:<{token_w}}"]
            for j in shown:
                text = self._top_label(b, r, j, 0, col_w - 1)
                mark = "*" if int(self._view("rank")[b, r, j]) == 1 else ""
                cells.append(f"{text + mark:>{col_w}}")
            lines.append(" ".join(cells))
        lines.append("rank of the target (1 = top)")
        lines.append(" ".join(head))
        for r in rows:
            cells = [f"{labels[r]:<{token_w}}"]
            cells += [f"{int(self._view('rank')[b, r, j]):>{col_w}}" for j in shown]
            lines.append(" ".join(cells))
        if len(shown) < k:
            lines.append(f"(showing {len(shown)} of {k} layers, evenly spaced)")
        top = self._view("top_ids").shape[-1]
        lines.append(f"the model's own top {top} (last layer), with probabilities")
        for r in rows:
            probs = self._view("top_probs")[b, r, -1].tolist()
            best = ", ".join(
                f"{self._top_label(b, r, k - 1, i, 16)} {probs[i]:.3f}"
                for i in range(top)
            )
            lines.append(f"{labels[r]:<{token_w}} {best}")
        return "\n".join(lines)

    def _top_label(self, b: int, p: int, j: int, i: int, width: int) -> str:
        """The ``i``-th top token of layer ``j`` as a short quoted label (so
        that spaces show), cut to ``width`` characters."""
        if self.top_tokens is None:
            return f"#{int(self._view('top_ids')[b, p, j, i])}"[:width]
        text = repr(self.top_tokens[b][p][j][i])
        return text if len(text) <= width else text[: width - 2] + "…" + text[-1]

    def _view_cells(self, b: int, p: int, j: int) -> List[Any]:
        """The CSV cells of the views of one (sequence, position, layer)."""
        if not self.has_views:
            return []
        top_probs = self._view("top_probs")[b, p, j].tolist()
        cells: List[Any] = [
            json.dumps(self._view("top_ids")[b, p, j].tolist()),
            json.dumps([round(x, 6) for x in top_probs]),
        ]
        if self.top_tokens is not None:
            cells.append(json.dumps(self.top_tokens[b][p][j]))
        cells += [
            float(self._view("entropy")[b, p, j]),
            float(self._view("kl")[b, p, j]),
            int(self._view("rank")[b, p, j]),
        ]
        return cells

    def _token_labels(self, batch_index: int) -> List[str]:
        if self.tokens is not None:
            return [_visible(t)[:16] for t in self.tokens[batch_index]]
        return [f"#{int(t)}" for t in self.targets[batch_index]]

    def with_tokens(self, tokenizer: Any) -> "IGLensResult":
        r"""A copy whose ``tokens`` are the targets' text, decoded one token at a
        time by ``tokenizer`` (for tables, CSV and plots).

        Args:

            tokenizer (PreTrainedTokenizerBase): Any tokenizer with ``decode``.

        Returns:
            *IGLensResult*: the same map with ``tokens`` set.
        """
        tokens = [decode_tokens(tokenizer, row.tolist()) for row in self.targets]
        return replace(self, tokens=tokens)

    def to(self, device: Union[str, torch.device]) -> "IGLensResult":
        """A copy with every tensor on ``device``."""
        moved = {
            name: getattr(self, name).to(device)
            for name in _TENSOR_FIELDS + _OPTIONAL_FIELDS
            if getattr(self, name) is not None
        }
        return replace(self, **moved)

    def select(self, batch: Index = None, positions: Index = None) -> "IGLensResult":
        r"""
        A result for some sequences and some attributed positions.

        Args:

            batch (int, slice, list[int] or Tensor, optional): Sequences to keep
                        (an int keeps the dimension). Default: all.
            positions (int, slice, list[int] or Tensor, optional): Indices into
                        the attributed positions (the ``P`` axis, not token
                        positions in the sequence). Default: all.

        Returns:
            *IGLensResult* with the same layers, method and metadata.
        """
        rows = _index(batch, self.attributions.shape[0], "batch")
        cols = _index(positions, self.attributions.shape[1], "positions")
        picked: Dict[str, Any] = {}
        for name in _TENSOR_FIELDS + _OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            picked[name] = value[cols] if name == "positions" else value[rows][:, cols]
        for name in ("tokens", "top_tokens"):
            nested = getattr(self, name)
            if nested is not None:
                picked[name] = [
                    [nested[r][c] for c in cols.tolist()] for r in rows.tolist()
                ]
        return replace(self, metadata=dict(self.metadata), **picked)

    @classmethod
    def empty(
        cls, layer_names: Sequence[str], method: str, n_steps: int
    ) -> "IGLensResult":
        r"""A one-sequence result with no attributed positions (an empty answer)."""
        k = len(layer_names)
        return cls(
            attributions=torch.zeros(1, 0, k),
            lens=torch.zeros(1, 0, k),
            base_prob=torch.zeros(1, 0),
            model_prob=torch.zeros(1, 0),
            delta=torch.zeros(1, 0),
            targets=torch.zeros(1, 0, dtype=torch.long),
            positions=torch.zeros(0, dtype=torch.long),
            mask=torch.zeros(1, 0, dtype=torch.bool),
            layer_names=list(layer_names),
            method=method,
            n_steps=n_steps,
        )

    @classmethod
    def cat(cls, results: Sequence["IGLensResult"]) -> "IGLensResult":
        r"""
        Results of the same positions, layers and settings, stacked along the
        batch. Metadata is taken from the first.

        Args:

            results (list[IGLensResult]): At least one.

        Returns:
            *IGLensResult* with ``B = Σ B_i``.
        """
        if not results:
            raise ValueError("results: expected at least one result")
        first = results[0]
        for i, other in enumerate(results[1:], 1):
            for name in (
                "layer_names",
                "method",
                "n_steps",
                "readout_kind",
                "readout_checksum",
            ):
                if getattr(other, name) != getattr(first, name):
                    raise ValueError(
                        f"results[{i}]: {name} {getattr(other, name)!r} differs from "
                        f"results[0]'s {getattr(first, name)!r}"
                    )
            if not torch.equal(other.positions, first.positions):
                raise ValueError(f"results[{i}]: attributed positions differ")
            for name in ("tokens", "top_tokens", *_OPTIONAL_FIELDS):
                if (getattr(other, name) is None) != (getattr(first, name) is None):
                    raise ValueError(
                        f"results[{i}]: {name} given for some results only"
                    )
            if first.has_views and (
                other._view("top_ids").shape[-1] != first._view("top_ids").shape[-1]
            ):
                raise ValueError(f"results[{i}]: top_k differs from results[0]'s")
        stacked: Dict[str, Any] = {
            name: (
                first.positions
                if name == "positions"
                else torch.cat([getattr(r, name) for r in results])
            )
            for name in _TENSOR_FIELDS + _VIEW_FIELDS + _READOUT_FIELDS
            if getattr(first, name) is not None
        }
        for name in _SET_FIELDS:  # ragged sets: pad to the widest
            if getattr(first, name) is not None:
                width = max(getattr(r, name).shape[-1] for r in results)
                stacked[name] = torch.cat(
                    [_pad_last(getattr(r, name), width) for r in results]
                )
        for name in ("tokens", "top_tokens"):
            if getattr(first, name) is not None:
                stacked[name] = [row for r in results for row in getattr(r, name)]
        return replace(first, metadata=dict(first.metadata), **stacked)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary of every field (tensors as nested lists)."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "IGLensResult":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`IGLENS_SCHEMA`)."""
        return cls(**IGLENS_SCHEMA.load(data))

    def to_csv(self, path: Union[str, Path]) -> None:
        """Write a long-format CSV: batch, position, token, layer, credit, lens;
        with ``target_sets``/``foils``, those sets (JSON lists of ids); with
        views, ``top_ids``, ``top_probs`` (and ``top_tokens``) as JSON lists, and
        ``entropy``, ``kl``, ``rank``."""
        check_writable(path, "path")
        header = ["batch", "position", "token", "layer", "credit", "lens"]
        sets = [name for name in _SET_FIELDS if getattr(self, name) is not None]
        views = ["top_ids", "top_probs"] if self.has_views else []
        views += ["top_tokens"] if self.top_tokens is not None else []
        views += ["entropy", "kl", "rank"] if self.has_views else []
        lines: List[List[Any]] = [header + sets + views]
        for b in range(self.attributions.shape[0]):
            labels = self.tokens[b] if self.tokens is not None else None
            for p in self.mask[b].nonzero()[:, 0].tolist():
                token = labels[p] if labels else int(self.targets[b, p])
                given = [
                    json.dumps([i for i in getattr(self, n)[b, p].tolist() if i != PAD])
                    for n in sets
                ]
                for j, name in enumerate(self.layer_names):
                    line = [
                        b,
                        int(self.positions[p]),
                        token,
                        name,
                        float(self.attributions[b, p, j]),
                        float(self.lens[b, p, j]),
                        *given,
                    ]
                    lines.append(line + self._view_cells(b, p, j))
        buffer = io.StringIO(newline="")
        csv.writer(buffer).writerows(lines)
        write_atomic(path, buffer.getvalue())


def _pad_last(value: Tensor, width: int) -> Tensor:
    """``value`` ``(..., S)`` padded with ``PAD`` to ``(..., width)``."""
    return torch.nn.functional.pad(value, (0, width - value.shape[-1]), value=PAD)


def _nested_shape(value: Any, depth: int) -> Optional[tuple]:
    """The shape of a rectangular nested list of strings ``depth`` deep, or None."""
    if depth == 0:
        return () if isinstance(value, str) else None
    if not isinstance(value, list):
        return None
    inner = {_nested_shape(item, depth - 1) for item in value}
    if len(inner) > 1 or None in inner:
        return None
    if not value:
        return (0,)
    return (len(value),) + (inner.pop() or ())


def _index(index: Index, size: int, name: str) -> Tensor:
    """An index along one axis as a long tensor of positions in ``[0, size)``."""
    if index is None:
        return torch.arange(size)
    if isinstance(index, slice):
        return torch.arange(size)[index]
    if isinstance(index, bool):
        raise TypeError(f"{name}: expected an int, slice or list of ints, got a bool")
    picked = torch.as_tensor([index] if isinstance(index, int) else index)
    if picked.dtype not in (torch.int64, torch.int32) and picked.numel():
        raise TypeError(f"{name}: expected an int, slice or list of ints")
    picked = picked.long().reshape(-1)
    if ((picked < -size) | (picked >= size)).any():
        raise ValueError(f"{name}: indices must lie in [-{size}, {size})")
    return picked % size if size else picked

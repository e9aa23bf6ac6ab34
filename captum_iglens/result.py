r"""The token-by-layer result of IG-Lens: checked on construction (against
:data:`IGLENS_SCHEMA`, the declaration its files are loaded with), sliced,
concatenated, saved and loaded. Its tables and CSV are written by
:mod:`captum_iglens._result_tables` and :mod:`captum_iglens._result_csv`; the
result keeps one-line methods that call them (``format_table``, ``to_csv``...),
as Captum's result objects keep theirs, so that a user needs no other import."""

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Union

import torch
from torch import Tensor

import captum_iglens._result_csv as _result_csv
import captum_iglens._result_tables as _result_tables
from captum_iglens._utils.schema import (
    ROUNDING,
    Array,
    Default,
    Integer,
    Maybe,
    Record,
    Text,
    Texts,
)
from captum_iglens._utils.registry import Home, imported
from captum_iglens._utils.serialization import JsonDocument, plain
from captum_iglens._utils.source_columns import SourceLayout, source_layout
from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.onset import DEFAULT_ONSET_RULE, onset_layers
from captum_iglens.readout.scores import PAD
from captum_iglens.viewer import Viewable
from captum_iglens.viewer._map import map_page

#: The views of each layer's distribution (``top_k >= 1``): all set or none.
_VIEW_FIELDS = ("top_ids", "top_probs", "entropy", "kl", "rank")
#: What was attributed in place of the single target (ragged: padded with PAD).
_SET_FIELDS = ("target_sets", "foils")
#: The fields that hold one list of strings per sequence and position.
_TEXT_FIELDS = ("tokens", "top_tokens")
# |Σ credits − Δp − delta|: summation order only.
_DELTA_SLACK = 1e-3

Index = Union[None, int, slice, Sequence[int], Tensor]

#: What an :class:`IGLensResult` holds, one declaration per field (see
#: :mod:`captum_iglens._utils.schema`), checked when a result is built and when
#: a file loads: ``B`` sequences, ``P`` positions, ``k`` layers, ``K`` top
#: tokens, ``S`` set members, ``F`` foils. Sizes are set by the first field that
#: shows them, so the fields that name them come first. ``levels`` is stored
#: under its first name, ``"lens"``, so that files keep one format.
IGLENS_SCHEMA = Record(
    positive=("K", "S", "F"),
    stored_as={"levels": "lens"},
    layer_names=Texts("k", nonempty=True),
    targets=Array("int", "B", "P", low=0),
    positions=Array("int", "P", low=0),
    mask=Array("bool", "B", "P"),
    attributions=Array("float", "B", "P", "k"),
    levels=Array("float", "B", "P", "k"),
    base_prob=Array("float", "B", "P"),
    model_prob=Array("float", "B", "P"),
    delta=Array("float", "B", "P"),
    method=Text(nonempty=True),
    n_steps=Integer(low=1),
    tokens=Maybe(Texts("B", "P")),
    metadata=Default(Record(open=True, source_tokens=Maybe(Texts("B", "T")))),
    top_ids=Maybe(Array("int", "B", "P", "k", "K", low=0)),
    top_probs=Maybe(Array("float", "B", "P", "k", "K", low=0, high=1)),
    top_tokens=Maybe(Texts("B", "P", "k", "K")),
    entropy=Maybe(Array("float", "B", "P", "k", low=0)),
    kl=Maybe(Array("float", "B", "P", "k", low=0)),
    rank=Maybe(Array("int", "B", "P", "k", low=1)),
    target_sets=Maybe(Array("int", "B", "P", "S", low=PAD)),
    foils=Maybe(Array("int", "B", "P", "F", low=PAD)),
    lens_change=Maybe(Array("float", "B", "P", "k")),
    credit_error=Maybe(Array("float", "B", "P", "k", low=0)),
    readout_kind=Default(Text(nonempty=True)),
    readout_checksum=Maybe(Text()),
    path=Default(Text(nonempty=True)),
)
#: Fields added after files were first written: written only where they differ
#: from their default, so that a file of a run that does not use them is the
#: same as before they existed.
_WRITTEN_IF_SET = ("path",)
#: The tensor fields, each ``(B, P, ...)`` but ``positions`` ``(P,)``.
_TENSOR_FIELDS = IGLENS_SCHEMA.fields_of(Array)


@dataclass
class IGLensResult(JsonDocument, Viewable):
    r"""
    The IG-Lens map for ``B`` sequences, ``P`` attributed positions and ``k`` layers.

    Attributes:

        attributions (Tensor): ``(B, P, k)`` float32. Layer ``j``'s credit
                    ``f(h_{L_j}) - f(h_{L_{j-1}})``. Zero at padding. ``f`` is
                    the target's probability, or with ``target_sets`` and
                    ``foils`` the score ``Σ_{y∈S} p(y) - Σ_{y∈F} p(y)`` (then
                    ``levels``, ``base_prob`` and ``model_prob`` hold that score,
                    in ``[-1, 1]`` with foils).
        levels (Tensor): ``(B, P, k)`` float32. The level ``f(h_{L_j})``: the
                    target's probability read out of each chosen layer by the
                    lens (the per-layer readout). Saved under the key
                    ``"lens"``.
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
        method (str): The estimator used (its name in
                    :data:`~captum_iglens.attr.estimators.ESTIMATORS`; a file
                    with a name not registered there is refused on load).
        n_steps (int): The number of steps used by the estimator.
        tokens (list[list[str]], optional): ``B`` lists of ``P`` strings, the
                    target tokens as text, when a tokenizer was available.
        metadata (dict): Free-form settings (prompt, model, versions...); must be
                    JSON-serialisable.
        top_ids (Tensor, optional): ``(B, P, k, K)`` long. The ``K`` most
                    probable tokens of the distribution read out after each
                    layer (the points of ``levels``; at the last layer, the model's
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
                    and ``levels`` each point's level under its own readout.
                    None under the logit readout.
        credit_error (Tensor, optional): ``(B, P, k)`` float32: a bound on
                    each credit's quadrature error, where the estimator gives
                    one (``"adaptive"``, block and sublayer maps); 0 at padding.
        readout_kind (str): ``"logit"`` (the model's readout at every layer),
                    ``"linear"``, ``"tuned"``, or the ``kind`` of any other
                    :class:`~captum_iglens.readout.interface.LayerwiseReadout`.
        readout_checksum (str, optional): The readout's checksum (e.g.
                    ``Translators.checksum()``); None for ``"logit"``.
        path (str): The integration path (its name in
                    :data:`~captum_iglens.attr.paths.PATHS`):
                    ``"telescoping"`` (each column between consecutive path
                    points; the default) or ``"joint"`` (every column's update
                    scaled together). Only the default path has lens-change
                    parts other than 0 (a readout that differs along it).

    The view fields (``top_ids`` ... ``rank``) are all set or all None.
    """

    attributions: Tensor
    levels: Tensor
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
    credit_error: Optional[Tensor] = None
    readout_kind: str = "logit"
    readout_checksum: Optional[str] = None
    path: str = "telescoping"

    KIND = "IGLensResult"

    @property
    def trajectory_caption(self) -> str:
        """What a token's trajectory (its lens level beside its cumulative
        credit) shows on this map's path, as the path says."""
        return str(names_of("path")[self.path].trajectory_caption)

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
        return _result_tables.format_sources(self, batch_index, top)

    def __post_init__(self) -> None:
        # Types, dtypes, shapes and bounds: as declared in IGLENS_SCHEMA.
        IGLENS_SCHEMA.check({f.name: getattr(self, f.name) for f in fields(self)})
        present = [name for name in _VIEW_FIELDS if getattr(self, name) is not None]
        if present and len(present) != len(_VIEW_FIELDS):
            raise ValueError(
                f"{', '.join(_VIEW_FIELDS)}: expected all or none, got only "
                f"{', '.join(present)}"
            )
        if self.top_tokens is not None and self.top_ids is None:
            raise ValueError("top_tokens: expected only with top_ids, their ids")
        self._check_readout()
        low = 0.0 if self.foils is None else -1.0
        for name in ("levels", "base_prob", "model_prob"):
            value = getattr(self, name)
            if ((value < low - ROUNDING) | (value > 1 + ROUNDING)).any():
                raise ValueError(
                    f"{IGLENS_SCHEMA.label(name)}: probabilities must lie in "
                    f"[{low:g}, 1]"
                    + ("" if self.foils is None else " (a contrastive score)")
                )
        change = self.model_prob - self.base_prob
        mismatch = (self.attributions.sum(-1) - change - self.delta).abs()
        if (mismatch > _DELTA_SLACK)[self.mask].any():
            raise ValueError(
                "delta: does not equal Σ attributions − (model_prob − base_prob) "
                f"(off by up to {mismatch[self.mask].max().item():.3g})"
            )

    def _check_readout(self) -> None:
        """The lens-change parts and the checksum exactly when the readout is
        learned."""
        learned = self.learned_readout
        if learned != (self.lens_change is not None) or learned != isinstance(
            self.readout_checksum, str
        ):
            raise ValueError(
                "lens_change/readout_checksum: expected both under a learned "
                f"readout and neither under the logit readout (readout_kind "
                f"{self.readout_kind!r})"
            )
        _check_lens_path(self.path, self.lens_change, self.readout_kind)
        settings = self.metadata.get("settings")
        recorded = settings.get("path") if isinstance(settings, dict) else None
        if recorded is not None and recorded != self.path:
            raise ValueError(
                f"path: {self.path!r} differs from metadata.settings.path {recorded!r}"
            )

    @property
    def learned_readout(self) -> bool:
        """Whether a learned readout per layer (not the default kind) read it."""
        return self.readout_kind != type(self).readout_kind

    @property
    def has_views(self) -> bool:
        """Whether the result holds each layer's top tokens, entropy, KL, rank."""
        return self.top_ids is not None

    @property
    def total(self) -> Tensor:
        """``(B, P)``: the sum of the layer credits, ``Σ_j attributions``
        (summed in float64: credits that cancel keep the sum exact)."""
        return self.attributions.double().sum(-1).to(self.attributions.dtype)

    def onset(self, frac: float = 0.5, rule: str = DEFAULT_ONSET_RULE) -> Tensor:
        r"""
        The onset layer ``L*`` of every token under ``rule``
        (:data:`~captum_iglens.onset.ONSET_RULES`): by default (``"abs"``) the
        earliest chosen layer at which the cumulative ``|credit|`` reaches
        ``frac`` of the token's total ``|credit|``; ``"positive"``, the same on
        ``max(credit, 0)`` (where ``frac`` of the probability that is built has
        been built); ``"argmax"``, the layer with the largest credit.

        Args:

            frac (float, optional): Fraction of the mass of the cumulative
                        rules, in ``(0, 1]``. Default: 0.5.
            rule (str, optional): ``"abs"``, ``"positive"`` or ``"argmax"``.
                        Default: :data:`~captum_iglens.onset.DEFAULT_ONSET_RULE`.

        Returns:
            *Tensor* of shape ``(B, P)``, long: an index into ``layer_names``, or
            ``-1`` where the rule finds no onset (no credit at all, or none
            positive under ``"positive"``) or the position is padding.

        Raises:
            ValueError: If ``rule`` is not a rule's name or ``frac`` is not in
                ``(0, 1]``.
        """
        index = onset_layers(self.attributions, frac, rule)
        return torch.where(self.mask, index, -1)

    # ----------------------------------------------------------- tables and CSV

    def format_table(
        self,
        batch_index: int = 0,
        *,
        width: int = 100,
        onset_frac: float = 0.5,
        companion: Optional["IGLensResult"] = None,
    ) -> str:
        r"""
        A plain-text table of one sequence: a row per attributed token with the
        layer credits, the level at the last layer, ``Σ``, ``Δp``, the model's
        probability and the onset layer; under a learned readout, then each
        credit's lens-change part.

        Args:

            batch_index (int, optional): The sequence to show. Default: 0.
            width (int, optional): Characters available. When every layer does
                        not fit, the layers with the largest ``|credit|`` are shown
                        (in order) and a note says so; ``Σ`` always includes every
                        layer. Default: 100.
            onset_frac (float, optional): As in :meth:`onset`. Default: 0.5.
            companion (IGLensResult, optional): A map of the same tokens on
                        another path (e.g. the joint block map beside a
                        telescoping one): the table then shows the onset of
                        each, headed by its path. Default: None

        Returns:
            *str*: the table, with a final completeness line
            ``max |Σ - Δp|``.

        Raises:
            ValueError: If ``companion`` holds other tokens.
        """
        return _result_tables.format_table(
            self, batch_index, width, onset_frac, companion
        )

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
        return _result_tables.format_views(self, batch_index, width)

    def to_csv(self, path: Union[str, Path]) -> None:
        r"""
        Writes a long-format CSV, atomically, one row per (sequence, attributed
        position, layer): ``batch``, ``position``, ``token``, ``layer``,
        ``credit``, ``lens`` (the level); with ``target_sets``/``foils``, those
        sets (JSON lists of ids); with views, ``top_ids``, ``top_probs`` (and
        ``top_tokens``) as JSON lists, and ``entropy``, ``kl``, ``rank``.

        Args:

            path (str or Path): The file to write.
        """
        _result_csv.write_csv(self, path)

    # --------------------------------------------------------- slicing, joining

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
            for name in _TENSOR_FIELDS
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
            *IGLensResult* with the same layers, method and metadata (the
            ``source_tokens`` of the kept sequences).
        """
        rows = _index(batch, self.attributions.shape[0], "batch").tolist()
        cols = _index(positions, self.attributions.shape[1], "positions")
        picked: Dict[str, Any] = {}
        for name in _TENSOR_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            picked[name] = value[cols] if name == "positions" else value[rows][:, cols]
        for name in _TEXT_FIELDS:
            nested = getattr(self, name)
            if nested is not None:
                picked[name] = [[nested[r][c] for c in cols.tolist()] for r in rows]
        metadata = dict(self.metadata)
        if metadata.get("source_tokens") is not None:
            metadata["source_tokens"] = [metadata["source_tokens"][r] for r in rows]
        return replace(self, metadata=metadata, **picked)

    @classmethod
    def empty(
        cls,
        layer_names: Sequence[str],
        method: str,
        n_steps: int,
        path: Optional[str] = None,
    ) -> "IGLensResult":
        r"""A one-sequence result with no attributed positions (an empty answer),
        on the path named ``path`` (None: the default path)."""
        k = len(layer_names)
        return cls(
            attributions=torch.zeros(1, 0, k),
            levels=torch.zeros(1, 0, k),
            base_prob=torch.zeros(1, 0),
            model_prob=torch.zeros(1, 0),
            delta=torch.zeros(1, 0),
            targets=torch.zeros(1, 0, dtype=torch.long),
            positions=torch.zeros(0, dtype=torch.long),
            mask=torch.zeros(1, 0, dtype=torch.bool),
            layer_names=list(layer_names),
            method=method,
            n_steps=n_steps,
            path=cls.path if path is None else path,
        )

    @classmethod
    def cat(cls, results: Sequence["IGLensResult"]) -> "IGLensResult":
        r"""
        Results of the same positions, layers and settings, stacked along the
        batch. Metadata is taken from the first (with every result's
        ``source_tokens`` when the first has them).

        Args:

            results (list[IGLensResult]): At least one.

        Returns:
            *IGLensResult* with ``B = Σ B_i``.
        """
        if not results:
            raise ValueError("results: expected at least one result")
        first = results[0]
        for i, other in enumerate(results[1:], 1):
            _check_joinable(first, other, f"results[{i}]")
        stacked: Dict[str, Any] = {
            name: (
                first.positions
                if name == "positions"
                else torch.cat([getattr(r, name) for r in results])
            )
            for name in _TENSOR_FIELDS
            if getattr(first, name) is not None and name not in _SET_FIELDS
        }
        for name in _SET_FIELDS:  # ragged sets: pad to the widest
            if getattr(first, name) is not None:
                width = max(getattr(r, name).shape[-1] for r in results)
                stacked[name] = torch.cat(
                    [_pad_last(getattr(r, name), width) for r in results]
                )
        for name in _TEXT_FIELDS:
            if getattr(first, name) is not None:
                stacked[name] = [row for r in results for row in getattr(r, name)]
        metadata = dict(first.metadata)
        if metadata.get("source_tokens") is not None:
            metadata["source_tokens"] = [
                row for r in results for row in r.metadata["source_tokens"]
            ]
        return replace(first, metadata=metadata, **stacked)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary of every field (tensors as nested
        lists), keyed as the file stores them (``levels`` as ``"lens"``)."""
        values = {
            f.name: plain(getattr(self, f.name))
            for f in fields(self)
            if f.name not in _WRITTEN_IF_SET or getattr(self, f.name) != f.default
        }
        return IGLENS_SCHEMA.dump(values)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "IGLensResult":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`IGLENS_SCHEMA`), and the names a file gives (method, path, columns)."""
        values = IGLENS_SCHEMA.load(data)
        _check_names(values)
        return cls(**values)


#: The registries whose names a result holds, by field, as the registries hold
#: their entries (:class:`~captum_iglens._utils.registry.Home`): imported on
#: first use, since results sit below the attribution package.
_NAMES = {
    "method": Home("attr.estimators:ESTIMATORS"),
    "path": Home("attr.paths:PATHS"),
}


def names_of(key: str) -> Any:
    r"""The registry of the names a result holds in the field ``key``
    (``"method"``: :data:`~captum_iglens.attr.estimators.ESTIMATORS`,
    ``"path"``: :data:`~captum_iglens.attr.paths.PATHS`)."""
    return imported("captum_iglens", _NAMES[key].where)


def _check_lens_path(path: str, lens_change: Optional[Tensor], kind: str) -> None:
    r"""Lens-change parts other than 0 only on a path that declares
    ``learned_readout`` (the path's registry entry decides, not its name)."""
    changes = lens_change is not None and bool(lens_change.ne(0).any())
    paths = names_of("path")
    if changes and path in paths and not paths[path].learned_readout:
        splitting = [name for name, entry in paths.items() if entry.learned_readout]
        raise ValueError(
            f"path: {path!r} has no lens-change parts (readout_kind {kind!r}: only "
            f"{splitting} split a readout that differs along the path); expected "
            "lens_change all 0"
        )


def _check_names(values: Dict[str, Any]) -> None:
    r"""The names a result file gives, checked on load: ``method`` and ``path``
    in their registries (:func:`names_of`, where a new one is registered), and
    ``layer_names`` each once (a column per name)."""
    for key in _NAMES:
        name, registry = values.get(key), names_of(key)
        if name is not None and name not in registry:  # None: the default path
            raise ValueError(
                f"{key}: expected one of {list(registry)} (or a name registered "
                f"there before the load), got {name!r}"
            )
    seen: Set[str] = set()
    for name in values["layer_names"]:
        if name in seen:
            raise ValueError(
                f"layer_names: {name!r} names two columns; expected each name once"
            )
        seen.add(name)


def _check_joinable(first: IGLensResult, other: IGLensResult, at: str) -> None:
    """Refuses to stack ``other`` under ``first``: other layers or settings,
    other positions, fields given for one only, another ``top_k``."""
    settings = (
        "layer_names",
        "method",
        "n_steps",
        "readout_kind",
        "readout_checksum",
        "path",
    )
    for name in settings:
        if getattr(other, name) != getattr(first, name):
            raise ValueError(
                f"{at}: {name} {getattr(other, name)!r} differs from "
                f"results[0]'s {getattr(first, name)!r}"
            )
    if not torch.equal(other.positions, first.positions):
        raise ValueError(f"{at}: attributed positions differ")
    optional = [n for n, s in IGLENS_SCHEMA.fields.items() if isinstance(s, Maybe)]
    for name in optional:
        if (getattr(other, name) is None) != (getattr(first, name) is None):
            raise ValueError(f"{at}: {name} given for some results only")
    if first.metadata.get("source_tokens") is not None and (
        other.metadata.get("source_tokens") is None
    ):
        raise ValueError(f"{at}: metadata.source_tokens missing, given for results[0]")
    if first.top_ids is not None and other.top_ids is not None:
        if other.top_ids.shape[-1] != first.top_ids.shape[-1]:
            raise ValueError(f"{at}: top_k differs from results[0]'s")


def _pad_last(value: Tensor, width: int) -> Tensor:
    """``value`` ``(..., S)`` padded with ``PAD`` to ``(..., width)``."""
    return torch.nn.functional.pad(value, (0, width - value.shape[-1]), value=PAD)


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

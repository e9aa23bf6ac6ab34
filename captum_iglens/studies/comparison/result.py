r"""The result of :func:`~captum_iglens.studies.compare`: every method's map, its
additivity residual and its cost, checked, saved and loaded like every result."""

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from torch import Tensor

from captum_iglens._utils.schema import (
    Array,
    Default,
    Either,
    Integer,
    Json,
    MapOf,
    Maybe,
    Number,
    Record,
    Text,
    Texts,
)
from captum_iglens._utils.serialization import JsonDocument, plain
from captum_iglens.studies.comparison.measure import Cost
from captum_iglens.studies.comparison.page import comparison_page
from captum_iglens.studies.comparison.plot import plot_comparison
from captum_iglens.viewer import Viewable

_COST_FIELDS = tuple(f.name for f in fields(Cost))


#: One method's entry in a saved :class:`ComparisonResult`: ``B`` sequences,
#: ``P`` positions, ``m`` columns of its own (blocks, or their parts).
_METHOD = Record(
    local=("m",),
    layer_names=Texts("m", nonempty=True),
    scores=Array("float", "B", "P", "m"),
    expected=Array("float", "B", "P"),
    prob_change=Array("float", "B", "P"),
    unit=Text(("probability", "logit", "share")),
    note=Text(),
    seconds=Number(low=0),
    peak_bytes=Integer(),
    forwards=Integer(),
    forward_sequences=Integer(),
    backwards=Integer(),
    backward_sequences=Integer(),
    readout_rows=Integer(),
    delta=Maybe(Either(Array("float", "B", "P"), Array("float", "B", "P", "m"))),
    # Written for readers of the file; recomputed on load.
    layer_sum=Maybe(Array("float", "B", "P")),
    residual=Maybe(Array("float", "B", "P")),
)

#: What a saved :class:`ComparisonResult` holds, one declaration per field (see
#: :mod:`captum_iglens._utils.schema`).
COMPARISON_SCHEMA = Record(
    targets=Array("int", "B", "P"),
    positions=Array("int", "P"),
    mask=Array("bool", "B", "P"),
    layer_names=Texts("k", nonempty=True),
    tokens=Maybe(Texts("B", "P")),
    input_tokens=Maybe(Texts("B", "P")),
    metadata=Default(Json()),
    methods=MapOf(_METHOD, nonempty=True),
)


@dataclass
class MethodResult:
    r"""
    One method's token-by-layer map for ``B`` sequences, ``P`` positions and ``k``
    layers, with its additivity check and its cost. Padding positions hold zeros.

    Attributes:

        scores (Tensor): ``(B, P, k)`` float32, in ``unit``.
        layer_names (list[str]): The ``k`` columns of ``scores``: the chosen
                    blocks, or their attention and MLP parts where IG-Lens and
                    the logit lens run with ``granularity="sublayer"``.
        expected (Tensor): ``(B, P)``: what the sum over layers should equal if
                    the method were additive in its own unit (``Δp`` for IG-Lens,
                    ``F(x) − F(x')`` for Captum's methods, the logit difference
                    for DLA).
        prob_change (Tensor): ``(B, P)``: the change in the target's probability
                    over the method's path, ``Δp``.
        unit (str): ``"probability"``, ``"logit"``, or ``"share"`` (attention
                    rollout: a share of the input).
        note (str): What the method computed, from which baseline, and what
                    happened.
        seconds, peak_bytes, forwards, forward_sequences, backwards,
        backward_sequences, readout_rows: The cost, see
                    :class:`~captum_iglens.studies.comparison.measure.Cost`.
        delta (Tensor, optional): Captum's convergence delta, ``Σ attributions −
                    (F(x) − F(x'))``: ``(B, P, k)`` for one call per block,
                    ``(B, P)`` for one call on all blocks; None for the others.
    """

    scores: Tensor
    layer_names: List[str]
    expected: Tensor
    prob_change: Tensor
    unit: str
    note: str
    seconds: float
    peak_bytes: int
    forwards: int
    forward_sequences: int
    backwards: int
    backward_sequences: int
    readout_rows: int
    delta: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if not isinstance(self.scores, Tensor) or self.scores.dim() != 3:
            raise ValueError("scores: expected a tensor (B, P, k)")
        b, p, k = self.scores.shape
        if len(self.layer_names) != k:
            raise ValueError(
                f"layer_names: expected {k} names, one per score column, got "
                f"{len(self.layer_names)}"
            )
        for name in ("expected", "prob_change"):
            if tuple(getattr(self, name).shape) != (b, p):
                raise ValueError(f"{name}: expected shape {(b, p)}")
        if self.delta is not None and tuple(self.delta.shape) not in (
            (b, p),
            (b, p, k),
        ):
            raise ValueError(f"delta: expected shape {(b, p)} or {(b, p, k)}")
        for name in _COST_FIELDS:
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a non-negative number")

    @property
    def layer_sum(self) -> Tensor:
        """``(B, P)``: the sum of the scores over layers."""
        return self.scores.sum(-1)

    @property
    def residual(self) -> Tensor:
        """``(B, P)``: the telescoping residual in probability, ``|Σ_layers − Δp|``,
        summed in float64 so that it measures the stored scores, not the sum's
        own rounding."""
        exact = self.scores.double().sum(-1) - self.prob_change.double()
        return exact.abs().to(self.scores.dtype)


@dataclass
class ComparisonResult(JsonDocument, Viewable):
    r"""
    The methods' maps side by side; see :func:`compare`.

    Attributes:

        methods (dict[str, MethodResult]): One entry per method, in the order run.
        targets (Tensor): ``(B, P)`` long, the attributed token ids.
        positions (Tensor): ``(P,)`` long, the attributed positions.
        mask (Tensor): ``(B, P)`` bool, False at padding.
        layer_names (list[str]): The ``k`` chosen blocks.
        tokens (list[list[str]], optional): The targets as text.
        input_tokens (list[list[str]], optional): The input tokens at
                    ``positions``, as text.
        metadata (dict): Settings and versions; JSON-serialisable.
    """

    methods: Dict[str, MethodResult]
    targets: Tensor
    positions: Tensor
    mask: Tensor
    layer_names: List[str]
    tokens: Optional[List[List[str]]] = None
    input_tokens: Optional[List[List[str]]] = None
    metadata: Dict[str, Any] = field(default_factory=dict)

    KIND = "ComparisonResult"

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("methods: expected at least one method")
        b, p = self.targets.shape
        if tuple(self.positions.shape) != (p,) or tuple(self.mask.shape) != (b, p):
            raise ValueError(
                f"positions/mask: expected shapes ({p},) and ({b}, {p}) to match "
                f"targets {(b, p)}"
            )
        for name, method in self.methods.items():
            if tuple(method.scores.shape[:2]) != (b, p):
                raise ValueError(
                    f"methods.{name}.scores: expected {b} sequences x {p} positions, "
                    f"got {tuple(method.scores.shape)}"
                )

    def residual_stats(
        self, method: str, sequence: Optional[int] = None
    ) -> Tuple[float, float]:
        r"""
        The largest and the median residual of ``method`` over the non-padding
        tokens of every sequence, or of ``sequence`` only.
        """
        residual, mask = self.methods[method].residual, self.mask
        if sequence is not None:
            residual, mask = residual[sequence], mask[sequence]
        return residual[mask].max().item(), residual[mask].median().item()

    def format_table(self) -> str:
        """The table: method, residual max / median, time, peak memory, passes."""
        b, p = self.targets.shape
        head = (
            f"{'method':<38}{'resid max':>10}{'resid med':>10}{'time s':>10}"
            f"{'peak MiB':>9}{'fwd (seqs)':>12}{'bwd (seqs)':>12}{'readouts':>9}"
        )
        lines = [
            f"{b} sequence(s) x {p} position(s) x {len(self.layer_names)} blocks "
            f"({', '.join(self.layer_names)}); n_steps={self.metadata.get('n_steps')}",
            head,
            "-" * len(head),
        ]
        for name, m in self.methods.items():
            top, median = self.residual_stats(name)
            fwd = f"{m.forwards} ({m.forward_sequences})"
            bwd = f"{m.backwards} ({m.backward_sequences})"
            lines.append(
                f"{name:<38}{top:>10.2e}{median:>10.2e}{m.seconds:>10.3f}"
                f"{m.peak_bytes / 2**20:>9.1f}{fwd:>12}{bwd:>12}{m.readout_rows:>9}"
            )
        lines += ["", "resid = |Σ_layers score − Δp| per token, in probability."]
        lines += [f"{name}: {m.note}" for name, m in self.methods.items()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary: every field, tensors as nested lists,
        and each method's ``layer_sum`` and ``residual``."""
        out = {f.name: plain(getattr(self, f.name)) for f in fields(self)}
        out["methods"] = {
            name: {
                **{f.name: plain(getattr(m, f.name)) for f in fields(m)},
                "layer_sum": plain(m.layer_sum),
                "residual": plain(m.residual),
            }
            for name, m in self.methods.items()
        }
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ComparisonResult":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`COMPARISON_SCHEMA`)."""
        fields = COMPARISON_SCHEMA.load(data)
        derived = ("layer_sum", "residual")
        fields["methods"] = {
            name: MethodResult(**{k: v for k, v in entry.items() if k not in derived})
            for name, entry in fields["methods"].items()
        }
        return cls(**fields)

    def plot(self, sequence: int = 0) -> Tuple[Any, Dict[str, Any]]:
        r"""The methods side by side; see
        :func:`~captum_iglens.studies.comparison.plot_comparison`."""
        return plot_comparison(self, sequence)

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this comparison's viewer page; see
        :func:`~captum_iglens.studies.comparison.page.comparison_page`."""
        return comparison_page(self)

    def label(self, sequence: int, row: int) -> str:
        r"""The label of attributed position ``row``: ``position 'input'→'target'``."""
        position = int(self.positions[row])
        if self.tokens is None or self.input_tokens is None:
            return f"{position}→{int(self.targets[sequence, row])}"
        given, target = self.input_tokens[sequence][row], self.tokens[sequence][row]
        return f"{position} {given!r}→{target!r}"

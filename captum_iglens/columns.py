r"""
The credit columns of a map as values: :class:`Column` is what a column name
says (its block, part, head, neuron, expert or source), made and read in this
one place. Results keep the names as strings (``layer_names``);
:meth:`Column.parse` reads one back and :attr:`Column.name` writes it, exactly.

The names, per granularity (``<b>`` a block's name):

=================  =========================================================
``"block"``        ``"<b>"``
``"sublayer"``     ``"<b>.attn"``, ``"<b>.mlp"``
``"head"``         ``"input"``, ``"<b>.attn.h<i>"``, ``"<b>.attn.bias"``,
                   ``"<b>.mlp"``
``"neuron"``       ``"<b>.attn"``, ``"<b>.mlp.n<i>"``, ``"<b>.mlp.bias"``
``"expert"``       ``"<b>.attn"``, ``"<b>.mlp.e<i>"``, ``"<b>.mlp.shared"``
``"source"``       ``"input"``, ``"<b>.attn.s<j>"``, ``"<b>.attn.bias"``,
                   ``"<b>.mlp"`` (``"<b>.attn.sources"`` before the forward
                   has set the number of sources)
``"source_head"``  as ``"source"`` with ``"<b>.attn.h<i>.s<j>"``
=================  =========================================================
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

#: What a column holds, by kind: the kinds and the part each belongs to
#: (None: the part is given, ``"attn"`` or ``"mlp"``; ``""``: no part).
KIND_PARTS: Dict[str, Optional[str]] = {
    "input": "",  # the baseline to the first chosen block's input
    "block": "",  # a whole block
    "sublayer": None,  # a block's attention or MLP segment
    "head": "attn",
    "bias": None,  # the bias of the attention or MLP output projection
    "neuron": "mlp",
    "expert": "mlp",  # a routed expert
    "shared": "mlp",  # the shared experts of a block
    "source": "attn",  # the part of a head (or of the heads) from one source
    "sources": "attn",  # the source columns of a block, not yet counted
}
#: The parts of a block.
PARTS = ("attn", "mlp")
#: The name of the column from the baseline to the first chosen block's input.
INPUT = "input"

_INT = r"(?:0|[1-9][0-9]*)"  # the way str(int) writes it: names round-trip
#: Per kind, the parts it may be of and what follows ``"<block>.<part>."``.
_SUFFIXES = (
    ("source", "attn", rf"(?:h(?P<index>{_INT})\.)?s(?P<source>{_INT})"),
    ("head", "attn", rf"h(?P<index>{_INT})"),
    ("neuron", "mlp", rf"n(?P<index>{_INT})"),
    ("expert", "mlp", rf"e(?P<index>{_INT})"),
    ("bias", "attn|mlp", "bias"),
    ("shared", "mlp", "shared"),
    ("sources", "attn", "sources"),
)
_PATTERNS = tuple(
    (kind, re.compile(rf"(?P<block>.+)\.(?P<part>{parts})\.{suffix}"))
    for kind, parts, suffix in _SUFFIXES
) + (("sublayer", re.compile(r"(?P<block>.+)\.(?P<part>attn|mlp)")),)

_Fields = Tuple[str, Optional[str], str, Optional[int], Optional[int]]


def _fields(name: str) -> _Fields:
    """``name`` read as (kind, block, part, index, source)."""
    if name == INPUT:
        return "input", None, "", None, None
    for kind, pattern in _PATTERNS:
        found = pattern.fullmatch(name)
        if found:
            numbers = [found.groupdict().get(key) for key in ("index", "source")]
            index, source = [None if n is None else int(n) for n in numbers]
            return kind, found["block"], found["part"], index, source
    return "block", name, "", None, None


@dataclass(frozen=True)
class Column:
    r"""
    One credit column of a map.

    Args:

        kind (str): What it holds, one of :data:`KIND_PARTS`: ``"input"``,
                    ``"block"``, ``"sublayer"``, ``"head"``, ``"bias"``,
                    ``"neuron"``, ``"expert"``, ``"shared"``, ``"source"`` or
                    ``"sources"``.
        block (str, optional): The block's name; None for ``"input"`` only.
        part (str, optional): ``"attn"`` or ``"mlp"``, the segment the column
                    is (``"sublayer"``) or is part of; given for ``"sublayer"``
                    and ``"bias"``, implied by the other kinds (``""`` for
                    ``"input"`` and ``"block"``). Default: implied
        index (int, optional): The head, neuron or expert; a ``"source"``
                    column's head when the heads are kept apart. Default: None
        source (int, optional): A ``"source"`` column's source position.
                    Default: None

    Raises:
        ValueError: If the fields do not make a column, or its name would read
            back as another column (a block named like a column, ``"input"``
            or ``"<b>.attn"``).

    Examples::

        >>> Column("neuron", "3", index=17).name
        '3.mlp.n17'
        >>> Column.parse("3.attn.h2.s5")
        Column(kind='source', block='3', part='attn', index=2, source=5)
    """

    kind: str
    block: Optional[str] = None
    part: Optional[str] = None
    index: Optional[int] = None
    source: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_PARTS:
            raise ValueError(
                f"kind: expected one of {list(KIND_PARTS)}, got {self.kind!r}"
            )
        implied = KIND_PARTS[self.kind]
        if self.part is None and implied is not None:
            object.__setattr__(self, "part", implied)
        allowed = PARTS if implied is None else (implied,)
        if self.part not in allowed:
            raise ValueError(
                f"part: a {self.kind!r} column takes part "
                f"{' or '.join(map(repr, allowed))}, got {self.part!r}"
            )
        self._check_numbers()
        if (self.block is None) != (self.kind == "input"):
            raise ValueError(
                f"block: expected a block name for a {self.kind!r} column (None "
                f"for 'input' only), got {self.block!r}"
            )
        if _fields(self.name) != self._key():
            raise ValueError(
                f"block: {self.block!r} reads back as another column "
                f"({Column.parse(self.name)!r}); rename the block"
            )

    def _check_numbers(self) -> None:
        # Per field, the kinds that need it and the kinds that may have it.
        for field, needed, allowed in (
            ("index", ("head", "neuron", "expert"), ("source",)),
            ("source", ("source",), ()),
        ):
            value = getattr(self, field)
            if value is None and self.kind not in needed:
                continue
            if self.kind not in needed + allowed:
                raise ValueError(
                    f"{field}: a {self.kind!r} column takes None, got {value!r}"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"{field}: a {self.kind!r} column takes an int >= 0, got {value!r}"
                )

    def _key(self) -> _Fields:
        return self.kind, self.block, str(self.part), self.index, self.source

    @classmethod
    def parse(cls, name: str) -> "Column":
        r"""
        The column a name stands for: ``"input"``, a name that ends in a part
        (``".attn"``, ``".mlp"``, ``".attn.h<i>"``, ...; see the module's
        table), else the name of a whole block.

        Args:

            name (str): A column name, as in ``IGLensResult.layer_names``.

        Returns:
            *Column*, with ``Column.parse(name).name == name``.

        Raises:
            TypeError: If ``name`` is not a str.
        """
        if not isinstance(name, str):
            raise TypeError(f"name: expected a column name (a str), got {name!r}")
        kind, block, part, index, source = _fields(name)
        return cls(kind, block, part, index, source)

    @property
    def name(self) -> str:
        r"""The column's name (see the module's table)."""
        if self.kind in ("input", "block"):
            return INPUT if self.block is None else self.block
        at = f"{self.block}.{self.part}"
        if self.kind == "sublayer":
            return at
        if self.kind == "source":
            head = "" if self.index is None else f"h{self.index}."
            return f"{at}.{head}s{self.source}"
        suffix = {"head": "h", "neuron": "n", "expert": "e"}.get(self.kind)
        return f"{at}.{self.kind if suffix is None else f'{suffix}{self.index}'}"

    @property
    def segment(self) -> Optional["Column"]:
        r"""The ``"sublayer"`` column this column is a part of
        (``"<b>.attn"`` or ``"<b>.mlp"``); None for the columns that are not
        parts of a segment (``"input"``, ``"block"``, ``"sublayer"``)."""
        if self.kind in ("input", "block", "sublayer"):
            return None
        return Column("sublayer", self.block, self.part)

    def __str__(self) -> str:
        return self.name


def parse_columns(names: Sequence[str]) -> List[Column]:
    r"""
    The :class:`Column` of each name (see :meth:`Column.parse`).

    Args:

        names (list[str]): Column names, as in ``IGLensResult.layer_names``.

    Returns:
        *list[Column]*, one per name.
    """
    return [Column.parse(name) for name in names]

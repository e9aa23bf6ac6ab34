r"""
The columns of a map page, grouped: the parts of one segment (a block's heads
and attention bias, its per-source parts, its neurons and MLP bias, its experts
and shared experts) form a group that the page folds into one column, read
from :class:`~captum_iglens.columns.Column` (the page's script reads no names).
"""

from collections import Counter
from typing import Any, Dict, List

from captum_iglens.columns import Column, parse_columns

#: Above this many columns, a page opens with every group folded.
MAX_UNFOLDED = 60

#: How a group names its members, per kind: (one, many).
_NOUNS = {
    "head": ("head", "heads"),
    "bias": ("bias", "biases"),
    "neuron": ("neuron", "neurons"),
    "expert": ("expert", "experts"),
    "shared": ("shared experts", "shared experts"),
    "source": ("source part", "source parts"),
}


def _members(columns: List[Column]) -> str:
    """What a group holds, e.g. ``"1536 neurons, bias"``."""
    counts = Counter(column.kind for column in columns)
    said = []
    for kind, n in counts.items():
        one, many = _NOUNS.get(kind, (kind, kind))
        said.append(one if n == 1 and kind in ("bias", "shared") else f"{n} {many}")
    return ", ".join(said)


def column_groups(names: List[str]) -> List[Dict[str, Any]]:
    r"""
    The columns of a map in display groups, in column order.

    Args:

        names (list[str]): The map's ``k`` column names (``layer_names``).

    Returns:
        *list[dict]*: per group, ``name`` (the segment, e.g. ``"3.mlp"``, or
        the column's own name), ``members`` (its column indices, consecutive),
        ``foldable`` (its members are parts of one segment), ``folded``
        (folded when the page opens: a page of more than
        :data:`MAX_UNFOLDED` columns, and per-source parts, which the page's
        source panel shows) and ``what`` (its members in words; ``""`` for
        one whole column).
    """
    columns = parse_columns(names)
    groups: List[Dict[str, Any]] = []
    parts: List[List[Column]] = []
    for i, column in enumerate(columns):
        segment = column.segment
        last = groups[-1] if groups else None
        if (
            segment is not None
            and last
            and last["foldable"]
            and (last["name"] == segment.name)
        ):
            last["members"].append(i)
            parts[-1].append(column)
            continue
        groups.append(
            {
                "name": column.name if segment is None else segment.name,
                "members": [i],
                "foldable": segment is not None,
            }
        )
        parts.append([column])
    many = len(columns) > MAX_UNFOLDED
    for group, members in zip(groups, parts):
        sources = any(column.kind == "source" for column in members)
        group["folded"] = group["foldable"] and (many or sources)
        group["what"] = _members(members) if group["foldable"] else ""
    return groups

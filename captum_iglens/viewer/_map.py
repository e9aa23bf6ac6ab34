r"""
The page data of an IG-Lens map (:class:`~captum_iglens.IGLensResult`): its
rows, column groups, readout and, for the source granularities, each
sequence's source map. Read from the result's fields; no result class is
imported.
"""

from typing import Any, Dict, List, Optional

import torch

from captum_iglens._utils.serialization import plain
from captum_iglens._utils.source_columns import source_layout
from captum_iglens.viewer._columns import column_groups
from captum_iglens.viewer._payload import Vocab, about, map_sequences


def map_page(result: Any) -> Dict[str, Any]:
    r"""
    The page data of an IG-Lens map.

    Args:

        result (IGLensResult): ``(B, P, k)``.

    Returns:
        *dict*: ``kind`` ``"map"``, ``title``, ``layers`` (the ``k`` column
        names), ``groups`` (see
        :func:`~captum_iglens.viewer._columns.column_groups`), ``method``,
        ``n_steps``, ``path``, ``trajectory`` (the caption of a token's
        trajectory on the path, the result's ``trajectory_caption``),
        ``about``, ``sequences`` (see
        :func:`~captum_iglens.viewer._payload.map_sequences`), ``vocab`` (the
        top-token strings), ``sources`` (see :func:`source_data`) and
        ``readout`` (see :func:`readout_data`).
    """
    vocab = Vocab()
    sequences = map_sequences(result, vocab)
    return {
        "kind": "map",
        "title": "IG-Lens map",
        "layers": list(result.layer_names),
        "groups": column_groups(list(result.layer_names)),
        "method": result.method,
        "n_steps": result.n_steps,
        "path": result.path,
        "trajectory": result.trajectory_caption,
        "about": about(result),
        "sequences": sequences,
        "vocab": vocab.strings,
        "sources": source_data(result),
        "readout": readout_data(result),
    }


def readout_data(result: Any) -> Dict[str, Any]:
    r"""The readout of a map's page: ``kind``, ``checksum`` and, under a
    learned readout, ``lens_change`` (``B x P x k``, the lens-change part of
    each credit; None under the logit readout)."""
    return {
        "kind": result.readout_kind,
        "checksum": result.readout_checksum,
        "lens_change": (
            None if result.lens_change is None else plain(result.lens_change)
        ),
    }


def source_data(result: Any) -> Optional[List[Dict[str, Any]]]:
    r"""
    The per-source data of a map's page, one entry per sequence (None without
    source columns): ``tokens`` (``T`` source strings, or None), ``blocks``
    (``k`` names), ``positions`` (``P``), ``credits`` (``P x k x T``, heads
    summed), ``bias`` and ``mlp`` (``P x k``; bias 0 without one), ``input``
    (``P``), and ``heads`` (``P x k x H x T``, or None when the heads are
    summed). Zero at padding; see docs/granularities.md.
    """
    layout = source_layout(result.layer_names)
    if layout is None:
        return None
    sources = result.metadata.get("source_tokens")
    per_head = layout.n_heads is not None
    out = []
    for b in range(result.attributions.shape[0]):
        row = result.attributions[b]
        zero = torch.zeros(row.shape[0], 1)
        bias = [row[:, [i]] if i is not None else zero for i in layout.bias]
        out.append(
            {
                "tokens": None if sources is None else list(sources[b]),
                "blocks": list(layout.blocks),
                "positions": result.positions.tolist(),
                "credits": layout.source_map(row).tolist(),
                "bias": torch.cat(bias, -1).tolist(),
                "mlp": row[:, layout.mlp].tolist(),
                "input": row[:, 0].tolist(),
                "heads": (layout.source_map(row, True).tolist() if per_head else None),
            }
        )
    return out

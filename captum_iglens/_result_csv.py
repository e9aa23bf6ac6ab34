r"""
The long-format CSV of an :class:`~captum_iglens.result.IGLensResult`: one row per
(sequence, attributed position, layer). The result's ``to_csv`` calls
:func:`write_csv`.

The result is taken as it is (``Any``): the result module imports this one, and
no module imports back up (see ``tests/test_layout.py``).
"""

import csv
import io
import json
from pathlib import Path
from typing import Any, List, Union

from captum_iglens._result_tables import view_field
from captum_iglens._utils.output_paths import check_writable
from captum_iglens._utils.serialization import write_atomic
from captum_iglens.readout.scores import PAD

#: The columns of every file; the levels' column keeps its first name, "lens".
_COLUMNS = ("batch", "position", "token", "layer", "credit", "lens")
#: The token sets a result may hold, each a column of JSON lists of ids.
_SETS = ("target_sets", "foils")
#: The columns of a result with views, after its token sets.
_VIEWS = ("top_ids", "top_probs", "top_tokens", "entropy", "kl", "rank")


def write_csv(result: Any, path: Union[str, Path]) -> None:
    r"""See :meth:`IGLensResult.to_csv <captum_iglens.result.IGLensResult.to_csv>`."""
    check_writable(path, "path")
    sets = [name for name in _SETS if getattr(result, name) is not None]
    views = [
        name
        for name in _VIEWS
        if result.has_views and (name != "top_tokens" or result.top_tokens is not None)
    ]
    lines: List[List[Any]] = [[*_COLUMNS, *sets, *views]]
    for b in range(result.attributions.shape[0]):
        labels = result.tokens[b] if result.tokens is not None else None
        for p in result.mask[b].nonzero()[:, 0].tolist():
            token = labels[p] if labels else int(result.targets[b, p])
            given = [
                json.dumps([i for i in getattr(result, n)[b, p].tolist() if i != PAD])
                for n in sets
            ]
            for j, name in enumerate(result.layer_names):
                line = [
                    b,
                    int(result.positions[p]),
                    token,
                    name,
                    float(result.attributions[b, p, j]),
                    float(result.levels[b, p, j]),
                    *given,
                ]
                lines.append(line + _view_cells(result, b, p, j))
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(lines)
    write_atomic(path, buffer.getvalue())


def _view_cells(result: Any, b: int, p: int, j: int) -> List[Any]:
    """The CSV cells of the views of one (sequence, position, layer)."""
    if not result.has_views:
        return []
    top_probs = view_field(result, "top_probs")[b, p, j].tolist()
    cells: List[Any] = [
        json.dumps(view_field(result, "top_ids")[b, p, j].tolist()),
        json.dumps([round(x, 6) for x in top_probs]),
    ]
    if result.top_tokens is not None:
        cells.append(json.dumps(result.top_tokens[b][p][j]))
    cells += [
        float(view_field(result, "entropy")[b, p, j]),
        float(view_field(result, "kl")[b, p, j]),
        int(view_field(result, "rank")[b, p, j]),
    ]
    return cells

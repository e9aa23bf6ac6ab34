r"""The figure and the HTML page of a
:class:`~captum_iglens.studies.circuits.study.CircuitsResult`."""

import base64
import html
import io
from typing import Any, Tuple

from captum_iglens._utils.serialization import write_atomic

#: The most edges of a best circuit the page lists.
MAX_LISTED = 300


def plot(result: Any) -> Tuple[Any, Any]:
    r"""
    The faithfulness curves of a
    :class:`~captum_iglens.studies.circuits.study.CircuitsResult`: ``f(k)`` against
    the circuit size (log scale),
    the signed ranking (CPR) on the left and the absolute one (CMD) on the right.

    Returns:
        2-element tuple of **fig** and **axes** (two matplotlib axes).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, field, title in (
        (axes[0], "f", "signed ranking (CPR)"),
        (axes[1], "f_abs", "absolute ranking (CMD)"),
    ):
        for c in result.curves:
            score = c.cpr if field == "f" else c.cmd
            label = f"{c.method} ({'CPR' if field == 'f' else 'CMD'} {score:.2f})"
            ax.plot(result.percents, getattr(c, field), marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("edges kept (%)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"faithfulness f ({result.metric})")
    trained = f", {len(result.split['train'])} training" if result.split else ""
    fig.suptitle(
        f"{result.task} on {result.model}: "
        f"{result.counts.get('scored', 0)} pairs scored{trained}"
    )
    return fig, axes


def _kinds(result: Any) -> str:
    """What the page says of its searched and averaged methods, if any."""
    names = [c.method for c in result.curves]
    notes = []
    searched = [n for n in names if n.startswith("search:")]
    if searched:
        notes.append(
            f"Searched ({', '.join(searched)}): circuits improved against "
            "faithfulness on the training pairs, from the named method's scores "
            "there (CPR's circuits to raise f, CMD's to bring it to 1), then "
            "evaluated on the scored pairs like every method."
        )
    averaged = [n for n in names if n.startswith("mean:")]
    if averaged:
        notes.append(
            f"Ensembles ({', '.join(averaged)}): the mean of their parts' signed "
            "rank-normalized scores."
        )
    return "".join(f"<p>{html.escape(note)}</p>" for note in notes)


def to_html(result: Any, path: str) -> None:
    r"""Writes a self-contained page: the pairs scored and where searches
    trained, the table, the curves, what the searched and averaged methods
    are, and each method's best circuit (the first :data:`MAX_LISTED`
    edges)."""
    import matplotlib.pyplot as plt

    fig, _ = plot(result)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    image = base64.b64encode(buffer.getvalue()).decode()
    circuits = []
    for name, edges in result.best.items():
        listed = "\n".join(html.escape(e) for e in edges[:MAX_LISTED])
        more = f" (first {MAX_LISTED})" if len(edges) > MAX_LISTED else ""
        circuits.append(
            f"<details><summary>{html.escape(name)}: {len(edges)} edges{more}</summary>"
            f"<pre>{listed}</pre></details>"
        )
    title = html.escape(f"Circuits: {result.task} on {result.model}")
    counts = ", ".join(f"{name} {n}" for name, n in result.counts.items())
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}"
        "pre{font-size:12px;white-space:pre-wrap}</style>"
        f"</head><body><h1>{title}</h1><p>{html.escape(counts)}; "
        f"{result.n_edges} edges in the model's graph</p>"
        f"<p>{html.escape(result.describe_split())}</p>"
        f"{_kinds(result)}<pre>{html.escape(result.format_table())}</pre>"
        f"<img alt='faithfulness curves' src='data:image/png;base64,{image}'>"
        "<h2>Best circuit per method (size whose f is nearest 1)</h2>"
        + "".join(circuits)
        + "</body></html>"
    )
    write_atomic(path, page)

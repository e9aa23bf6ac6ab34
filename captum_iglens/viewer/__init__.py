r"""
The interactive viewer: one self-contained HTML file per result (no server, no
network), opened from disk in any current browser. See :func:`write_html`.
"""

from captum_iglens.viewer.html import (
    Viewable,
    embed_json,
    notebook_html,
    render_page,
    result_html,
    write_html,
)
from captum_iglens.viewer.payload import batch_payload, payload

__all__ = [
    "Viewable",
    "batch_payload",
    "embed_json",
    "notebook_html",
    "payload",
    "render_page",
    "result_html",
    "write_html",
]

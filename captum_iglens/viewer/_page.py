r"""
The page itself, behind :mod:`captum_iglens.viewer.page`: one self-contained
HTML page per result, the data as JSON in a ``<script type="application/json">``
element, the viewer's script and style inline, nothing loaded from anywhere (no
server, no network, no CDN).

The page reads its data with ``JSON.parse`` and writes every string of it with
``textContent``: token text is data, never markup.
"""

import html
import json
from importlib import resources
from typing import Any, Dict

from captum_iglens.viewer._payload import payload

#: The id of the element that holds a page's data.
DATA_ID = "iglens-data"
#: The pages drawn by a script of their own, run before ``viewer.js`` (which
#: lends them its helpers), only in the pages of their kind.
_PAGE_SCRIPTS = {"graph": "graph.js"}

# Characters that could end the script element or a line of script, written as
# JSON escapes (the same string once parsed).
_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def embed_json(data: Dict[str, Any]) -> str:
    r"""
    ``data`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>``,
    ``&``, U+2028 and U+2029 are written as ``\uXXXX`` escapes, so no string in
    it can close the element or start markup; ``JSON.parse`` reads it back
    unchanged.

    Args:

        data (dict): JSON-ready values (finite numbers only).

    Returns:
        *str*.
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (
        "".join(_ESCAPES.get(char, char) for char in text)
        .encode(
            "utf-8",
            "backslashreplace",  # lone surrogates, as the same JSON escapes
        )
        .decode("utf-8")
    )


def _static(name: str) -> str:
    return (
        resources.files("captum_iglens.viewer")
        .joinpath("static")
        .joinpath(name)  # one name a call: Python 3.10's Traversable
        .read_text(encoding="utf-8")
    )


def render_page(data: Dict[str, Any]) -> str:
    r"""
    The page of a payload (see :mod:`captum_iglens.viewer._payload`).

    Args:

        data (dict): With ``kind``, the page the viewer's script draws
                    (``"map"``, ``"batch"``, ``"comparison"``, ``"validation"``,
                    ``"restoration"`` or ``"graph"``), and ``title``.

    Returns:
        *str*: a complete HTML document.
    """
    own = _PAGE_SCRIPTS.get(str(data.get("kind")))
    script = (_static(own) if own else "") + _static("viewer.js")
    title = html.escape(str(data.get("title", "IG-Lens")))
    title = title.encode("utf-8", "backslashreplace").decode("utf-8")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        # Nothing may be fetched: the policy forbids every source but inline code.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{title}</title>\n"
        f"<style>\n{_static('viewer.css')}</style>\n</head>\n<body>\n"
        '<div id="app"></div>\n'
        f'<script type="application/json" id="{DATA_ID}">{embed_json(data)}'
        "</script>\n"
        f"<script>\n{script}</script>\n</body>\n</html>\n"
    )


def result_html(result: Any) -> str:
    r"""The page of a result with a viewer page (see ``payload``)."""
    return render_page(payload(result))


def notebook_html(result: Any, height: int = 640) -> str:
    r"""The page of ``result`` in an ``<iframe srcdoc>``, for Jupyter's
    ``_repr_html_``: its script runs in the frame, apart from the notebook."""
    page = html.escape(result_html(result), quote=True)
    return (
        f'<iframe srcdoc="{page}" sandbox="allow-scripts" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #ccc"></iframe>'
    )

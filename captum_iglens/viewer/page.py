r"""
The viewer's public entry points: :func:`write_html` writes the page of a
result, and :class:`Viewable` gives a result type its page (``to_html`` and
Jupyter's ``_repr_html_``). The page is one self-contained HTML file: its data
as JSON, the viewer's script and style inline, nothing loaded from anywhere.
"""

from pathlib import Path
from typing import Any, Dict, Union

from captum_iglens._utils.output_paths import check_writable
from captum_iglens._utils.serialization import write_atomic
from captum_iglens.viewer._page import notebook_html, result_html

__all__ = ["Viewable", "write_html"]


def write_html(result: Any, path: Union[str, Path]) -> None:
    r"""
    Writes the page of ``result`` to ``path``, atomically.

    Args:

        result (Viewable): A result with a viewer page (see ``payload``).
        path (str or Path): The file; its folder must exist.
    """
    check_writable(path, "path")
    write_atomic(path, result_html(result))


class Viewable:
    r"""Gives a result type the viewer: :meth:`to_html` and Jupyter's
    ``_repr_html_`` (the page in a sandboxed frame). A subclass builds its page
    data in :meth:`page_data`, with the helpers of
    :mod:`captum_iglens.viewer._payload`."""

    def page_data(self) -> Dict[str, Any]:
        r"""The JSON-ready data of this result's page: ``kind`` (the page the
        viewer's script draws), ``title`` and the page's own fields."""
        raise NotImplementedError

    def to_html(self, path: Union[str, Path]) -> None:
        r"""Writes the interactive viewer of this result, one self-contained HTML
        file that opens offline (see :mod:`captum_iglens.viewer`).

        Args:

            path (str or Path): The file to write (atomically).
        """
        write_html(self, path)

    def _repr_html_(self) -> str:
        return notebook_html(self)

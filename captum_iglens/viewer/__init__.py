r"""
The interactive viewer: one self-contained HTML file per result (no server, no
network), opened from disk in any current browser. See :func:`write_html`, and
:class:`Viewable`, which gives a result type its page (``to_html`` and
Jupyter's ``_repr_html_``).
"""

from captum_iglens.viewer.page import Viewable, write_html

__all__ = ["Viewable", "write_html"]

r"""
How the estimators read the components ``u_c`` of a segment: their products
with gradients and their norms. A ``(M, C, d)`` tensor (or an object whose
``[rows]`` builds those rows' components) is read through its rows; an object
that keeps its components factored (the per-(head, source) terms of
``granularity="source"``) answers through its own ``dots`` and ``norms``,
without building a ``(rows, C, d)`` array.
"""

from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor

Rows = Union[slice, Tensor]


def component_dots(components: Any, rows: Rows, grads: Tensor) -> Tensor:
    r"""
    ``g_s · u_c`` for the rows ``rows`` of ``components`` and their vectors
    ``grads`` ``(g, S, d)``.

    Returns:
        *Tensor* ``(g, S, C)`` float32.
    """
    if not hasattr(components, "dots"):
        return torch.einsum("gsd,gcd->gsc", grads, components[rows])
    return components.dots(rows, grads)


def component_credits(components: Any, rows: Rows, vectors: Tensor) -> Tensor:
    r"""
    ``v · u_c`` for the rows ``rows`` of ``components`` and one vector per
    row, ``vectors`` ``(g, d)``.

    Returns:
        *Tensor* ``(g, C)`` float32.
    """
    if not hasattr(components, "dots"):
        return (components[rows] * vectors.unsqueeze(1)).sum(-1)
    return components.dots(rows, vectors.unsqueeze(1))[:, 0]


def component_norms(
    components: Any, rows: Rows, parents: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    r"""
    The norms the estimators split residuals by, for the rows ``rows``.

    Args:
        parents (Tensor, optional): ``(C,)`` long, a group per component.

    Returns:
        3-element tuple: ``‖u_c‖`` ``(g, C)``, ``‖u_c‖²`` ``(g, C)``, and with
        ``parents`` the norm of each group's summed component ``(g, G)``
        (else None).
    """
    if not hasattr(components, "norms"):
        u = components[rows]
        group = None
        if parents is not None:
            n_groups = int(parents.max()) + 1
            summed = u.new_zeros(u.shape[0], n_groups, u.shape[2])
            group = summed.index_add_(1, parents, u).norm(dim=-1)
        return u.norm(dim=-1), u.square().sum(-1), group
    own = getattr(components, "parents", None)
    if parents is not None and (own is None or not torch.equal(parents, own)):
        raise ValueError("parents: factored components group only by their own")
    square, groups = components.norms(rows)
    return square.sqrt(), square, None if parents is None else groups.sqrt()

r"""
Competitor credits: which layer gave probability to each of the model's top
tokens, not only to the one it chose.
"""

from typing import Any, List, Union

from torch import Tensor

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.result import IGLensResult


def competitor_maps(
    ig_lens: LayerIGLens,
    inputs: Union[Tensor, tuple],
    n: int = 3,
    **map_kwargs: Any,
) -> List[IGLensResult]:
    r"""
    The IG-Lens map of each of the ``n`` most probable tokens of the model's
    final distribution at every attributed position.

    Map ``i`` attributes, at every position, the model's ``i``-th most probable
    next token (``i = 0`` is the greedy token), so its credits show at which
    layers that competitor gained or lost probability; each map adds up exactly,
    like any map. It costs ``n + 1`` maps: one with views to find the
    competitors (``top_k = n``), then one per competitor.

    Args:

        ig_lens (LayerIGLens): IG-Lens on the model.
        inputs (Tensor or tuple[Tensor, ...]): As in
                    :meth:`LayerIGLens.attribute_map`.
        n (int, optional): How many competitors, at least 1. Default: 3.
        **map_kwargs (Any): Further arguments of
                    :meth:`LayerIGLens.attribute_map` (``baselines``,
                    ``additional_forward_args``, ``positions``, ``method``, ...;
                    not ``target``, ``foil`` or ``target_tokens``). With
                    ``top_k``, every map also holds views.

    Returns:
        *list[IGLensResult]* of ``n`` maps; ``result[i].targets`` ``(B, P)`` are
        the ``i``-th most probable tokens, and ``result[i].metadata["competitor"]
        == i``.

    Examples::

        >>> maps = competitor_maps(ig_lens, input_ids, n=3, positions=[-1])
        >>> [m.attributions[0, 0] for m in maps]  # per-layer credits of each
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    taken = {"target", "foil", "target_tokens"} & set(map_kwargs)
    if taken:
        raise ValueError(
            f"{', '.join(sorted(taken))}: competitor_maps chooses the targets itself"
        )
    if n > ig_lens.readout.vocab_size:
        raise ValueError(f"n: expected at most the vocabulary size, got {n}")
    top_k = map_kwargs.pop("top_k", 0)
    finder = ig_lens.attribute_map(inputs, top_k=n, **map_kwargs)
    assert finder.top_ids is not None  # attributed with top_k=n
    competitors = finder.top_ids[:, :, -1]  # the model's own distribution
    maps = []
    for i in range(n):
        found = ig_lens.attribute_map(
            inputs,
            target=competitors[..., i].to(finder.targets.device),
            top_k=top_k,
            **map_kwargs,
        )
        found.metadata = dict(found.metadata, competitor=i)
        maps.append(found)
    return maps

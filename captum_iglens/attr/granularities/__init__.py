r"""
The granularities of IG-Lens: which residual-stream states a path runs through,
what its credit columns are called, and how the estimator credits them.

A new granularity is one module with one :class:`PathGranularity` subclass, and
one line in :data:`GRANULARITIES`: its ``name``, where it lives and its summary,
which help texts and checks list without importing it.
"""

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Type

from captum_iglens._utils.lazy import lazy_exports
from captum_iglens._utils.registry import Home, Registry, registered

if TYPE_CHECKING:
    from torch.nn import Module

    from captum_iglens.attr._utils.block_parts import BlockParts
    from captum_iglens.attr.granularities.base import PathGranularity
    from captum_iglens.attr.granularities.blocks import Blocks, Sublayers
    from captum_iglens.attr.granularities.components import ComponentSplit
    from captum_iglens.attr.granularities.experts import Experts
    from captum_iglens.attr.granularities.heads import Heads
    from captum_iglens.attr.granularities.neurons import Neurons
    from captum_iglens.attr.granularities.source import SourceHeads, Sources
    from captum_iglens.hf.parts import ModelParts

__all__ = [
    "GRANULARITIES",
    "Blocks",
    "ComponentSplit",
    "Experts",
    "Heads",
    "Neurons",
    "PathGranularity",
    "SourceHeads",
    "Sources",
    "Sublayers",
    "check_granularity",
    "check_learned_readout",
    "granularity_help",
    "granularity_of",
    "model_columns",
]


#: The granularities ``granularity=`` takes, by name, with what their columns
#: are (iterating gives the names, importing nothing).
GRANULARITIES: "Registry[Type[PathGranularity]]" = Registry(
    __name__,
    {
        "block": Home("blocks:Blocks", "one credit per block"),
        "sublayer": Home(
            "blocks:Sublayers", "attention and MLP of each block credited separately"
        ),
        "head": Home("heads:Heads", "the attention also split across its heads"),
        "source": Home(
            "source:Sources", "the attention split across the source tokens it reads"
        ),
        "source_head": Home(
            "source:SourceHeads", "the attention split per head and source token"
        ),
        "neuron": Home("neurons:Neurons", "the MLP split across its neurons"),
        "expert": Home(
            "experts:Experts", "a mixture-of-experts MLP split across its experts"
        ),
    },
)

# Each class is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PathGranularity": "captum_iglens.attr.granularities.base",
        "Blocks": "captum_iglens.attr.granularities.blocks",
        "Sublayers": "captum_iglens.attr.granularities.blocks",
        "ComponentSplit": "captum_iglens.attr.granularities.components",
        "Experts": "captum_iglens.attr.granularities.experts",
        "Heads": "captum_iglens.attr.granularities.heads",
        "Neurons": "captum_iglens.attr.granularities.neurons",
        "SourceHeads": "captum_iglens.attr.granularities.source",
        "Sources": "captum_iglens.attr.granularities.source",
    },
)


def granularity_help() -> str:
    r"""
    Returns:
        *str*: every granularity's name and summary, in registry order (the
        help text of ``--granularity``).
    """
    return "; ".join(
        f"{name!r}: {GRANULARITIES.summary(name)}" for name in GRANULARITIES
    )


def check_granularity(granularity: str) -> None:
    r"""
    Checks a ``granularity=`` before any work.

    Args:

        granularity (str): What the caller passed.

    Raises:
        ValueError: If no granularity has the name ``granularity``.
    """
    registered(GRANULARITIES, granularity, "granularity")


def check_learned_readout(granularity: str, kind: str = "") -> None:
    r"""
    Args:

        granularity (str): A name in :data:`GRANULARITIES`.
        kind (str, optional): The readout's kind, for the message. Default: ""

    Raises:
        ValueError: If a learned readout per layer cannot split the columns
            of ``granularity`` (checked before any forward).
    """
    check_granularity(granularity)
    if not GRANULARITIES[granularity].learned_readout:
        takes = [n for n, g in GRANULARITIES.items() if g.learned_readout]
        raise ValueError(
            f"granularity: {granularity!r} is not available with a learned readout "
            f"per layer{f' ({kind})' if kind else ''}; use one of {takes}, or the "
            "logit readout"
        )


def granularity_of(
    name: str,
    forward_func: Callable[..., Any],
    layers: Sequence["Module"],
    layer_names: Sequence[str],
    sublayers: Optional[Sequence["Module"]],
    block_parts: Optional["BlockParts"],
) -> "PathGranularity":
    r"""
    The granularity named ``name`` of the path through ``layers``.

    Args:

        name (str): A name in :data:`GRANULARITIES`.
        forward_func (Callable): As :class:`PathGranularity` takes it; so are
                    ``layers``, ``layer_names``, ``sublayers`` and
                    ``block_parts``.

    Returns:
        *PathGranularity*: a new instance.

    Raises:
        ValueError: If no granularity has that name.
    """
    check_granularity(name)
    return GRANULARITIES[name](
        forward_func, layers, layer_names, sublayers, block_parts
    )


def model_columns(
    parts: "ModelParts", layers: Optional[Sequence[int]], granularity: str
) -> List[str]:
    r"""
    The column names of ``granularity`` on a model's chosen blocks, as
    :meth:`LayerIGLens.segment_names` gives them for
    ``LayerIGLens.from_model(parts, layers)``, without building the lens: the
    check, before any forward, that the model has what the granularity needs.

    Args:

        parts (ModelParts): The model's parts.
        layers (list[int], optional): As :meth:`ModelParts.choose` takes them.
        granularity (str): A name in :data:`GRANULARITIES`.

    Returns:
        *list[str]*: the names, in column order.

    Raises:
        ValueError: If the granularity is unknown or not available.
    """
    from captum_iglens.attr._utils.block_parts import BlockParts
    from captum_iglens.hf.forward import CausalLMForward

    chosen = parts.choose(layers)
    split = granularity_of(
        granularity,
        CausalLMForward(parts.model),
        [parts.blocks[i] for i in chosen],
        [str(i) for i in chosen],
        None if parts.mid is None else [parts.mid[i] for i in chosen],
        BlockParts.of_model(parts, chosen),
    )
    return split.path_points()[1]

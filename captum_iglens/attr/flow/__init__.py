r"""
Probability flow: edges between embeddings, attention heads and MLPs whose
flows add up exactly to the change of a token's probability
(:class:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow`, returning a
:class:`~captum_iglens.attr.flow.graph.FlowGraph`). The whole flow lives in
this folder: its options (``options.py``, importable without torch), the
engine, its estimator, its result and the budget.
"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.attr.flow.graph import FlowGraph
    from captum_iglens.attr.flow.options import DEFAULT_STEPS
    from captum_iglens.attr.flow.probability_flow import ProbabilityFlow

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DEFAULT_STEPS": "captum_iglens.attr.flow.options",
        "FlowGraph": "captum_iglens.attr.flow.graph",
        "ProbabilityFlow": "captum_iglens.attr.flow.probability_flow",
    },
)

__all__ = ["DEFAULT_STEPS", "FlowGraph", "ProbabilityFlow"]

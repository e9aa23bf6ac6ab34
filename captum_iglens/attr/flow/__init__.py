r"""
Probability flow: edges between embeddings, attention heads and MLPs whose
flows add up exactly to the change of a token's probability
(:class:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow`, returning a
:class:`~captum_iglens.flow_graph.FlowGraph`).
"""

from captum_iglens.attr.flow.probability_flow import DEFAULT_STEPS, ProbabilityFlow

__all__ = ["DEFAULT_STEPS", "ProbabilityFlow"]

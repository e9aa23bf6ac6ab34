r"""
The one graph of a model: its nodes, receivers and legal edges
(:class:`~captum_iglens.graph.model_graph.ModelGraph`), the target metric ``m``
the flow and the circuits share (:mod:`captum_iglens.graph.target`), edge
scores and circuits over the graph (:mod:`captum_iglens.graph.circuit`) and
EAP-IG's / MIB's graph file (:mod:`captum_iglens.graph.eap_json`). Importing
this package, its model graph, target and file reader needs no torch.
"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.graph.eap_json import read_eap_json
    from captum_iglens.graph.model_graph import ModelGraph
    from captum_iglens.graph.target import TARGETS, Target

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ModelGraph": "captum_iglens.graph.model_graph",
        "read_eap_json": "captum_iglens.graph.eap_json",
        "TARGETS": "captum_iglens.graph.target",
        "Target": "captum_iglens.graph.target",
    },
)

__all__ = ["ModelGraph", "TARGETS", "Target", "read_eap_json"]

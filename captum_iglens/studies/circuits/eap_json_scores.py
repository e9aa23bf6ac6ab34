r"""
An EAP-IG graph file as an edge scorer of the circuit harness
(``SCORERS["eap-json"]``, the method ``eap-json:PATH``): the edge scores of
any graph that EAP-IG's ``Graph.to_json`` wrote, or anything that writes its
format (:mod:`~captum_iglens.graph.eap_json`), whoever computed them; the
harness ranks and prunes them as it does its own methods' scores. The file's
``in_graph`` flags are not used: its circuits are the harness's top-``k%``
edges of its scores.
"""

import torch
from torch import Tensor

from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.graph.circuit import edge_matrix
from captum_iglens.graph.eap_json import read_eap_json


def file_scores(path: str, model: CircuitModel) -> Tensor:
    r"""
    An EAP-IG graph file's edge scores, checked against the model.

    Args:
        path (str): The file.
        model (CircuitModel): The bound model (its graph and width).

    Returns:
        *Tensor*: ``(S, R)`` float64, NaN off the graph's edges.

    Raises:
        ValueError: Naming the file and the field, if the file is not the
            model's graph (:func:`~captum_iglens.graph.eap_json.read_eap_json`).
    """
    scores, _ = read_eap_json(path, model.graph, model.d_model)
    return edge_matrix(model.graph, torch.from_numpy(scores))


def eap_json_scores(context: ScoringContext) -> Tensor:
    r"""
    The scores of the file ``context.path`` (:func:`file_scores`).

    Args:
        context (ScoringContext): The model and the file's path.

    Returns:
        *Tensor*: ``(S, R)`` float64.

    Raises:
        ValueError: If the context has no path, or the file is not the
            model's graph.
    """
    if context.path is None:
        raise ValueError("path: eap-json scores a file; expected eap-json:PATH")
    return file_scores(context.path, context.model)

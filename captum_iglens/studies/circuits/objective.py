r"""
What a circuit search optimizes: the faithfulness of circuits on a fixed set
of pairs (the training pairs of ``--train``), as an :class:`Objective`: ``f``
of circuits, and the gradient of ``f`` with respect to the circuit's edge
mask at the circuit itself. :class:`PatchedObjective` is MIB's ``f`` on a
model by edge patching (:mod:`~captum_iglens.studies.circuits.patching`); a
search (:mod:`~captum_iglens.studies.circuits.search`) sees only this
interface, so a synthetic objective can stand in for a model.

For a mask ``c`` (1 for an edge in the circuit), receiver ``w`` reads
``x_w = Σ_u z'_u + Σ_u c_uw (z_u − z'_u)``, so

.. math::

    \frac{\partial m}{\partial c_{uw}} = (z_u - z'_u) \cdot
        \frac{\partial m}{\partial x_w}

with ``z_u`` the sender's write *in the patched run*: EAP's score, taken at
the circuit's own patched state instead of the clean run (at the full
circuit it is EAP). It is the first-order change of ``m`` when the edge is
added (outside the circuit) or removed (inside, with the opposite sign).
"""

from typing import Callable, Dict, Iterator, List, Protocol, Sequence, Tuple, TypeVar

import torch
from torch import Tensor

from captum_iglens.graph.target import metric as metric_of
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.distributed import computed_in_order

Value = TypeVar("Value")


class Objective(Protocol):
    r"""
    The faithfulness of circuits on fixed pairs: ``f(C) = (m̄(C) − m̄(∅)) /
    (m̄(N) − m̄(∅))``, means over the pairs.
    """

    def faithfulness(self, keeps: Sequence[Tensor]) -> List[float]:
        r"""
        ``f`` of each circuit.

        Args:
            keeps (list[Tensor]): Circuits, each ``(S, R)`` bool.

        Returns:
            *list[float]*: ``f`` of each, in order.
        """

    def gradient(self, keep: Tensor) -> Tensor:
        r"""
        ``∂f / ∂c`` at the circuit ``keep``, for every edge.

        Args:
            keep (Tensor): ``(S, R)`` bool, the circuit.

        Returns:
            *Tensor*: ``(S, R)`` float64.
        """


class PatchedObjective:
    r"""
    MIB's faithfulness on a model's pairs by edge patching, the
    counterfactual writes and ``m`` of the full model and the empty circuit
    computed once. Under ``torch.distributed`` each process runs every
    ``world_size``-th batch and keeps only its writes; the batches' values are
    gathered and added in batch order
    (:func:`~captum_iglens.studies.distributed.computed_in_order`), so every
    process sees one process's ``f`` and gradients to the last bit.

    Args:

        model (CircuitModel): The bound model.
        batches (list[Batch]): The pairs.
        metric (str): The kind of ``m``
                    (:data:`~captum_iglens.graph.target.TARGETS`).

    Raises:
        ValueError: If there is no pair, or ``m`` is the same for the full
            model and the empty circuit (``f`` is undefined).
    """

    def __init__(
        self, model: CircuitModel, batches: Sequence[Batch], metric: str
    ) -> None:
        if not batches:
            raise ValueError("batches: expected at least one batch of pairs")
        self.model, self.batches, self.metric = model, list(batches), metric
        self.n_pairs = sum(len(b.index) for b in self.batches)
        self.writes: Dict[int, Tensor] = {}  # this process's batches'

        def ends(i: int) -> Tuple[float, float]:
            batch = self.batches[i]
            with torch.no_grad():
                other = model.run(batch.counterfactual, return_writes=True)
                assert other.writes is not None
                self.writes[i] = other.writes
                full = self._m(model.run(batch.clean).logits, batch).sum()
            return float(full), float(self._m(other.logits, batch).sum())

        full = empty = 0.0
        for batch_full, batch_empty in self._each_batch(ends):
            full, empty = full + batch_full, empty + batch_empty
        self.full, self.empty = full / self.n_pairs, empty / self.n_pairs
        if self.full == self.empty:
            raise ValueError(
                "batches: m is the same for the full model and the empty circuit; "
                "f is undefined"
            )

    def _each_batch(self, compute: Callable[[int], Value]) -> Iterator[Value]:
        """``compute`` of each batch's index, in order, shared by the processes."""
        return computed_in_order(range(len(self.batches)), compute)

    def _m(self, logits: Tensor, batch: Batch) -> Tensor:
        return metric_of(self.metric, logits, batch.answer, batch.foil).double()

    def faithfulness(self, keeps: Sequence[Tensor]) -> List[float]:
        """``f`` of each circuit (:meth:`Objective.faithfulness`)."""

        def sums(i: int) -> List[float]:
            batch, other = self.batches[i], self.writes[i]
            with torch.no_grad():
                logits = (  # one circuit's run held at a time
                    self.model.run(batch.clean, keep=keep, counterfactual=other).logits
                    for keep in keeps
                )
                return [float(self._m(z, batch).sum()) for z in logits]

        totals = [0.0] * len(keeps)
        for values in self._each_batch(sums):
            totals = [t + v for t, v in zip(totals, values)]
        return [self._scale(t - self.empty * self.n_pairs) for t in totals]

    def gradient(self, keep: Tensor) -> Tensor:
        """``∂f / ∂c`` at ``keep`` (:meth:`Objective.gradient`)."""

        def products(i: int) -> Tensor:
            batch, other = self.batches[i], self.writes[i]
            run = self.model.run(
                batch.clean,
                keep=keep,
                counterfactual=other,
                return_writes=True,
                receiver_grads=True,
            )
            assert run.writes is not None
            value = self._m(run.logits, batch).sum()
            grads = torch.autograd.grad(value, run.inputs, materialize_grads=True)
            return (
                torch.einsum(  # float32: a ranking's precision
                    "bstd,brtd->sr", run.writes - other, torch.cat(grads, 1)
                )
                .double()
                .cpu()
            )

        total = torch.zeros(self.model.graph.legal.shape, dtype=torch.float64)
        for batch_products in self._each_batch(products):
            total += batch_products
        return total / self.n_pairs / (self.full - self.empty)

    def _scale(self, total: float) -> float:
        """The mean over pairs of a sum, as a change of ``f``."""
        return total / self.n_pairs / (self.full - self.empty)

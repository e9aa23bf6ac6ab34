r"""
The interface every integration path implements: how the straight segments of
a granularity's traced path are integrated, whole or split into components,
and so how the credit columns are computed.
"""

from abc import ABC, abstractmethod
from typing import ClassVar, Optional, Sequence, Tuple, Type

from torch import Tensor

from captum_iglens.attr.estimators import Estimator, Integration, SplitChains
from captum_iglens.attr.granularities.base import PathGranularity
from captum_iglens.readout.scores import TokenScore


class IntegrationPath(ABC):
    r"""
    How a granularity's columns are integrated between ``h_base`` and
    ``h_final``. Every path keeps the endpoints, so the credits of an exact
    estimator add up to ``f(h_final) - f(h_base)`` on any of them.

    A granularity traces a chain of states ``p_0 = h_base, p_1, ..., p_K =
    h_final`` and asks the path (``integration.path``) for the credits of its
    segments ``p_{j-1} → p_j``: each whole (:meth:`segments`), or some split
    into components that add up to them (:meth:`split_segments`).

    Attributes:

        name (str): The name ``path=`` takes.
        default_steps (int): The ``n_steps`` taken when none is given.
        default_method (str): The estimator taken when none is given (a name
                    in :data:`~captum_iglens.attr.estimators.ESTIMATORS`).
        companion (bool): The main job prints the onset of its block map
                    beside the map's own (the table's onset columns; the
                    first such path other than the map's own that takes the
                    settings).
        onset_meaning (str): What the onset of a block map on this path says,
                    in a few words (for legends).
        trajectory_caption (str): What the viewer's trajectory of a token
                    shows on this path: its lens level (the readout after
                    each column) beside its cumulative credit.
        learned_readout (bool): A learned readout per layer can split its
                    columns into block and lens-change parts (the columns are
                    the changes between consecutive path points).
    """

    name: ClassVar[str]
    default_steps: ClassVar[int] = 50
    default_method: ClassVar[str] = "prediction_aware"
    companion: ClassVar[bool] = False
    onset_meaning: ClassVar[str] = "its path's onset"
    trajectory_caption: ClassVar[str] = (
        "lens level: the readout after each column; cumulative credit: the "
        "credits so far, f(h_base) + all of them = p_model"
    )
    learned_readout: ClassVar[bool] = False

    def check(
        self,
        granularity: Type[PathGranularity],
        multiply_by_inputs: bool,
        baselines_given: bool,
    ) -> None:
        r"""
        Checks, before any forward, that the path can integrate a call.

        Args:

            granularity (type): The granularity's class.
            multiply_by_inputs (bool): As :class:`LayerIGLens` was built.
            baselines_given (bool): The path starts at a baseline other than
                        ``h_0``.

        Raises:
            ValueError: If the path cannot give what the call asks.
        """

    def map_needs_gradients(
        self, granularity: PathGranularity, rule: Estimator
    ) -> bool:
        r"""Whether the map of ``granularity``'s columns with ``rule`` takes a
        backward pass (else it runs under ``torch.inference_mode``)."""
        return granularity.map_needs_gradients(rule)

    @abstractmethod
    def segments(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        blocks: Optional[Sequence[int]] = None,
    ) -> Tensor:
        r"""
        The credits of every segment of the chains ``points``, each a column.

        Args:

            integration (Integration): The estimator, readout and steps; with
                        ``per_dimension``, per-dimension attributions (the
                        path-averaged gradients with ``multiply_by_inputs``
                        False).
            points (Tensor): ``(N, K + 1, d)``: ``N`` chains.
            targets (TokenScore): ``N`` rows.
            values (Tensor): ``f`` at the points, the last the model's own:
                        ``(N, K + 1)``, or with ``per_dimension`` ``(N, 1)``
                        at the last point only (a path that needs more reads
                        it).
            blocks (list[int], optional): ``K``: the path block of each
                        segment, where the granularity's columns belong to
                        blocks (a path that integrates segments together keeps
                        a block's columns together). Default: None

        Returns:
            *Tensor* ``(N, K)``, or ``(N, K, d)`` per dimension.
        """

    @abstractmethod
    def split_segments(
        self, integration: Integration, chains: SplitChains
    ) -> Tuple[Tensor, Tensor]:
        r"""
        The credits of the segments ``chains.split`` of every chain, split into
        their components, and of the segments ``chains.whole``.

        Args:

            integration (Integration): Its ``per_dimension`` asks for
                        per-dimension attributions.
            chains (SplitChains): ``N`` chains, the segments split and whole.

        Returns:
            2-element tuple: the components' columns ``(N·len(split), C)`` and
            the whole segments' ``(N·len(whole),)``, each with a trailing
            ``d`` per dimension.
        """

r"""The ``"telescoping"`` path: the straight segments between consecutive path
points, ``h_base → h_{L_1} → ... → h_{L_k}``, one integral per segment."""

from typing import Optional, Sequence, Tuple

from torch import Tensor

from captum_iglens.attr._utils.path_math import segment_ends, segment_pairs
from captum_iglens.attr.estimators import Integration, Segments, SplitChains
from captum_iglens.attr.paths.base import IntegrationPath
from captum_iglens.readout.scores import TokenScore


class Telescoping(IntegrationPath):
    r"""
    Each segment is integrated on its own (and a segment split into components
    along its own straight line), so a block's credit with an exact estimator
    is ``f(h_{L_j}) - f(h_{L_{j-1}})``: the change in what the readout makes of
    the stream across the block.
    """

    name = "telescoping"
    onset_meaning = "head can read it"
    trajectory_caption = "lens level = f(h_base) + cumulative credit"
    learned_readout = True
    companion = True

    def segments(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        blocks: Optional[Sequence[int]] = None,
    ) -> Tensor:
        rule = integration.rule
        if integration.per_dimension:
            return rule.attributions(integration, points, targets, values[:, -1])
        return rule.credits(integration, points, targets, values)

    def split_segments(
        self, integration: Integration, chains: SplitChains
    ) -> Tuple[Tensor, Tensor]:
        r"""The estimator's ``components`` of each split segment along its own
        straight line, and its credits of each whole one (each segment on its
        own: ``blocks`` changes nothing)."""
        rule, split, whole = integration.rule, chains.split, chains.whole
        stream, targets, values = chains.stream, chains.targets, chains.values
        pairs, layers = segment_pairs(stream, split)
        parts = rule.components(
            integration,
            Segments(
                pairs,
                chains.components,
                targets.repeat_interleave(len(split)),
                segment_ends(values, split).flatten(0, 1),
                layers=layers,
                parents=chains.parents,
            ),
        )
        pairs, layers = segment_pairs(stream, whole)
        ends = segment_ends(values, whole)
        whole_targets = targets.repeat_interleave(len(whole))
        if integration.per_dimension:
            found = rule.attributions(
                integration, pairs, whole_targets, ends[..., 1].flatten(), layers=layers
            )
        else:
            found = rule.credits(
                integration, pairs, whole_targets, ends.flatten(0, 1), layers=layers
            )
        return parts, found[:, 0]

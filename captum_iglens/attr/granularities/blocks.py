r"""Block and sub-layer granularities: one column per block, or two."""

from typing import List, Optional, Tuple

from torch.nn import Module

from captum_iglens.columns import PARTS, Column
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr.granularities.base import PathGranularity


class Blocks(PathGranularity):
    """One column per block: the segment from the previous block's output."""

    name = "block"
    learned_readout = True

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        return [(m, False) for m in self.layers], list(self.layer_names)

    def column_blocks(self) -> Optional[List[int]]:
        return list(range(len(self.layers)))


class Sublayers(PathGranularity):
    """Two columns per block, ``"<name>.attn"`` (up to the mid-block state) and
    ``"<name>.mlp"`` (the rest of the block)."""

    name = "sublayer"
    learned_readout = True

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        points: List[PathPoint] = []
        names: List[str] = []
        for name, mid, block in zip(self.layer_names, mids, self.layers):
            points += [(mid, True), (block, False)]
            names += [Column("sublayer", name, part).name for part in PARTS]
        return points, names

    def column_blocks(self) -> Optional[List[int]]:
        return [j for j in range(len(self.layers)) for _ in ("attn", "mlp")]

    def _mids(self) -> List[Module]:
        if self.sublayers is None:
            raise ValueError(
                f"granularity: {self.name!r} needs the module in front of each "
                "block's MLP "
                "(sublayers=); from_model sets it except for architectures that add "
                "attention and MLP in parallel (GPT-J, Phi, Cohere, parallel Falcon, "
                "GPT-NeoX/StableLM with use_parallel_residual, ...), which have no "
                "residual state between the two, and for model types probed or "
                "registered without mid= (register_architecture(..., mid=...))"
            )
        return self.sublayers

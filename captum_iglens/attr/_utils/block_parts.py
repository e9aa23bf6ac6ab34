r"""
The modules of each chosen block that the component granularities split
(attention output projections, MLPs, their norms, experts), and the generic
maths of their output projections.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, cast

import torch
from torch import Tensor
from torch.nn import Linear, Module
from captum_iglens.columns import Column
from captum_iglens._utils.offload import execution_device, onloaded, parameter

if TYPE_CHECKING:
    from captum_iglens.hf.parts import ModelParts


def split_tolerance(dtype: torch.dtype) -> float:
    """How far the recomputed head outputs may be from the model's attention
    update, relative to its size: float rounding only."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


#: The fields of :class:`BlockParts` that hold one module per block, named as
#: the architecture table (:class:`~captum_iglens.hf.table.Architecture`) and
#: :class:`~captum_iglens.hf.parts.ModelParts` name them.
PER_BLOCK = ("attn_out", "attn_norm", "parallel_mlp", "mlp_out", "mlp_norm", "experts")


@dataclass(frozen=True)
class BlockParts:
    r"""
    The modules inside each chosen block that the component granularities split
    (``"head"``, ``"source"``, ``"neuron"``, ``"expert"``), with the names of the
    architecture table's entries.

    Args:
        attn_out (list[Module]): One per block: the attention output
                    projection (``nn.Linear`` or GPT-2's ``Conv1D``), whose input
                    is the heads' outputs side by side, ``(B, T, H · d_head)``.
        n_heads (int): Number of attention heads ``H``.
        attn_scale (float): The factor the block applies to the attention
                    output (and the MLP output) before adding it to the stream
                    (Granite's ``residual_multiplier``). Default: 1.0
        attn_norm (list[Module], optional): One per block: the RMSNorm the
                    block applies to the projection's output before adding it
                    to the stream (Gemma 2/3/4, OLMo 2/3), or None. Default: None
        parallel_mlp (list[Module], optional): One per block: the MLP whose
                    output the block adds beside the attention output, both read
                    from the block's input (a parallel block: GPT-J, Phi,
                    Cohere, ...), or None for sequential blocks. Default: None
        mlp_out (list[Module], optional): One per block: the MLP's output
                    projection, whose input is the neurons' activations, for
                    ``granularity="neuron"`` (its output, times ``attn_scale``,
                    is the update after the mid-block state). Default: None
        mlp_norm (list[Module], optional): One per block: the RMSNorm on the
                    MLP's output before it is added (Gemma 2/3, OLMo 2/3), or
                    None. Default: None
        experts (list[Module], optional): One per block: the routed experts
                    of its mixture-of-experts MLP, for ``granularity="expert"``.
                    Default: None
        shared_experts (bool): Whether the MoE MLPs add shared experts.
                    Default: False
    """

    attn_out: List[Module]
    n_heads: int
    attn_scale: float = 1.0
    attn_norm: Optional[List[Module]] = None
    parallel_mlp: Optional[List[Module]] = None
    mlp_out: Optional[List[Module]] = None
    mlp_norm: Optional[List[Module]] = None
    experts: Optional[List[Module]] = None
    shared_experts: bool = False

    @classmethod
    def of_model(
        cls, parts: "ModelParts", chosen: Sequence[int]
    ) -> Optional["BlockParts"]:
        r"""
        The parts of the chosen blocks of a model.

        Args:
            parts (ModelParts): The model's parts.
            chosen (list[int]): Indices of the chosen blocks.

        Returns:
            *BlockParts*, or None where the model has no attention output
            projection to split (``attn_out`` is None).
        """
        if parts.attn_out is None:
            return None
        per_block: Dict[str, Optional[List[Module]]] = {}
        for name in PER_BLOCK:
            modules = getattr(parts, name)
            per_block[name] = None if modules is None else [modules[i] for i in chosen]
        return cls(
            n_heads=cast(int, parts.n_heads),  # set where attn_out is
            attn_scale=parts.attn_scale,
            shared_experts=parts.shared_experts,
            **per_block,  # type: ignore[arg-type]  # attn_out is not None
        )

    def __post_init__(self) -> None:
        if isinstance(self.n_heads, bool) or not isinstance(self.n_heads, int):
            raise TypeError(f"n_heads: expected an int, got {self.n_heads!r}")
        for module in self.attn_out:
            weight = projection_weight(module)
            if weight.shape[1] % self.n_heads:
                raise ValueError(
                    f"n_heads: the attention output projection takes "
                    f"{weight.shape[1]} inputs, not a multiple of {self.n_heads} heads"
                )
        for name in PER_BLOCK[1:]:
            modules = getattr(self, name)
            if modules is not None and (
                len(modules) != len(self.attn_out)
                or not all(isinstance(m, Module) for m in modules)
            ):
                raise ValueError(
                    f"{name}: expected one torch.nn.Module per block "
                    f"({len(self.attn_out)}), got {modules!r}"
                )
        if self.attn_norm is not None and self.parallel_mlp is not None:
            raise ValueError(
                "attn_norm, parallel_mlp: a block either normalises its attention "
                "output (attn_norm) or adds it beside its MLP (parallel_mlp), not "
                "both"
            )

    @property
    def parallel(self) -> bool:
        """Whether the blocks add attention and MLP along one segment."""
        return self.parallel_mlp is not None

    def column_names(self, block: str, index: int) -> List[str]:
        """The credit columns of one block's attention."""
        names = [Column("head", block, index=h).name for h in range(self.n_heads)]
        if projection_bias(self.attn_out[index]) is not None:
            names.append(Column("bias", block, "attn").name)
        return names


def check_block_parts(
    block_parts: Optional[BlockParts], n_blocks: int
) -> Optional[BlockParts]:
    r"""
    Returns:
        ``block_parts``, checked.

    Raises:
        ValueError: If ``block_parts`` is not None nor a :class:`BlockParts`
            with one attention output projection per block.
    """
    if block_parts is not None and (
        not isinstance(block_parts, BlockParts) or len(block_parts.attn_out) != n_blocks
    ):
        raise ValueError(
            f"block_parts: expected a BlockParts with one attention output "
            f"projection per block ({n_blocks}), got {block_parts!r}"
        )
    return block_parts


def _is_projection(module: Module) -> bool:
    return isinstance(module, Linear) or (
        type(module).__name__ == "Conv1D" and hasattr(module, "nf")
    )


def _projection(module: Module) -> Module:
    """The ``nn.Linear`` (or GPT-2 ``Conv1D``) that computes the projection:
    ``module`` itself, or the only one inside a wrapper around it (e.g. the
    module a TransformerLens bridge puts in its place)."""
    if _is_projection(module):
        return module
    inner = [m for m in module.modules() if _is_projection(m)]
    if len(inner) != 1:
        raise TypeError(
            "heads: the attention output projection must be an nn.Linear or GPT-2's "
            f"Conv1D (or wrap exactly one), got {type(module).__name__}"
        )
    return inner[0]


def projection_weight(module: Module) -> Tensor:
    """The projection's weight as ``(d, H · d_head)`` (``y = z W^T + b``)."""
    module = _projection(module)
    weight = parameter(module, "weight")  # offloaded: from accelerate's store
    assert isinstance(weight, Tensor)
    if isinstance(module, Linear):
        return weight
    return weight.t()  # GPT-2's Conv1D computes z @ W + b


def projection_bias(module: Module) -> Optional[Tensor]:
    return parameter(_projection(module), "bias")


def output_factors(
    norms: Optional[Sequence[Module]], scale: float, outputs: Tensor, updates: Tensor
) -> Tensor:
    r"""
    :func:`attention_factors` for any output projection: ``scale`` without
    ``norms``, else per block the RMSNorm factor ``γ̂ · r`` fitted to
    ``updates``.

    Args:
        norms (list[Module], optional): Per block, the RMSNorm on the output.
        outputs (Tensor): ``(B, P, k, d)`` float32: the projections' outputs.
        updates (Tensor): ``(B, P, k, d)`` float32: the stream's changes.

    Returns:
        *Tensor* ``(B, P, k, d)`` float32 (``(1, 1, 1, 1)`` without norms).
    """
    if norms is None:
        return torch.full((1, 1, 1, 1), float(scale), device=outputs.device)
    d = outputs.shape[-1]
    gammas = []
    for norm in norms:
        probe = next(norm.parameters(), None)
        ones = torch.ones(1, d, device=outputs.device)
        if probe is not None:
            ones = ones.to(device=execution_device(norm), dtype=probe.dtype)
        # forward, not __call__: no one's hooks run (offloaded weights loaded)
        with torch.no_grad(), onloaded(norm):
            gammas.append(norm.forward(ones).float().view(d).to(outputs.device))
    scaled = outputs * torch.stack(gammas)  # (B, P, k, d)
    power = scaled.square().sum(-1, keepdim=True)
    along = (scaled * updates).sum(-1, keepdim=True)
    r = torch.where(power > 0, along / power.clamp_min(1e-30), torch.zeros_like(power))
    return torch.stack(gammas) * r

r"""The parts of a Hugging Face causal LM that IG-Lens reads, bound once per model.

:class:`ModelParts` holds, for one model and its entry of the architecture table
(:class:`~captum_iglens.hf.table.Architecture`), the modules every entry point
needs: the decoder blocks, each block's mid-block module and attention output
projection, and the readout's final norm, head and final transform. They are
resolved from the entry's dotted paths once, by :meth:`ModelParts.bind`;
:func:`captum_iglens.hf.architectures.model_parts` unwraps, looks the model up
and binds it.
"""

import operator
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from torch import nn

from captum_iglens.hf.table import Architecture
from captum_iglens.readout.readout import Readout

_MISSING = object()


@dataclass(frozen=True, eq=False)
class ModelParts:
    r"""The modules of one Hugging Face causal LM that IG-Lens reads.

    The modules are the model's own (no copies), except ``post``, a new
    parameter-free transform, and an ``nn.Sequential`` that chains the final
    norm and output projection where the model has both (OPT with
    ``word_embed_proj_dim != hidden_size``). The logits are
    ``post(head(norm(h)))`` for the last block's output ``h``.

    Args:
        model (nn.Module): The (unwrapped) ``*ForCausalLM`` model.
        architecture (Architecture): Its verified entry of the table.
        blocks (list[nn.Module]): The decoder blocks, in execution order.
        mid (list[nn.Module] or None): For each block, the module whose
                    input is the mid-block state ``h + attn(...)``; None where
                    the architecture (as configured) adds attention and MLP in
                    parallel, or the probe found the parts.
        attn_out (list[nn.Module] or None): For each block, the
                    attention output projection whose input is the heads'
                    outputs side by side; None where there is no split of the
                    attention update into heads.
        n_heads (int or None): The number of attention heads, with
                    ``attn_out``.
        attn_scale (float): The factor each block applies to its attention
                    output before adding it to the stream.
        attn_norm (list[nn.Module] or None): For each block, the RMSNorm
                    it applies to the attention output projection's output
                    before adding it (post-norm families), or None.
        parallel_mlp (list[nn.Module] or None): For each block, the MLP whose
                    output it adds beside the attention output (parallel
                    blocks), or None for sequential blocks.
        mlp_out (list[nn.Module] or None): For each block, the MLP's
                    output projection, whose input is the neurons' activations;
                    None where there is no neuron split.
        mlp_norm (list[nn.Module] or None): For each block, the RMSNorm on the
                    MLP's output before it is added, or None.
        experts (list[nn.Module] or None): For each block, the routed experts
                    of its mixture-of-experts MLP; None unless every block has
                    them.
        shared_experts (bool): Whether the MoE MLPs add shared experts.
        norm (nn.Module or None): The final norm (and output projection), or
                    None if the model applies none.
        head (nn.Module): The unembedding, ``(..., d)`` to ``(..., V)``.
        post (nn.Module or None): The transform of the head's output
                    (:class:`~captum_iglens.readout.Softcap`, ...), or None.

    The per-block fields carry the names of the architecture table's entries
    (:class:`~captum_iglens.hf.table.Architecture`), and so do the chosen
    blocks' :class:`~captum_iglens.attr._utils.block_parts.BlockParts`.
    """

    model: nn.Module
    architecture: Architecture
    blocks: List[nn.Module]
    mid: Optional[List[nn.Module]]
    attn_out: Optional[List[nn.Module]]
    n_heads: Optional[int]
    attn_scale: float
    attn_norm: Optional[List[nn.Module]]
    parallel_mlp: Optional[List[nn.Module]]
    mlp_out: Optional[List[nn.Module]]
    mlp_norm: Optional[List[nn.Module]]
    experts: Optional[List[nn.Module]]
    shared_experts: bool
    norm: Optional[nn.Module]
    head: nn.Module
    post: Optional[nn.Module]

    @classmethod
    def bind(cls, model: nn.Module, arch: Architecture) -> "ModelParts":
        r"""Resolves the dotted paths of the entry ``arch`` on ``model``.

        Args:
            model (nn.Module): A ``*ForCausalLM`` model.
            arch (Architecture): Its entry of the table (not looked up here).

        Returns:
            *ModelParts* of ``model``.

        Raises:
            ValueError: If the model lacks a module the entry names.
        """
        norm, head = _final_norm(model, arch), _head(model, arch)
        blocks = _blocks(model, arch)
        config: Any = model.config
        projections = _in_blocks(
            model, blocks, arch.attn_out(config), "the attention output projection"
        )
        return cls(
            model=model,
            architecture=arch,
            blocks=blocks,
            mid=_in_blocks(model, blocks, arch.mid(config), "the mid-block state"),
            attn_out=projections,
            n_heads=None if projections is None else config.num_attention_heads,
            attn_scale=float(arch.attn_scale(config)),
            attn_norm=_in_blocks(
                model, blocks, arch.attn_norm(config), "the attention output's norm"
            ),
            parallel_mlp=_in_blocks(
                model, blocks, arch.parallel_mlp(config), "the parallel MLP"
            ),
            mlp_out=_in_blocks(
                model, blocks, arch.mlp_out(config), "the MLP output projection"
            ),
            mlp_norm=_in_blocks(
                model, blocks, arch.mlp_norm(config), "the MLP output's norm"
            ),
            experts=_experts(blocks, arch.experts(config)),
            shared_experts=bool(arch.shared_experts(config)),
            norm=norm,
            head=head,
            post=arch.post(model),
        )

    @property
    def norm_kind(self) -> str:
        r"""The kind of the final norm, one of
        :data:`~captum_iglens.hf.table.NORM_KINDS`."""
        return self.architecture.norm_kind

    def choose(self, layers: Optional[Sequence[int]]) -> List[int]:
        r"""The one rule for choosing decoder blocks: sorted, unique indices, with
        the last block always included.

        Args:
            layers (list[int], optional): Block indices (negative ones count from
                        the end); booleans are refused. Default: all blocks.

        Returns:
            *list[int]*: the chosen block indices, in ``[0, n)``, ending with
            ``n - 1``.
        """
        n = len(self.blocks)
        if layers is None:
            return list(range(n))
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise TypeError(
                f"layers: expected a list of block indices, got {type(layers).__name__}"
            )
        indices = [_block_index(index, n) for index in layers]
        return sorted({i % n for i in indices} | {n - 1})

    def readout(self, *, max_chunk_bytes: int = 256 * 2**20) -> Readout:
        r"""The readout ``post(head(norm(h)))`` of the model.

        Args:
            max_chunk_bytes (int, optional): See :class:`Readout`.
                        Default: 256 * 2**20 (256 MiB)

        Returns:
            *Readout* referencing the model's own modules.
        """
        return Readout(self.head, self.norm, self.post, max_chunk_bytes=max_chunk_bytes)


def _lookup(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for name in path.split("."):
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _resolve(model: nn.Module, path: str) -> Optional[nn.Module]:
    obj = _lookup(model, path)
    if obj is _MISSING:
        raise ValueError(
            f"{type(model).__name__} (model_type={_model_type(model)!r}) "
            f"has no attribute {path!r}, where the architecture table expects "
            "it. Load the model with AutoModelForCausalLM, or build "
            "Readout(head=..., norm=..., post=...) by hand and pass layer= "
            "explicitly."
        )
    return obj


def _blocks(model: nn.Module, arch: Architecture) -> List[nn.Module]:
    blocks = _resolve(model, arch.layers)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or not len(blocks):
        raise ValueError(
            f"{type(model).__name__}: {arch.layers!r} is not a non-empty "
            "nn.ModuleList of decoder blocks"
        )
    return list(blocks)


def _in_blocks(
    model: nn.Module,
    blocks: List[nn.Module],
    path: Union[None, str, Tuple[str, ...]],
    what: str,
) -> Optional[List[nn.Module]]:
    """The module at ``path`` (one path, or one per block) inside each block."""
    if path is None:
        return None
    paths = [path] * len(blocks) if isinstance(path, str) else list(path)
    if len(paths) != len(blocks):
        raise ValueError(
            f"{type(model).__name__}: the architecture table gives {len(paths)} "
            f"paths of {what}, one per block, for {len(blocks)} decoder blocks"
        )
    modules = [_lookup(block, p) for block, p in zip(blocks, paths)]
    for module, p in zip(modules, paths):
        if not isinstance(module, nn.Module):
            raise ValueError(
                f"{type(model).__name__}: a decoder block has no module {p!r}, "
                f"where the architecture table expects {what}"
            )
    return modules


def _experts(blocks: List[nn.Module], path: Optional[str]) -> Optional[List[nn.Module]]:
    """The routed experts at ``path`` in every block, or None where a block has
    none (a dense block among MoE ones)."""
    if path is None:
        return None
    found = [_lookup(block, path) for block in blocks]
    return found if all(isinstance(m, nn.Module) for m in found) else None


def _final_norm(model: nn.Module, arch: Architecture) -> Optional[nn.Module]:
    norms = [m for m in (_resolve(model, p) for p in arch.norm) if m is not None]
    if len(norms) < 2:
        return norms[0] if norms else None
    return nn.Sequential(*norms)


def _head(model: nn.Module, arch: Architecture) -> nn.Module:
    heads = [p for p in arch.head if _lookup(model, p) is not _MISSING]
    if len(heads) != 1:
        raise ValueError(
            f"{type(model).__name__} (model_type={_model_type(model)!r}) must "
            f"have exactly one of the head attributes {arch.head}; found "
            f"{heads or 'none'}. Load the model with AutoModelForCausalLM, or "
            "build Readout(head=..., norm=..., post=...) by hand and pass layer= "
            "explicitly."
        )
    head = _resolve(model, heads[0])
    if head is None:
        raise ValueError(
            f"{type(model).__name__}.{heads[0]} is None: the readout needs the "
            "output head"
        )
    return head


def _model_type(model: nn.Module) -> Any:
    return getattr(getattr(model, "config", None), "model_type", None)


def _block_index(index: Any, n: int) -> int:
    """An integer block index in ``[-n, n)``: Python, numpy and 0-d torch integers
    are accepted, booleans and floats are not."""
    try:
        value = None if isinstance(index, bool) else operator.index(index)
    except TypeError:
        value = None
    if value is None:
        raise TypeError(
            f"layers: expected integer block indices, got {index!r} "
            f"({type(index).__name__})"
        )
    if not -n <= value < n:
        raise ValueError(f"layers: expected block indices in [-{n}, {n}), got {value}")
    return value

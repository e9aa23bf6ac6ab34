r"""
A model run node by node, so that every receiver of the model's graph
(:class:`~captum_iglens.graph.model_graph.ModelGraph`, with separate query,
key and value reads) can read its own residual stream: MIB's edge patching.

In a patched run, receiver ``w`` reads

.. math::

    x_w = \sum_u z'_u + \sum_u c_{uw} (z_u - z'_u)

where ``z_u`` is sender ``u``'s write *in this run* (computed from its own
patched inputs), ``z'_u`` its write in the counterfactual run, and
``c_{uw}`` is 1 for edges in the circuit. With every edge in, the run is the
model's clean forward; with none, it is the counterfactual forward.

A head's write is its output projected by its own columns of the output
projection; where the family normalizes the attention output before adding
it (Gemma 2/3, OLMo 2), each head's write is its share of the normalized
sum, ``g ⊙ o_h / rms(Σ_h o_h)``, so the writes add up to the block's update.
Key and value receivers are per query head (grouped key-value heads are
ungrouped, as TransformerLens' split inputs do), so a head's keys and values
are its own. Supported: sequential pre-norm blocks with separate q/k/v
projections and an RMSNorm before attention (Llama, Mistral, Qwen 2/3,
Gemma 1/2/3 and their kin); anything else is refused when the model is bound.
"""

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.attention import attention_of
from captum_iglens.graph.model_graph import ModelGraph, model_graph
from captum_iglens.hf.architectures import model_parts


def _rms_gain(norm: Module, d: int, what: str) -> Tuple[Tensor, float]:
    r"""The gain ``g`` and epsilon of an RMSNorm (``g ⊙ x / rms(x)``), read
    from the module's output on a constant vector and checked on a random one.

    Raises:
        ValueError: If ``norm`` is not an RMSNorm of that form.
    """
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    weight = getattr(norm, "weight", None)
    if not isinstance(eps, float) or weight is None:
        raise ValueError(f"model: {what} is not an RMSNorm ({type(norm).__name__})")
    with torch.no_grad():
        ones = torch.ones(1, d, dtype=weight.dtype, device=weight.device)
        gain = (norm(ones)[0] * math.sqrt(1 + eps)).float()
        probe = torch.randn(3, d, generator=torch.Generator().manual_seed(0))
        probe = probe.to(weight.device, weight.dtype)
        expected = (
            gain
            * probe.float()
            * torch.rsqrt(probe.float().pow(2).mean(-1, keepdim=True) + eps)
        )
        if not torch.allclose(norm(probe).float(), expected, rtol=1e-3, atol=1e-4):
            raise ValueError(f"model: {what} is not an RMSNorm ({type(norm).__name__})")
    return gain, eps


@dataclass
class _Layer:
    attn: Any  # the family's attention module, its projections read by name
    in_norm: Module
    mid_norm: Module
    mlp: Module
    attn_norm: Optional[Tuple[Tensor, float]]
    mlp_norm: Optional[Module]
    rotary: Callable[..., Tuple[Tensor, Tensor]]
    window: Optional[int]


@dataclass
class Run:
    r"""
    What one node-by-node run returns.

    Attributes:

        logits (Tensor): The last position's logits, ``(B, V)`` float32.
        writes (Tensor or None): Every sender's write, ``(B, S, T, d)``
                    (detached), where asked.
        inputs (list[Tensor]): Where asked for gradients: the receivers'
                    inputs in graph order, one ``(B, R_i, T, d)`` tensor per
                    group (each layer's ``3H`` attention receivers, its MLP,
                    and ``logits``), part of the autograd graph of ``logits``.
    """

    logits: Tensor
    writes: Optional[Tensor]
    inputs: List[Tensor]


class CircuitModel:
    r"""
    A Hugging Face causal LM bound for node-by-node runs.

    Args:

        model (Module): A ``*ForCausalLM`` model of a supported family (see
                    the module's docstring), float32 or not, on one device.

    Attributes:

        graph (ModelGraph): The model's graph, with separate query, key and
                    value reads (one per query head).
        d_model (int): The residual stream's width.

    Raises:
        ValueError: If the model's blocks are not of a supported form.
    """

    def __init__(self, model: Module) -> None:
        parts = model_parts(model)
        config: Any = model.config
        if parts.attn_out is None or parts.n_heads is None or parts.mid is None:
            raise ValueError(
                f"model: {type(model).__name__} has no split attention heads "
                "and mid-block state"
            )
        if parts.parallel_mlp is not None or parts.attn_scale != 1.0:
            raise ValueError(
                "model: parallel or scaled blocks are not supported by edge patching"
            )
        self.model: Any = model
        self.parts = parts
        self.n_heads = parts.n_heads
        d = config.hidden_size
        self.d_model: int = d
        self.layers: List[_Layer] = []
        for i, block in enumerate(parts.blocks):
            attn: Any = attention_of(block, parts.attn_out[i])
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                if not isinstance(getattr(attn, name, None), torch.nn.Linear):
                    raise ValueError(
                        f"model: block {i}'s attention has no linear {name}"
                    )
            if attn.o_proj.bias is not None:
                raise ValueError("model: an attention output bias is not supported")
            in_norm, mlp = (
                getattr(block, "input_layernorm", None),
                getattr(block, "mlp", None),
            )
            if in_norm is None or mlp is None:
                raise ValueError(f"model: block {i} has no input_layernorm and mlp")
            family = sys.modules[type(attn).__module__]
            norm = parts.attn_norm[i] if parts.attn_norm is not None else None
            self.layers.append(
                _Layer(
                    attn=attn,
                    in_norm=in_norm,
                    mid_norm=parts.mid[i],
                    mlp=mlp,
                    attn_norm=None
                    if norm is None
                    else _rms_gain(norm, d, "the attention output's norm"),
                    mlp_norm=parts.mlp_norm[i] if parts.mlp_norm is not None else None,
                    rotary=getattr(family, "apply_rotary_pos_emb"),
                    window=getattr(attn, "sliding_window", None),
                )
            )
        self.graph = self._graph()
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self._positions: Dict[Tuple[int, str], List[Any]] = {}

    def _graph(self) -> ModelGraph:
        """The model's graph, with separate query, key and value reads and
        the key/value heads read from the first block's projections where
        they are grouped."""
        attn = self.layers[0].attn
        n_kv = attn.k_proj.out_features // attn.head_dim
        grouped = n_kv if n_kv != self.n_heads else None
        return model_graph(len(self.layers), self.n_heads, True, grouped)

    def _position_embeddings(self, ids: Tensor) -> List[Any]:
        """Each block's rotary ``(cos, sin)`` for ``T`` positions, as the model
        passes them, read by hooks on one forward of the first row."""
        key = (ids.shape[1], str(ids.device))
        if key not in self._positions:
            seen: List[Any] = [None] * len(self.layers)
            handles = []

            def keep(index: int) -> Callable[..., None]:
                def hook(module: Module, args: Any, kwargs: Dict[str, Any]) -> None:
                    seen[index] = kwargs.get("position_embeddings")

                return hook

            try:
                for i, block in enumerate(self.parts.blocks):
                    handles.append(
                        block.register_forward_pre_hook(keep(i), with_kwargs=True)
                    )
                with torch.no_grad():
                    self.model(input_ids=ids[:1])
            finally:
                for handle in handles:
                    handle.remove()
            if any(p is None for p in seen):
                raise ValueError("model: its blocks take no rotary position embeddings")
            self._positions[key] = seen
        return self._positions[key]

    def run(
        self,
        ids: Tensor,
        *,
        keep: Optional[Tensor] = None,
        counterfactual: Optional[Tensor] = None,
        override: Optional[Tuple[int, Tensor]] = None,
        return_writes: bool = False,
        receiver_grads: bool = False,
    ) -> Run:
        r"""
        One run, node by node.

        Args:

            ids (Tensor): Token ids ``(B, T)``.
            keep (Tensor, optional): ``(S, R)`` 0/1, the circuit's edges;
                        with ``counterfactual``. None: every edge (the model's
                        own forward). Default: None
            counterfactual (Tensor, optional): The senders' writes in the
                        counterfactual run, ``(B, S, T, d)``. Default: None
            override (tuple, optional): ``(group, writes)``: a sender group
                        (0: ``input``; ``2l + 1``: layer ``l``'s heads;
                        ``2l + 2``: its MLP) and the writes ``(B, n, T, d)``
                        that replace the group's (EAP-IG's interpolations).
                        Default: None
            return_writes (bool): Return every sender's write. Default: False
            receiver_grads (bool): Make the receivers' inputs tensors of the
                        autograd graph and return them (a receiver the circuit
                        cuts off from every sender reads the counterfactual
                        stream, then a leaf of its own). Default: False

        Returns:
            *Run*.
        """
        if (keep is None) != (counterfactual is None):
            raise ValueError("keep and counterfactual: give both or neither")
        positions = self._position_embeddings(ids)
        embedding: Any = self.model.get_input_embeddings()
        embed = embedding(ids).float()
        if override is not None and override[0] == 0:
            embed = override[1][:, 0]
        if receiver_grads:  # every receiver's input in the graph of the logits
            embed = embed.detach().requires_grad_(True)
        writes: List[Tensor] = []  # one (B, n, T, d) tensor per sender group
        inputs: List[Tensor] = []
        state = _Stream(keep, counterfactual, leaves=receiver_grads)

        def add(group: Tensor) -> None:
            if override is not None and override[0] == len(writes) > 0:
                group = override[1]
            writes.append(group)
            state.add(group)

        add(embed[:, None])
        for i, layer in enumerate(self.layers):
            x = state.read(3 * self.n_heads)
            inputs.append(x)
            add(self._heads(layer, x, positions[i]))
            x = state.read(1)
            inputs.append(x)
            out = layer.mlp(layer.mid_norm(x[:, 0]))
            if layer.mlp_norm is not None:
                out = layer.mlp_norm(out)
            add(out.float()[:, None])
        x = state.read(1)
        inputs.append(x)
        parts = self.parts
        final = x[:, 0, -1]
        if parts.norm is not None:
            final = parts.norm(final)
        logits = parts.head(final)
        if parts.post is not None:
            logits = parts.post(logits)
        stacked = torch.cat([w.detach() for w in writes], 1) if return_writes else None
        return Run(logits.float(), stacked, inputs if receiver_grads else [])

    def _heads(self, layer: _Layer, x: Tensor, position: Any) -> Tensor:
        r"""Each head's write ``(B, H, T, d)`` from its own query, key and
        value inputs ``x``, ``(B, 3H, T, d)``."""
        attn: Any = layer.attn
        H = self.n_heads
        B, _, T, d = x.shape
        normed = layer.in_norm(x)
        xq, xk, xv = normed[:, :H], normed[:, H : 2 * H], normed[:, 2 * H :]
        e = attn.head_dim
        group = H // (attn.k_proj.out_features // e)

        def project(linear: torch.nn.Linear, inp: Tensor, per_head: int) -> Tensor:
            weight = linear.weight.view(-1, e, d)  # (heads, e, d)
            heads = torch.arange(H, device=x.device) // per_head
            out = torch.einsum("bhtd,hed->bhte", inp, weight[heads])
            if linear.bias is not None:
                out = out + linear.bias.view(-1, e)[heads][None, :, None]
            return out

        q, k, v = (
            project(attn.q_proj, xq, 1),
            project(attn.k_proj, xk, group),
            project(attn.v_proj, xv, group),
        )
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = position
        q, k = layer.rotary(q, k, cos, sin)
        scores = torch.matmul(q, k.transpose(2, 3)) * attn.scaling
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        rows = torch.arange(T, device=x.device)
        allowed = rows[None, :] <= rows[:, None]
        if layer.window is not None:
            allowed &= rows[None, :] > rows[:, None] - layer.window
        scores = scores.masked_fill(~allowed, -float("inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        z = torch.matmul(weights, v)  # (B, H, T, e)
        out = torch.einsum(
            "bhte,dhe->bhtd", z, attn.o_proj.weight.view(d, H, e)
        ).float()
        if layer.attn_norm is not None:
            gain, eps = layer.attn_norm
            total = out.sum(1, keepdim=True)
            out = out * gain * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps)
        return out


class _Stream:
    r"""The residual streams of a run: the run's own sum of writes, the
    counterfactual's, and each receiver's patched mix of the two."""

    def __init__(
        self, keep: Optional[Tensor], counterfactual: Optional[Tensor], leaves: bool
    ) -> None:
        self.counterfactual, self.leaves = counterfactual, leaves
        self.keep = None
        if keep is not None and counterfactual is not None:
            self.keep = keep.to(counterfactual.device, torch.float32)
        self.diff: Optional[Tensor] = None  # own - counterfactual, (B, S, T, d)
        self.n = 0
        self.total: Optional[Tensor] = None
        self.other_total: Optional[Tensor] = None
        self.next_receiver = 0

    def add(self, group: Tensor) -> None:
        total = group.sum(1)
        self.total = total if self.total is None else self.total + total
        if self.counterfactual is not None:
            if self.diff is None:
                self.diff = torch.empty_like(self.counterfactual)
            rows = slice(self.n, self.n + group.shape[1])
            self.diff[:, rows] = group - self.counterfactual[:, rows]
            other = self.counterfactual[:, rows].sum(1)
            self.other_total = (
                other if self.other_total is None else self.other_total + other
            )
        self.n += group.shape[1]

    def read(self, n: int) -> Tensor:
        """The inputs ``(B, n, T, d)`` of the next ``n`` receivers; with
        ``leaves``, part of the autograd graph (a leaf where nothing the run
        wrote reaches them)."""
        x = self._mix(n)
        if self.leaves and not x.requires_grad:
            x = x.clone().requires_grad_(True)
        return x

    def _mix(self, n: int) -> Tensor:
        assert self.total is not None
        rows = slice(self.next_receiver, self.next_receiver + n)
        self.next_receiver += n
        if self.keep is None or self.counterfactual is None:
            return self.total[:, None].expand(-1, n, -1, -1)
        assert self.diff is not None and self.other_total is not None
        keep = self.keep[: self.n, rows]  # (s, n)
        cut = 1.0 - keep
        kept, dropped = (keep > 0).any(1), (cut > 0).any(1)
        if int(kept.sum()) <= int(dropped.sum()):
            base, weights, used, sign = self.other_total, keep, kept, 1.0
        else:
            base, weights, used, sign = self.total, cut, dropped, -1.0
        x = base[:, None].expand(-1, n, -1, -1)
        index = used.nonzero().flatten()
        if len(index) == self.n:  # every sender: no gather
            x = x + sign * torch.einsum(
                "sn,bstd->bntd", weights, self.diff[:, : self.n]
            )
        elif len(index):
            diff = self.diff[:, index]
            x = x + sign * torch.einsum("sn,bstd->bntd", weights[index], diff)
        return x

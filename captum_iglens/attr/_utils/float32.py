r"""
Reading half-precision weights in float32 without a whole float32 copy: a
weight is upcast a slice at a time (:func:`float32_parts`), and a readout's
half-precision linear maps are read that way (:func:`float32_copy`). On the CPU
a gradient through a float16 or bfloat16 matrix product is tens of times slower
than in float32; a whole float32 copy of a 128k × 4096 head would be 2 GiB.
"""

import copy
from typing import Any, Dict, Iterator, Optional, Set, Tuple

import torch
from torch import Tensor
from torch.nn import Linear, Module, Parameter

#: About the most bytes of a float32 copy of a weight that exist at once (a
#: weight in another dtype is read a slice at a time; a float32 weight is read
#: as it is, with no copy).
WEIGHT_BYTES = 32 * 2**20

_HALF = (torch.float16, torch.bfloat16)


def float32_parts(
    weight: Tensor, dim: int, device: torch.device
) -> Iterator[Tuple[slice, Tensor]]:
    r"""
    ``weight`` in float32 on ``device``, as slices along ``dim``: the whole
    weight, not copied, where it is float32 there already; else slices whose
    float32 copy holds about :data:`WEIGHT_BYTES` (so a bfloat16 ``W_out`` of
    ``I = 14336``, ``d = 4096`` is never a 224 MiB float32 copy).

    Yields:
        2-element tuples of *slice* along ``dim`` and the float32 *Tensor*.
    """
    size = weight.shape[dim]
    step = size
    if weight.dtype != torch.float32:
        per_index = 4 * max(1, weight.numel() // max(1, size))
        step = max(1, WEIGHT_BYTES // per_index)
    for start in range(0, size, step):
        part = slice(start, min(start + step, size))
        yield (
            part,
            weight.narrow(dim, part.start, part.stop - part.start).float().to(device),
        )


class _SlicedProduct(torch.autograd.Function):
    """``x W^T`` in float32 for a half-precision ``W``, a slice of output
    features at a time, forward and backward (the gradient reaches ``x`` only)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(weight)
        out = x.new_empty(*x.shape[:-1], weight.shape[0])
        for rows, part in float32_parts(weight, 0, x.device):
            out[..., rows] = x @ part.t()
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None]:
        (weight,) = ctx.saved_tensors
        total = grad.new_zeros(*grad.shape[:-1], weight.shape[1])
        for rows, part in float32_parts(weight, 0, grad.device):
            total += grad[..., rows] @ part
        return total, None


class Float32Linear(Module):
    r"""
    A half-precision :class:`torch.nn.Linear` read in float32: takes and gives
    float32, shares the original's weight (never copied whole; upcast about
    :data:`WEIGHT_BYTES` at a time, in the forward and in the backward) and
    holds a float32 copy of its bias.

    Args:
        linear (torch.nn.Linear): The map; it is left as it is.
    """

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.weight = linear.weight.detach()
        self.bias: Optional[Tensor] = (
            None if linear.bias is None else linear.bias.detach().float()
        )

    def forward(self, x: Tensor) -> Tensor:
        out = _SlicedProduct.apply(x.float(), self.weight)
        return out if self.bias is None else out + self.bias


def float32_copy(readout: Any) -> Any:
    r"""
    A copy of ``readout`` that computes in float32 and shares nothing it could
    write; the readout itself is left as it is. Its half-precision
    :class:`torch.nn.Linear` maps become :class:`Float32Linear` (the unembedding
    is never copied whole); its other half-precision tensors (of its modules
    and its own attributes) become float32 copies.

    Args:
        readout (PathReadout): A readout (a module, or an object holding them).

    Returns:
        *PathReadout*: the copy.
    """
    memo: Dict[int, Any] = {}
    shared: Set[int] = set()
    for module in _modules(readout, set()):
        if type(module) is Linear and _half_in_memory(module):
            memo[id(module)] = Float32Linear(module)
            shared.update(id(p) for p in module.parameters())
    for tensor in _tensors(readout, set()):
        if tensor.dtype in _HALF and id(tensor) not in shared:
            wide = tensor.detach().float()
            memo[id(tensor)] = (
                Parameter(wide, requires_grad=False)
                if isinstance(tensor, Parameter)
                else wide
            )
    return copy.deepcopy(readout, memo)


def _half_in_memory(linear: Linear) -> bool:
    """Whether a linear map's weights are half precision and in memory (not
    brought in at call time by accelerate's hooks)."""
    return (
        linear.weight.dtype in _HALF
        and linear.weight.device.type != "meta"
        and not hasattr(linear, "_hf_hook")
    )


def _modules(found: Any, seen: Set[int]) -> Iterator[Module]:
    """The modules of an object: a module and its submodules, else those of
    its attributes, each object visited once."""
    if id(found) in seen:
        return
    seen.add(id(found))
    if isinstance(found, Module):
        yield from found.modules()
    elif not isinstance(found, Tensor):
        for value in getattr(found, "__dict__", {}).values():
            yield from _modules(value, seen)


def _tensors(found: Any, seen: Set[int]) -> Iterator[Tensor]:
    """The tensors of an object: a module's parameters and buffers, else those
    of its attributes, each object visited once."""
    if id(found) in seen:
        return
    seen.add(id(found))
    if isinstance(found, Tensor):
        yield found
    elif isinstance(found, Module):
        yield from found.parameters()
        yield from found.buffers()
    else:
        for value in getattr(found, "__dict__", {}).values():
            yield from _tensors(value, seen)

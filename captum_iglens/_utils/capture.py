r"""Owned, scoped hooks that record the residual stream during one forward pass."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle


def _hidden_of(value: Union[Tensor, Tuple[Any, ...]]) -> Tensor:
    """The hidden-state tensor of a block's output (a tensor, or a tuple led by one)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    raise TypeError(
        "layer: expected each block to output a hidden-state tensor (B, T, d) or a "
        f"tuple that starts with one, got {type(value).__name__}"
    )


class ResidualCapture:
    r"""
    Records, during one forward pass, the input of the model's first block
    (``h_0``, at every position) and the output of every chosen block (only at
    ``positions``).

    Used as a context manager: hooks are registered on entry and exactly these
    handles are removed on exit, whatever happened in between. Hooks that others
    registered on the same modules are never touched.

    Args:

        base_layer (Module): The model's first block; a forward pre-hook on it
                    records ``h_0``, after any scaling the model applies to its
                    embeddings.
        layers (list[Module]): The blocks whose outputs are recorded, in execution
                    order.
        positions (Tensor): 1-D ``LongTensor`` of the positions (dimension 1 of the
                    hidden states) to keep.
        device (torch.device): Where recorded tensors are moved (the readout's
                    device), so that blocks may live on different devices.
    """

    def __init__(
        self,
        base_layer: Module,
        layers: Sequence[Module],
        positions: Tensor,
        device: torch.device,
    ) -> None:
        self.base_layer = base_layer
        self.layers = list(layers)
        self.positions = positions
        self.device = device
        self.base: Optional[Tensor] = None
        self.outputs: Dict[int, Tensor] = {}
        self.order: List[int] = []
        self._handles: List[RemovableHandle] = []

    def _keep(self, hidden: Tensor) -> Tensor:
        rows = hidden.detach().index_select(1, self.positions.to(hidden.device))
        return rows.to(self.device)

    def _record_base(
        self, module: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, Tensor):
            raise TypeError(
                "input_layer: could not find the hidden states among its inputs "
                " (expected a tensor as first positional argument or as "
                "keyword `hidden_states`)"
            )
        if self.base is None:
            self.base = hidden.detach().to(self.device)

    def _output_hook(self, index: int):  # noqa: ANN202 (hook closure)
        def hook(module: Module, args: Tuple[Any, ...], output: Any) -> None:
            if index in self.outputs:
                raise ValueError(
                    f"forward_func: layer {index} ran more than once in one call; "
                    "IG-Lens needs a single forward pass (no generation, no "
                    "repeated blocks)"
                )
            self.outputs[index] = self._keep(_hidden_of(output))
            self.order.append(index)

        return hook

    def __enter__(self) -> "ResidualCapture":
        try:
            self._handles.append(
                self.base_layer.register_forward_pre_hook(
                    self._record_base, with_kwargs=True
                )
            )
            for index, layer in enumerate(self.layers):
                self._handles.append(
                    layer.register_forward_hook(self._output_hook(index))
                )
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove exactly the hooks this object registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def states(self) -> Tuple[Tensor, List[Tensor]]:
        r"""
        The recorded ``h_0`` and block outputs, after checking that every block ran
        once, in the given order.

        Returns:
            2-element tuple of **h_0** and **outputs**:
            - **h_0** (*Tensor*): ``(B, T, d)``.
            - **outputs** (*list[Tensor]*): one ``(B, P, d)`` tensor per block.
        """
        if self.base is None:
            raise ValueError(
                "input_layer: the first block did not run during forward_func; pass "
                "a block of the model that forward_func executes"
            )
        missing = [i for i in range(len(self.layers)) if i not in self.outputs]
        if missing:
            raise ValueError(
                f"layer: block(s) {missing} did not run during forward_func; pass "
                "blocks of the model that forward_func executes"
            )
        if self.order != sorted(self.order):
            raise ValueError(
                f"layer: blocks must be given in execution order, but they ran in "
                f"the order {self.order}"
            )
        return self.base, [self.outputs[i] for i in range(len(self.layers))]

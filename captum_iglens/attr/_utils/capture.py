r"""Owned, scoped hooks that record the residual stream during one forward pass."""

import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle

#: A point on the path: a module and whether its input (True) or output (False)
#: is the residual-stream state.
PathPoint = Tuple[Module, bool]


_LOCKS: "weakref.WeakKeyDictionary[Module, threading.RLock]" = (
    weakref.WeakKeyDictionary()
)
_LOCKS_GUARD = threading.Lock()

#: What LayerIGLens needs of a model, for the errors that show it has another.
NEEDS = (
    "LayerIGLens attributes a language model's next-token probabilities: inputs "
    "are token ids (B, T) or embeddings (B, T, d), each layer returns the residual "
    "stream (B, T, d), the readout maps it to logits over the vocabulary, and "
    "forward_func returns those logits (B, T, V) or (B, V); for another model "
    "(a classifier, a regressor) use captum.attr.LayerIntegratedGradients"
)


def _lock_of(module: Module) -> "threading.RLock":
    """One lock per model (keyed by its first block), shared by every capture."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(module, threading.RLock())


def hidden_of(value: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Tensor:
    """The hidden-state tensor among a module's output, or among its inputs."""
    if kwargs is not None:  # inputs: first positional argument or `hidden_states`
        value = args[0] if args else kwargs.get("hidden_states")
    elif isinstance(value, (tuple, list)) and value:
        value = value[0]
    if not isinstance(value, Tensor):
        raise TypeError(
            "layer: expected a hidden-state tensor (B, T, d) as a block's output "
            "(or the first element of it), and as the first input of the modules "
            f"read at their input; got {type(value).__name__}"
        )
    return value


class ResidualCapture:
    r"""
    Records, during one forward pass, the input of the model's first block
    (``h_0``, at every position) and the residual-stream state at every path point
    (only at ``positions``).

    Used as a context manager: hooks are registered on entry and exactly these
    handles are removed on exit, whatever happened in between. Hooks that others
    registered on the same modules are never touched.

    For the pass, the model is in eval mode (dropout off, so the map is
    deterministic) and each module's ``training`` flag is restored on exit.
    Captures on one model are serialised: a capture entered while another thread
    holds one on the same first block waits for it, so concurrent calls on one
    model are safe (and run one at a time).

    Args:

        base_layer (Module): The model's first block; a forward pre-hook on it
                    records ``h_0``, after any scaling the model applies to its
                    embeddings.
        points (list[tuple[Module, bool]]): The path points in execution order:
                    a module and whether the state is its input (``True``, e.g. the
                    norm in front of a block's MLP) or its output (``False``, a
                    block).
        positions (Tensor): 1-D ``LongTensor`` of the positions (dimension 1 of
                    the hidden states) to keep.
        device (torch.device): Where recorded tensors are moved (the readout's
                    device), so that blocks may live on different devices.
        modules (list[Module], optional): Further modules (e.g. the whole model)
                    put in eval mode for the pass, besides ``base_layer`` and the
                    points' modules. Default: ()
    """

    def __init__(
        self,
        base_layer: Module,
        points: Sequence[PathPoint],
        positions: Tensor,
        device: torch.device,
        modules: Sequence[Module] = (),
    ) -> None:
        self.base_layer = base_layer
        self.points = list(points)
        self.positions = positions
        self.device = device
        self.base: Optional[Tensor] = None
        self.states: Dict[int, Tensor] = {}
        self.order: List[int] = []
        self._handles: List[RemovableHandle] = []
        roots = [*modules, base_layer, *(m for m, _ in self.points)]
        self._modes = {id(m): m for root in roots for m in root.modules()}
        self._training: List[Tuple[Module, bool]] = []
        self._lock = _lock_of(base_layer)

    def _record_base(
        self, module: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> None:
        if self.base is None:
            self.base = hidden_of(None, args, kwargs).detach().to(self.device)

    def _record(self, index: int, hidden: Tensor) -> None:
        if index in self.states:
            raise ValueError(
                f"forward_func: path point {index} ran more than once in one call; "
                "IG-Lens needs a single forward pass (no generation, no repeated "
                "blocks)"
            )
        if hidden.dim() == 2 and self.base is not None:
            # OPT flattens tokens, (B * T, d), in front of its MLP.
            if hidden.shape[0] != self.base.shape[0] * self.base.shape[1]:
                raise ValueError(
                    f"layer: path point {index} returned shape "
                    f"{tuple(hidden.shape)}, not a state per token (B, T, d). " + NEEDS
                )
            hidden = hidden.view(*self.base.shape[:2], -1)
        rows = hidden.detach().index_select(1, self.positions.to(hidden.device))
        self.states[index] = rows.to(self.device)
        self.order.append(index)

    def _hook(self, index: int, at_input: bool) -> RemovableHandle:
        module = self.points[index][0]
        if at_input:
            return module.register_forward_pre_hook(
                lambda m, args, kwargs: self._record(
                    index, hidden_of(None, args, kwargs)
                ),
                with_kwargs=True,
            )
        return module.register_forward_hook(
            lambda m, args, output: self._record(index, hidden_of(output))
        )

    def __enter__(self) -> "ResidualCapture":
        self._lock.acquire()
        try:
            self._training = [(m, m.training) for m in self._modes.values()]
            for module, _ in self._training:
                module.training = False
            self._handles.append(
                self.base_layer.register_forward_pre_hook(
                    self._record_base, with_kwargs=True
                )
            )
            for index, (_, at_input) in enumerate(self.points):
                self._handles.append(self._hook(index, at_input))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.remove()
            for module, training in self._training:
                module.training = training
            self._training = []
        finally:
            self._lock.release()

    def remove(self) -> None:
        """Remove exactly the hooks this object registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def path(self) -> Tuple[Tensor, List[Tensor]]:
        r"""
        The recorded ``h_0`` and path states, after checking that every point was
        reached once, in the given order.

        Returns:
            2-element tuple of **h_0** and **states**:
            - **h_0** (*Tensor*): ``(B, T, d)``.
            - **states** (*list[Tensor]*): one ``(B, P, d)`` tensor per point.
        """
        if self.base is None:
            raise ValueError(
                "input_layer: the first block did not run during forward_func; pass "
                "a block of the model that forward_func executes"
            )
        missing = [i for i in range(len(self.points)) if i not in self.states]
        if missing:
            raise ValueError(
                f"layer: path point(s) {missing} did not run during forward_func; "
                "pass blocks of the model that forward_func executes"
            )
        if self.order != sorted(self.order):
            raise ValueError(
                f"layer: blocks must be given in execution order, but they ran in "
                f"the order {self.order}"
            )
        return self.base, [self.states[i] for i in range(len(self.points))]

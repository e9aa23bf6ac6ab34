r"""
The attention weights and values of one forward pass, captured for
``granularity="source"``: at the attributed positions only.

For the call, every attention module the path splits runs through an attention
implementation of ours, registered with transformers under
:data:`IMPLEMENTATION`: it calls the eager attention function of the module's
own model family (with its masks, sliding windows, grouped key-value heads,
attention sinks and softcapped logits, exactly as the family computes them) on
chunks of query rows, so that no more than about :data:`CHUNK_BYTES` of
attention weights exist at once (never the whole ``(B, H, T, T)``), and records
the attention weights of the attributed query positions, ``(B, H, P, T)``, and
the values of every source position, ``(B, H_kv, T, e)``. Each output row is
the family's eager attention of that row, so the forward is the one the eager
path computes. The additive mask is the eager path's too, built a chunk of
query rows at a time by transformers' own ``eager_mask`` (:class:`RowMask`), so
no ``(B, 1, T, T)`` mask exists either. The models' configs are switched to this
implementation for the call and restored after, whatever happens.
"""

import inspect
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

#: The name our capturing attention is registered under.
IMPLEMENTATION = "captum_iglens_capture"

#: About the most bytes of attention weights (and their logits) one chunk of
#: query rows holds at once.
CHUNK_BYTES = 64 * 2**20

#: The parameters of transformers' mask functions (``eager_mask``'s).
_MASK_PARAMETERS = inspect.signature(eager_mask)
#: Per attention module, what records its call (set only inside a capture).
_RECORDERS: "weakref.WeakKeyDictionary[Module, _Recorder]" = weakref.WeakKeyDictionary()
_REGISTER = threading.Lock()
#: Held while any configs are switched: captures run one at a time, so that one
#: never saves another's switched value as the one to restore.
_SWITCH = threading.RLock()


def _family_eager(module: Module) -> Callable[..., Tuple[Tensor, Tensor]]:
    """The eager attention function of the module's own modelling file."""
    family = sys.modules.get(type(module).__module__)
    found = getattr(family, "eager_attention_forward", None)
    if not callable(found):
        raise ValueError(
            "granularity: 'source' needs the attention weights of the real forward; "
            f"{type(module).__name__} has no eager attention function in its "
            "modelling file, so its weights cannot be read"
        )
    return found


def _query_chunks(query: Tensor, n_keys: int) -> int:
    """Query rows per chunk: about :data:`CHUNK_BYTES` of weights, float32
    logits and softmax included (three ``(B, H, rows, T)`` arrays)."""
    per_row = 3 * 4 * query.shape[0] * query.shape[1] * n_keys
    return max(1, CHUNK_BYTES // per_row)


def _capturing_attention(
    module: Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    *args: Any,
    **kwargs: Any,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The family's eager attention over chunks of query rows (and of the mask,
    :func:`_mask_rows`), recording the weights of the attributed rows and the
    values on the way."""
    eager = _family_eager(module)
    recorder = _RECORDERS.get(module)
    n_queries = query.shape[2]
    size = _query_chunks(query, key.shape[2])
    outputs, kept = [], []
    for start in range(0, n_queries, size):
        rows = slice(start, min(start + size, n_queries))
        mask = _mask_rows(attention_mask, rows, n_queries)
        if mask is not None:  # made where the model's first block runs
            mask = mask.to(query.device)
        output, weights = eager(
            module, query[:, :, rows], key, value, mask, *args, **kwargs
        )
        outputs.append(output)
        if recorder is not None:
            kept.append(recorder.rows(weights, rows))
    if recorder is not None:
        recorder.record(kept, value)
    return torch.cat(outputs, dim=1), None


class RowMask:
    r"""
    The eager path's additive mask ``(B, 1, T_q, T_k)``, made a chunk of query
    rows at a time: transformers' ``eager_mask`` called with the arguments the
    model gave its mask function, for the rows' query positions alone.

    Args:

        arguments (dict): The mask function's arguments (``batch_size``,
                    ``q_length``, ``kv_length``, ``q_offset``, the family's
                    ``mask_function``, the padding ``attention_mask``, …).
    """

    def __init__(self, arguments: Dict[str, Any]) -> None:
        self.arguments = arguments
        self.shape = torch.Size(
            [arguments["batch_size"], 1, arguments["q_length"], arguments["kv_length"]]
        )

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        """A family whose own code reads the mask (not through the attention
        interface: BLOOM's ALiBi) gets the whole mask, as the eager path
        would give it."""

        def whole(value: Any) -> Any:
            return value.whole() if isinstance(value, RowMask) else value

        named = {name: whole(value) for name, value in (kwargs or {}).items()}
        return func(*map(whole, args), **named)

    def __getitem__(self, index: Any) -> Tensor:
        whole = self.whole()
        assert whole is not None  # a mask a family slices is not skipped
        return whole[index]

    def whole(self) -> Optional[Tensor]:
        """The whole mask ``(B, 1, T_q, T_k)``."""
        return self.rows(slice(0, self.shape[2]))

    def rows(self, rows: slice) -> Optional[Tensor]:
        """The mask of the query rows ``rows``, ``(B, 1, len(rows), T_k)``
        (None where the eager path has none)."""
        offset = self.arguments.get("q_offset", 0) + rows.start
        return eager_mask(
            **{**self.arguments, "q_offset": offset, "q_length": rows.stop - rows.start}
        )


def _row_mask(*args: Any, **kwargs: Any) -> RowMask:
    """The mask function registered under :data:`IMPLEMENTATION`."""
    bound = _MASK_PARAMETERS.bind(*args, **kwargs)
    bound.apply_defaults()
    extra = bound.arguments.pop("kwargs", {})  # config, allow_is_causal_skip, …
    arguments = {**bound.arguments, **extra}
    arguments.pop("allow_is_causal_skip", None)
    return RowMask(arguments)


def _mask_rows(mask: Any, rows: slice, n_queries: int) -> Optional[Tensor]:
    """The additive mask of the query rows ``rows``: a :class:`RowMask`'s
    rows, or the rows of a mask the model built itself. A float64 mask is
    clamped to float32's range: eager attention takes its softmax in float32,
    where float64's minimum becomes ``-inf`` and a fully masked row (a padding
    query) ``NaN``, which the next block's values spread to every position
    (``0 · NaN``). Masked weights stay exactly zero."""
    if isinstance(mask, RowMask):
        mask = mask.rows(rows)
    elif mask is not None and mask.shape[2] == n_queries:
        mask = mask[:, :, rows]
    if mask is not None and mask.dtype == torch.float64:
        mask = mask.clamp_min(torch.finfo(torch.float32).min)
    return mask


def _register() -> None:
    """Registers :data:`IMPLEMENTATION` (attention and masks), once."""
    with _REGISTER:
        ALL_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, _capturing_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, _row_mask)


def attention_of(block: Module, projection: Module) -> Module:
    r"""
    The attention module of ``block`` whose output projection is ``projection``.

    Raises:
        ValueError: If no module of ``block`` holds ``projection`` as a child.
    """
    for module in block.modules():
        if any(child is projection for child in module.children()):
            return module
    raise ValueError(
        "granularity: 'source' needs the attention module that holds each block's "
        "attention output projection; none was found inside the block"
    )


def _configs(modules: Sequence[Module]) -> List[Any]:
    """The distinct model configs the modules (and their submodules) read."""
    found: Dict[int, Any] = {}
    for root in modules:
        for module in root.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation_internal"):
                found.setdefault(id(config), config)
    return list(found.values())


class _Recorder:
    """Keeps one attention module's weights at the capture's positions, chunk
    by chunk of query rows, and its values."""

    def __init__(self, capture: "AttentionCapture", index: int) -> None:
        self.capture = capture
        self.index = index

    def rows(self, weights: Optional[Tensor], rows: slice) -> Tuple[Tensor, Tensor]:
        """Where the capture's positions among the query rows ``rows`` of a
        chunk are in its list ``(n,)``, and their weights ``(B, H, n, T)``."""
        if weights is None or weights.dim() != 4:
            raise ValueError(
                "granularity: 'source' needs the attention weights (B, H, T, T) "
                "of the real forward, and the eager attention of "
                f"{type(self.capture.attentions[self.index]).__name__} returned none"
            )
        positions = self.capture.positions.to(weights.device)
        inside = ((positions >= rows.start) & (positions < rows.stop)).nonzero()[:, 0]
        kept = weights.detach().index_select(2, positions[inside] - rows.start)
        return inside, kept.to(self.capture.device)

    def record(self, kept: List[Tuple[Tensor, Tensor]], value: Tensor) -> None:
        """Puts the kept rows in the order of the capture's positions."""
        capture = self.capture
        if self.index in capture.weights:
            raise ValueError(
                "forward_func: an attention module ran more than once in one "
                "call; granularity 'source' needs a single forward pass"
            )
        b, h, _, t = kept[0][1].shape
        rows = kept[0][1].new_zeros(b, h, len(capture.positions), t)
        for inside, found in kept:
            rows[:, :, inside.to(rows.device)] = found
        capture.weights[self.index] = rows
        capture.values[self.index] = value.detach().to(capture.device)


class AttentionCapture:
    r"""
    Records, during one forward pass, each attention module's weights at
    ``positions`` and its values at every position.

    Used as a context manager around the forward: on entry the configs of
    ``owners`` (and of the attention modules) are switched to
    :data:`IMPLEMENTATION`; on exit they are restored and the recorders removed.
    Captures run one at a time (a lock is held from entry to exit).

    Args:

        attentions (list[Module]): One attention module per chosen block.
        owners (list[Module]): The modules whose configs choose the attention
                    implementation (the model).
        positions (Tensor): ``(P,)`` long: the query positions kept.
        device (torch.device): Where the records go.
    """

    def __init__(
        self,
        attentions: Sequence[Module],
        owners: Sequence[Module],
        positions: Tensor,
        device: torch.device,
    ) -> None:
        self.attentions = list(attentions)
        self.positions = positions
        self.device = device
        self.weights: Dict[int, Tensor] = {}
        self.values: Dict[int, Tensor] = {}
        self._configs = _configs([*owners, *self.attentions])
        self._saved: List[Tuple[Any, Any]] = []

    def __enter__(self) -> "AttentionCapture":
        _register()
        _SWITCH.acquire()
        try:
            for config in self._configs:
                self._saved.append((config, config._attn_implementation_internal))
                config._attn_implementation_internal = IMPLEMENTATION
            for index, module in enumerate(self.attentions):
                _RECORDERS[module] = _Recorder(self, index)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            for module in self.attentions:
                _RECORDERS.pop(module, None)
            for config, saved in reversed(self._saved):
                config._attn_implementation_internal = saved
            self._saved = []
        finally:
            _SWITCH.release()

    def records(self) -> Tuple[List[Tensor], List[Tensor]]:
        r"""
        The recorded weights and values, after checking every module ran.

        Returns:
            2-element tuple of **weights** (per block ``(B, H, P, T)``) and
            **values** (per block ``(B, H_kv, T, e)``).

        Raises:
            ValueError: If an attention module did not run through the capture
                (its family does not use transformers' attention interface).
        """
        missing = [i for i in range(len(self.attentions)) if i not in self.weights]
        if missing:
            name = type(self.attentions[missing[0]]).__name__
            raise ValueError(
                f"granularity: 'source' could not read the attention weights of "
                f"{name} (chosen block(s) {missing}): its forward does not go "
                "through transformers' attention interface; use "
                "granularity='head' for this model"
            )
        n = len(self.attentions)
        return [self.weights[i] for i in range(n)], [self.values[i] for i in range(n)]

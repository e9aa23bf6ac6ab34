r"""What one method costs: wall time, peak memory, passes through the model."""

import os
import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


@dataclass
class Cost:
    r"""
    The cost of one method on one input.

    Attributes:

        seconds (float): Wall time, ``time.perf_counter``.
        peak_bytes (int): Peak memory above what was in use when the method
                    started. On CUDA: ``torch.cuda.max_memory_allocated``. On CPU:
                    the growth of the process's resident set (``VmHWM`` after
                    resetting it through ``/proc/self/clear_refs``; where that is
                    not possible, the growth of ``ru_maxrss``, which only shows a
                    method that exceeds the process's earlier peak). Memory the
                    allocator kept from earlier work is reused without showing, so
                    on CPU this is a lower bound.
        forwards (int): Calls of the model's forward.
        forward_sequences (int): Sequences through those calls (their summed
                    batch sizes).
        backwards (int): Backward passes that reached the model's head inside a
                    model forward.
        backward_sequences (int): Sequences through those backward passes.
        readout_rows (int): Hidden vectors read out by the head outside a model
                    forward (lens-style readouts).
    """

    seconds: float = 0.0
    peak_bytes: int = 0
    forwards: int = 0
    forward_sequences: int = 0
    backwards: int = 0
    backward_sequences: int = 0
    readout_rows: int = 0


def _proc_kib(field: str) -> int:
    with open(_STATUS) as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in {_STATUS}")


def _reset_rss_peak() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _max_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _batch_size(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> int:
    for value in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args):
        if isinstance(value, Tensor):
            return value.shape[0]
    return 0


@contextmanager
def measure(model: Module, head: Module, device: torch.device) -> Iterator[Cost]:
    r"""
    Measures what runs inside the ``with`` block. Hooks on ``model`` and ``head``
    are registered on entry and exactly these are removed on exit.

    Args:

        model (Module): The causal LM; each call of its forward is one pass.
        head (Module): Its unembedding; a tensor hook on the head's output inside
                    a model forward counts the backward passes through the model,
                    and head calls outside a model forward count readout rows.
        device (torch.device): Where the model lives (CUDA memory is measured
                    with the CUDA allocator's statistics).

    Returns:
        The :class:`Cost`, filled in when the block exits.
    """
    cost = Cost()
    depth = [0]
    handles: List[RemovableHandle] = []

    def enter(module: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if depth[0] == 0:
            cost.forwards += 1
            cost.forward_sequences += _batch_size(args, kwargs)
        depth[0] += 1

    def leave(module: Module, args: Tuple[Any, ...], output: Any) -> None:
        depth[0] -= 1

    def on_grad(grad: Tensor) -> None:
        cost.backwards += 1
        cost.backward_sequences += grad.shape[0]

    def read(module: Module, args: Tuple[Any, ...], output: Tensor) -> None:
        if depth[0] == 0:
            cost.readout_rows += output[..., 0].numel()
        elif output.requires_grad:
            handles.append(output.register_hook(on_grad))

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start_bytes = torch.cuda.memory_allocated(device)
    else:
        exact = _reset_rss_peak()
        start_bytes = _proc_kib("VmRSS") * 1024 if exact else _max_rss_bytes()
    start = time.perf_counter()
    try:
        handles.append(model.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(model.register_forward_hook(leave, always_call=True))
        handles.append(head.register_forward_hook(read))
        yield cost
    finally:
        for handle in handles:
            handle.remove()
    if cuda:
        torch.cuda.synchronize(device)
        end_bytes = torch.cuda.max_memory_allocated(device)
    else:
        end_bytes = _proc_kib("VmHWM") * 1024 if exact else _max_rss_bytes()
    cost.seconds = time.perf_counter() - start
    cost.peak_bytes = max(0, end_bytes - start_bytes)


def peak_memory_source(device: torch.device) -> str:
    """How :func:`measure` reads peak memory on ``device``."""
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    if os.access(_CLEAR_REFS, os.W_OK):
        return "growth of VmHWM after a reset through /proc/self/clear_refs"
    return "growth of ru_maxrss (shows only a method that exceeds the earlier peak)"

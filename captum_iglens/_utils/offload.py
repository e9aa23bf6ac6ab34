r"""
Modules whose weights accelerate keeps off the device (``device_map`` with
``"cpu"`` or ``"disk"`` offload): their parameters are on the ``meta`` device
between calls, and the hook that accelerate puts on them loads the real values
(from its ``weights_map``) for each call. The lens reads such weights from that
store, and places what it captures on the hook's execution device.
"""

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import Tensor
from torch.nn import Module


def _hooks(module: Module) -> Iterator[Any]:
    """The accelerate hooks on ``module`` (a ``SequentialHook`` unpacked)."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None:
        yield from getattr(hook, "hooks", None) or [hook]


def _offload_hook(module: Module) -> Optional[Any]:
    for hook in _hooks(module):
        if getattr(hook, "offload", False) and getattr(hook, "weights_map", None):
            return hook
    return None


def parameter(module: Module, name: str) -> Any:
    r"""
    ``module.<name>``; for a parameter that accelerate offloads, its value from
    the offload store, on the hook's execution device.
    """
    value = getattr(module, name, None)
    if isinstance(value, Tensor) and value.is_meta:
        hook = _offload_hook(module)
        if hook is not None and name in hook.weights_map:
            return hook.weights_map[name].to(hook.execution_device)
    return value


@contextmanager
def onloaded(module: Module) -> Iterator[None]:
    """For the block: the offloaded weights of ``module`` (and its submodules)
    loaded, as accelerate loads them for a call."""
    hooks = [(m, h) for m in module.modules() if (h := _offload_hook(m))]
    try:
        for m, hook in hooks:
            hook.pre_forward(m)
        yield
    finally:
        for m, hook in hooks:
            hook.post_forward(m, None)


def unloaded(module: Module) -> bool:
    """Whether ``module`` has ``meta`` parameters that no accelerate offload
    hook loads."""
    return any(
        any(p.is_meta for p in m.parameters(recurse=False)) and _offload_hook(m) is None
        for m in module.modules()
    )


def execution_device(module: Module) -> torch.device:
    """Where ``module`` computes: its accelerate hook's execution device, else
    the device of its first parameter."""
    for m in module.modules():
        for hook in _hooks(m):
            device = getattr(hook, "execution_device", None)
            if device is not None:
                return torch.device(device)
    return next(module.parameters()).device

r"""
The processes of a run under ``torchrun``: joining the group, each process's
rank, the steps only rank 0 takes (claiming a folder, deciding what is left
to do) shared with the others, and work shared item by item with every value
back on every process in the items' order. Outside a process group every
function acts as the one process of a group of one.
"""

import os
from typing import Any, Callable, Iterator, List, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist

Value = TypeVar("Value")
Item = TypeVar("Item")


def init_distributed() -> torch.device:
    r"""
    Joins the process group that ``torchrun`` describes in the environment
    (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
    with the NCCL backend when CUDA is available and Gloo otherwise. Does nothing
    outside ``torchrun`` or when the group is already initialised.

    Returns:
        *torch.device*: the device this process should put the model on:
        ``cuda:LOCAL_RANK`` with CUDA, else the CPU.
    """
    cuda = torch.cuda.is_available()
    device = torch.device(
        f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    )
    if cuda:
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return device


def in_group() -> bool:
    r"""Whether this process is one of a ``torch.distributed`` group."""
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> Tuple[int, int]:
    r"""
    This process's rank and the number of processes.

    Returns:
        *(int, int)*: the rank, from 0, and the world size; ``(0, 1)`` outside
        a group.
    """
    return (dist.get_rank(), dist.get_world_size()) if in_group() else (0, 1)


def barrier() -> None:
    r"""Waits until every process of the group gets here (nothing outside one)."""
    if in_group():
        dist.barrier()


def from_rank_zero(step: Callable[[], Value]) -> Value:
    r"""
    Runs ``step`` on rank 0 only and gives every process its value; a
    ``ValueError`` it raises is raised on every process, so that all stop, not
    only rank 0.

    Args:

        step (Callable[[], Value]): The work of rank 0; its value must pickle.

    Returns:
        *Value*: ``step``'s value, on every process.

    Raises:
        ValueError: The one ``step`` raised, with its message.
    """
    rank, _ = rank_and_world()
    box: list = [None, None]  # the value, the error's message
    if rank == 0:
        try:
            box[0] = step()
        except ValueError as error:
            box[1] = str(error)
    if in_group():
        dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise ValueError(box[1])
    return box[0]


def gathered(value: Any) -> List[Any]:
    r"""
    Every process's ``value``, on every process (a collective: each process
    of the group must call it).

    Args:

        value (Any): This process's value; it must pickle.

    Returns:
        *list*: ``world_size`` values, by rank (``[value]`` outside a group).
    """
    if not in_group():
        return [value]
    values: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def computed_in_order(
    items: Sequence[Item], compute: Callable[[Item], Value]
) -> Iterator[Value]:
    r"""
    Every item's value, in the items' order, on every process, each process
    computing every ``world_size``-th item: in round ``k`` process ``r``
    computes item ``k · world_size + r`` and the round's values are gathered,
    so that at most one value per process is held at a time. A caller that
    adds the values up in the order they come adds them as one process does,
    to the last bit.

    Args:

        items (Sequence): The work, the same on every process.
        compute (Callable): An item's value; it must pickle (tensors on the
                    CPU).

    Returns:
        *Iterator*: ``compute(item)`` for each item, in order.
    """
    rank, world = rank_and_world()
    for first in range(0, len(items), world):
        mine = first + rank
        value = compute(items[mine]) if mine < len(items) else None
        values = gathered(value)
        yield from values[: len(items) - first]

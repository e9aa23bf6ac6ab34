r"""
The memory a flow split by receiver position needs, ``R × S × T × T``
float64 flows, against the memory the machine has available: checked without
torch, so that the command line refuses a prompt too long for it before the
model loads.
"""

import os
from typing import Optional

from captum_iglens.graph.model_graph import ModelGraph


def pair_bytes(graph: ModelGraph, length: int, n_pairs: int = 1) -> int:
    r"""
    Bytes of the flows split by sender and receiver position: each pair's
    ``(R, S, T, T)`` float64 totals and one step's.

    Returns:
        *int*.
    """
    edges = (len(graph.receivers) - 1) * len(graph.senders)
    return (n_pairs + 1) * edges * length * length * 8


def free_memory() -> Optional[int]:
    """The bytes of memory available on this machine (Linux's
    ``MemAvailable``, else the free pages), where the system says."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_pair_memory(
    graph: ModelGraph, length: int, held: int = 0, n_pairs: int = 1
) -> None:
    r"""
    Refuses a split by receiver position whose flows (:func:`pair_bytes`) and
    ``held`` other bytes would not fit in the memory available
    (:func:`free_memory`; not checked where the system does not say).

    Args:
        graph (ModelGraph): The graph's nodes.
        length (int): The prompt's tokens ``T``.
        held (int, optional): Bytes held beside them (the path points).
                    Default: 0
        n_pairs (int, optional): The pairs of a batch, whose flows are all
                    held until the batch ends. Default: 1

    Raises:
        ValueError: Naming ``receiver_positions``.
    """
    needed = pair_bytes(graph, length, n_pairs) + held
    free = free_memory()
    if free is not None and needed > free:
        pairs = f" for {n_pairs} pairs" if n_pairs > 1 else ""
        fewer = " pass fewer pairs at once," if n_pairs > 1 else ""
        raise ValueError(
            f"receiver_positions: the flows by sender and receiver position need "
            f"about {needed / 2**30:,.1f} GiB (R x S x T x T){pairs}, more than the "
            f"{free / 2**30:,.1f} GiB available; shorten the prompt,{fewer} or leave "
            "receiver_positions off (per_position keeps the sender's positions)"
        )

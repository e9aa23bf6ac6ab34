r"""
The memory budget's arithmetic, without torch: the command line checks
``--n-steps`` against ``--max-chunk-mib`` before anything heavy is imported,
and :class:`~captum_iglens.LayerIGLens` checks that one segment's points can be
held at all before the first forward.
"""

import os
from typing import Optional

#: Bytes of one float32 number.
FLOAT32_BYTES = 4


def most_steps(width: int, max_chunk_bytes: int) -> int:
    r"""
    The most ``n_steps`` one segment may take: its points, a float32 hidden
    state of ``width`` each, fit in one readout chunk (at least 1).

    Args:

        width (int): The hidden size ``d``.
        max_chunk_bytes (int): The readout's memory budget per chunk.

    Returns:
        *int*: ``max(1, max_chunk_bytes // (4 d))``.
    """
    return max(1, max_chunk_bytes // (FLOAT32_BYTES * width))


def machine_memory() -> Optional[int]:
    r"""
    The bytes of physical memory of this machine, where the system says
    (``sysconf``); else None.
    """
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None

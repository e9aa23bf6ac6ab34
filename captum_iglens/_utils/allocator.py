r"""
The C allocator of a process the package runs (the CLI), set to give freed
large buffers back to the system.

glibc's ``malloc`` serves a large request with its own ``mmap`` (returned to
the system on ``free``) only above a threshold that it raises, by default, to
the size of each such buffer freed (up to 32 MiB). After the first freed
readout chunk, chunks of that size are carved from the heap instead, and freed
space under a smaller block still in use cannot be given back: the resident
memory of a long attribution then climbs with each chunk, by how much depends on
the order in which threads allocate (1.56 GB in most runs of a 1,494-token map,
7.6-7.9 GB in some). A fixed threshold of 1 MiB serves every buffer of that
size with its own ``mmap``, so each chunk's memory is returned when freed.
"""

import ctypes

#: ``mallopt``'s parameter for the ``mmap`` threshold (glibc ``malloc.h``).
_M_MMAP_THRESHOLD = -3
#: Buffers from this size up are mapped on their own and unmapped on ``free``.
MMAP_THRESHOLD = 1 << 20


def return_freed_memory() -> bool:
    r"""
    Fixes glibc's ``mmap`` threshold at :data:`MMAP_THRESHOLD` for this
    process (setting it turns off the threshold's growth), so that buffers of
    1 MiB and more go back to the system when freed. Called by the CLI, which
    owns its process; elsewhere (another C library, another OS) nothing is
    changed.

    Returns:
        *bool*: whether the threshold was set.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library loaded already
    except (OSError, AttributeError, TypeError):  # no mallopt: not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))

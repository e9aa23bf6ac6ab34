r"""
The lock of a batch or graph folder, so that two runs never write one folder at once.
"""

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional, Union

#: The lock file of a folder being written (see :class:`BatchLock`).
LOCK = ".batch.lock"
# A lock file this young with no holder yet is being written.
_LOCK_WRITE_S = 10.0


class BatchLock:
    r"""
    The exclusive lock of a batch or graph folder: the file ``.batch.lock`` in it,
    created only if absent, holding the host and pid of the process that runs
    the folder. A lock whose process is gone (same host) is stale and taken
    over; a process that holds the lock may take it again (it is then released
    by the first taker only).

    Args:

        out_dir (str or Path): The output folder (it must exist).
    """

    def __init__(self, out_dir: Union[str, Path]) -> None:
        self.path = Path(out_dir) / LOCK
        self.held = False

    def acquire(self) -> "BatchLock":
        r"""Takes the lock, or raises ``ValueError`` in one line naming the
        process that holds it."""
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(3):
            try:
                handle = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder == me:
                    return self
                if holder is not None and not _is_stale(holder):
                    raise ValueError(
                        f"out_dir: {self.path.parent} is being written by another "
                        f"run (pid {holder.get('pid')} on "
                        f"{holder.get('host')}); wait for it to finish, or delete "
                        f"{self.path} if that process is gone"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(json.dumps(me))
            self.held = True
            return self
        raise ValueError(f"out_dir: could not take the lock {self.path}; try again")

    def release(self) -> None:
        r"""Removes the lock file, if this object took it."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def _holder(self) -> Optional[Dict[str, Any]]:
        """The lock's holder; None for a file being written (young) or
        unreadable and old (stale)."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
                return holder
        except (OSError, ValueError):
            pass
        try:
            young = time.time() - self.path.stat().st_mtime < _LOCK_WRITE_S
        except OSError:
            return None
        if young:
            return {"host": "?", "pid": "? (starting)"}
        return None


def _is_stale(holder: Dict[str, Any]) -> bool:
    """Whether the lock's process is gone (only knowable on this host)."""
    if holder.get("host") != socket.gethostname() or not isinstance(
        holder.get("pid"), int
    ):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False

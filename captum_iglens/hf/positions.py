r"""Which tokens of ``prompt + answer`` are attributed: the names, without torch
(the command line's choices read them)."""

from typing import Literal, Tuple, get_args

#: Which tokens of ``prompt + answer`` are attributed.
Positions = Literal["answer", "prompt", "all"]
POSITIONS: Tuple[str, ...] = get_args(Positions)

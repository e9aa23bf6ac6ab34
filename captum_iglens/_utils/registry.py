r"""Looking a strategy up by name in its registry, with the one error message
every registry gives."""

from typing import Mapping, TypeVar

T = TypeVar("T")


def registered(registry: Mapping[str, T], name: object, argument: str) -> T:
    r"""
    The entry of ``registry`` named ``name``.

    Args:

        registry (Mapping[str, T]): Entries by name.
        name (object): What the caller passed.
        argument (str): The argument's name, for the message.

    Returns:
        *T*: the entry.

    Raises:
        ValueError: If ``name`` is not a name in ``registry``, listing them.
    """
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"{argument}: expected one of {list(registry)}, got {name!r}")
    return registry[name]

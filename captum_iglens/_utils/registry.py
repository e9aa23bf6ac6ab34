r"""The registries of strategies by name (estimators, granularities, paths), whose
names cost no import, and the one error message every registry gives."""

import importlib
from typing import (
    Any,
    Dict,
    Iterator,
    Mapping,
    MutableMapping,
    NamedTuple,
    TypeVar,
    Union,
)

T = TypeVar("T")


def imported(package: str, where: str) -> Any:
    r"""
    Args:

        package (str): A package.
        where (str): ``"module:attribute"``, the module relative to ``package``.

    Returns:
        *Any*: the attribute, its module imported.
    """
    module, attribute = where.split(":")
    return getattr(importlib.import_module(f"{package}.{module}"), attribute)


class Home(NamedTuple):
    r"""
    Where a registry entry lives, imported the first time it is looked up.

    Attributes:

        where (str): ``"module:attribute"``, the module relative to the
                    registry's package.
        summary (str): What it is, in a few words (for help texts).
                    Default: ""
    """

    where: str
    summary: str = ""


class Registry(MutableMapping[str, T]):
    r"""
    Entries by name. A built-in entry is given as its :class:`Home` and imported
    on first lookup, so the names (iterating, ``in``, ``len``) and summaries
    import nothing: the command line lists them in its help and usage errors
    without torch. Looking an entry up checks that its ``name``, where it has
    one, is the name it is registered under. From other code an entry is the
    object itself: ``registry[obj.name] = obj``.

    Args:

        package (str): The package the homes' modules are relative to.
        homes (Mapping[str, Home]): The built-in entries, by name, in order.
    """

    def __init__(self, package: str, homes: Mapping[str, Home]) -> None:
        self.package = package
        self._entries: Dict[str, Union[Home, T]] = dict(homes)
        self._summaries = {name: home.summary for name, home in homes.items()}

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, Home):
            value: T = imported(self.package, entry.where)
            if getattr(value, "name", name) != name:
                raise ValueError(
                    f"{self.package}: {entry.where} is named "
                    f"{getattr(value, 'name')!r}, registered as {name!r}"
                )
            self._entries[name] = entry = value
        return entry

    def __setitem__(self, name: str, value: T) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def summary(self, name: str) -> str:
        r"""
        Args:

            name (str): A name in the registry.

        Returns:
            *str*: what its :class:`Home` says it is, whether or not it was
            looked up since ("" for an entry registered as an object).
        """
        if name not in self._entries:
            raise KeyError(name)
        return self._summaries.get(name, "")


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

r"""Packages whose public names are imported on first use, so that importing a
package (and the command line's help and usage errors, which read its
registries) does not pay for torch and transformers."""

import importlib
import sys
from typing import Any, Callable, Dict, List, Tuple


def lazy_exports(
    package: str, homes: Dict[str, str]
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    r"""
    The module ``__getattr__`` and ``__dir__`` of ``package`` (PEP 562).

    Args:

        package (str): The package's ``__name__``.
        homes (dict[str, str]): The module each public name is imported from.

    Returns:
        *(Callable, Callable)*: ``__getattr__``, which imports a name of
        ``homes`` on first use and keeps it, and ``__dir__``.
    """

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> List[str]:
        return sorted([*vars(sys.modules[package]), *homes])

    return __getattr__, __dir__

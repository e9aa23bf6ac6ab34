r"""
The integration paths of IG-Lens, by the name ``path=`` takes: how the path
points a granularity traces are joined into straight segments.

A new path is one module with one :class:`IntegrationPath` subclass, and one
line in :data:`PATHS`.
"""

from typing import Dict, Type

from captum_iglens._utils.registry import registered

from captum_iglens.attr.paths.base import IntegrationPath
from captum_iglens.attr.paths.joint import Joint
from captum_iglens.attr.paths.telescoping import Telescoping

__all__ = ["PATHS", "IntegrationPath", "Joint", "Telescoping", "integration_path"]

#: The paths ``path=`` takes, by name (iterating gives the names).
PATHS: Dict[str, Type[IntegrationPath]] = {p.name: p for p in (Telescoping, Joint)}


def integration_path(name: str) -> IntegrationPath:
    r"""
    The path named ``name``.

    Args:

        name (str): A name in :data:`PATHS`.

    Returns:
        *IntegrationPath*: a new instance.

    Raises:
        ValueError: If no path has that name.
    """
    return registered(PATHS, name, "path")()

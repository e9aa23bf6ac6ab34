r"""
The integration paths of IG-Lens, by the name ``path=`` takes: how the path
points a granularity traces are joined into straight segments.

A new path is one module with one :class:`IntegrationPath` subclass, and one
line in :data:`PATHS`.
"""

from typing import TYPE_CHECKING, Type

from captum_iglens._utils.lazy import lazy_exports
from captum_iglens._utils.registry import Home, Registry, registered

if TYPE_CHECKING:
    from captum_iglens.attr.paths.base import IntegrationPath
    from captum_iglens.attr.paths.joint import Joint
    from captum_iglens.attr.paths.telescoping import Telescoping

__all__ = ["PATHS", "IntegrationPath", "Joint", "Telescoping", "integration_path"]

#: The paths ``path=`` takes, by name, with what each is (iterating gives the
#: names, importing nothing).
PATHS: "Registry[Type[IntegrationPath]]" = Registry(
    __name__,
    {
        "telescoping": Home(
            "telescoping:Telescoping",
            "each block between consecutive states (when the final head can read "
            "the answer)",
        ),
        "joint": Home(
            "joint:Joint",
            "every block's update scaled together (what each block writes, in no "
            "order)",
        ),
    },
)


def integration_path(name: str) -> "IntegrationPath":
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


# Each class is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "IntegrationPath": "captum_iglens.attr.paths.base",
        "Joint": "captum_iglens.attr.paths.joint",
        "Telescoping": "captum_iglens.attr.paths.telescoping",
    },
)

r"""
The API reference, generated from the package at build time.

* One page per public module (no path component starting with ``_``): the
  module's docstring and every public member it defines (its ``__all__`` when it
  has one), so each object has exactly one entry, where it is defined.
* A reference to a public name by the path a user imports it from
  (``captum_iglens.LayerIGLens``) resolves to that entry.
* A build check: every name in the ``__all__`` of ``captum_iglens`` and of its
  public subpackages has an entry; one without is a warning (an error under
  ``-W``). The number of documented objects is printed.
"""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

PACKAGE = "captum_iglens"
logger = logging.getLogger(__name__)


def public_modules() -> List[str]:
    r"""Every importable public module of the package, the package first."""
    package = importlib.import_module(PACKAGE)
    found = [PACKAGE]
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(info.name)
    return sorted(found)


def public_packages() -> List[str]:
    r"""The package and its public subpackages (modules with a ``__path__``)."""
    return [
        name
        for name in public_modules()
        if hasattr(importlib.import_module(name), "__path__")
    ]


def _defines(module: str, name: str) -> bool:
    r"""Whether ``module``'s source assigns ``name`` at top level (not imports)."""
    source = inspect.getsource(importlib.import_module(module))
    for node in ast.parse(source).body:
        targets: List[Any] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def canonical_name(path: str) -> Optional[str]:
    r"""Where the object at dotted ``path`` is documented: its defining module and
    qualified name; None when ``path`` names no object of the package."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        if cut == len(parts):
            return path
        owner = obj
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return None
            owner, obj = obj, getattr(obj, attr)
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if inspect.ismodule(obj):
            return obj.__name__
        if (
            isinstance(module, str)
            and isinstance(qualname, str)
            and module.startswith(PACKAGE)
            and "<" not in qualname
        ):
            return f"{module}.{qualname}"
        # Data (a constant): documented in the module that assigns it.
        if inspect.ismodule(owner):
            name = parts[-1]
            for candidate in public_modules():
                if candidate.startswith(owner.__name__) and _defines(candidate, name):
                    return f"{candidate}.{name}"
        return path
    return None


_VERSION_ENTRY = [
    ".. py:data:: __version__",
    "   :type: str",
    "",
    "   The version of the package (``captum-iglens --version``).",
    "",
]


def _page(module: str) -> str:
    r"""A module's page: a package that has ``__all__`` lists it, with links to
    the entries where its names are defined; any other module documents its
    members."""
    imported = importlib.import_module(module)
    title = f"``{module}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {module}"]
    names = getattr(imported, "__all__", None)
    if names is None or not hasattr(imported, "__path__"):
        return "\n".join(lines) + "\n"
    lines += ["   :no-members:", ""]
    if "__version__" in names:
        lines += _VERSION_ENTRY
    lines += ["Public names:", ""]
    for name in names:
        if name != "__version__":
            target = canonical_name(f"{module}.{name}") or f"{module}.{name}"
            lines.append(f"* :py:obj:`{name} <{target}>`")
    return "\n".join(lines) + "\n"


def generate(app: Sphinx) -> None:
    r"""Write ``_generated/api/*.rst`` and their index."""
    out = Path(app.srcdir) / "_generated" / "api"
    out.mkdir(parents=True, exist_ok=True)
    modules = public_modules()
    for module in modules:
        text = _page(module)
        path = out / f"{module}.rst"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for stale in out.glob("*.rst"):
        if stale.stem not in modules and stale.stem != "index":
            stale.unlink()
    groups: Dict[str, List[str]] = {}
    for module in modules:
        head = ".".join(module.split(".")[:2])
        groups.setdefault(head, []).append(module)
    index = ["API reference", "=============", ""]
    index += [
        "One page per public module; every public object has its entry where it",
        "is defined, and the packages list what they export.",
        "",
    ]
    for head, members in groups.items():
        index += [f"``{head}``", "-" * (len(head) + 4), "", ".. toctree::"]
        index += ["   :maxdepth: 1", "", *(f"   {m}" for m in members), ""]
    text = "\n".join(index)
    path = out / "index.rst"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _documented(env: Any) -> Dict[str, Tuple[str, str, bool]]:
    return env.get_domain("py").objects


def check_public_names(app: Sphinx, env: Any) -> None:
    r"""Every ``__all__`` name of the public packages has an entry."""
    objects = _documented(env)
    missing = []
    for package in public_packages():
        for name in getattr(importlib.import_module(package), "__all__", []):
            path = f"{package}.{name}"
            if path in objects or canonical_name(path) in objects:
                continue
            missing.append(path)
    for path in missing:
        logger.warning(f"public name without an API entry: {path}")
    ours = [name for name in objects if name.startswith(PACKAGE)]
    logger.info(f"apigen: {len(ours)} documented objects of {PACKAGE}")


def resolve_reexport(
    app: Sphinx, env: Any, node: Any, contnode: Any
) -> Optional[nodes.Element]:
    r"""Resolve ``captum_iglens.X`` (an import path) to the entry where X is
    defined."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith(PACKAGE + "."):
        return None
    canonical = canonical_name(target)
    if canonical is None or canonical == target:
        return None
    if canonical not in _documented(env):
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env,
        node["refdoc"],
        app.builder,
        node["reftype"],
        canonical,
        node,
        contnode,
    )


def setup(app: Sphinx) -> Dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("env-check-consistency", check_public_names)
    app.connect("missing-reference", resolve_reexport)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

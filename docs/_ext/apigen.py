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
import functools
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


@functools.lru_cache(maxsize=None)
def public_modules() -> Tuple[str, ...]:
    r"""Every importable public module of the package, the package first."""
    package = importlib.import_module(PACKAGE)
    found = [PACKAGE]
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(info.name)
    return tuple(sorted(found))


def public_packages() -> List[str]:
    r"""The package and its public subpackages (modules with a ``__path__``)."""
    return [
        name
        for name in public_modules()
        if hasattr(importlib.import_module(name), "__path__")
    ]


@functools.lru_cache(maxsize=None)
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


def _walk(path: str) -> Optional[Tuple[Any, Any]]:
    r"""``(owner, object)`` at dotted ``path``, read as Python reads an import:
    an attribute of the package first (``comparison.compare`` is the function
    the package exports, not its module), else a submodule."""
    parts = path.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except ImportError:
        return None
    owner: Any = None
    for i, attr in enumerate(parts[1:], start=2):
        if hasattr(obj, attr):
            owner, obj = obj, getattr(obj, attr)
            continue
        try:
            owner, obj = obj, importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return None
    return owner, obj


def canonical_name(path: str) -> Optional[str]:
    r"""Where the object at dotted ``path`` is documented: its defining module and
    qualified name; None when ``path`` names no object of the package."""
    found = _walk(path)
    if found is None:
        return None
    owner, obj = found
    if inspect.ismodule(obj):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if (
        isinstance(module, str)
        and isinstance(qualname, str)
        and module.startswith(PACKAGE)
        and "<" not in qualname
    ):
        return f"{module}.{qualname}"
    name = path.rsplit(".", 1)[-1]
    # A property or attribute of a class: under the class's entry.
    if inspect.isclass(owner) and owner.__module__.startswith(PACKAGE):
        return f"{owner.__module__}.{owner.__qualname__}.{name}"
    # Data (a constant): documented in the module that assigns it, the owner or
    # one of its modules first.
    if inspect.ismodule(owner):
        prefix = owner.__name__
        ranked = sorted(public_modules(), key=lambda m: not m.startswith(prefix))
        for candidate in ranked:
            if (
                _defines(candidate, name)
                and getattr(importlib.import_module(candidate), name, None) is obj
            ):
                return f"{candidate}.{name}"
    return path


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
    defined_here = []
    for name in names:
        if name != "__version__":
            target = canonical_name(f"{module}.{name}") or f"{module}.{name}"
            lines.append(f"* :py:obj:`{name} <{target}>`")
            if target == f"{module}.{name}":
                defined_here.append(name)
    lines.append("")
    for name in defined_here:  # defined in the package itself: its entry here
        obj = getattr(imported, name)
        kind = (
            "autoclass"
            if inspect.isclass(obj)
            else "autofunction"
            if callable(obj)
            else "autodata"
        )
        lines += [f".. {kind}:: {module}.{name}", ""]
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


def _candidates(node: Any) -> List[str]:
    r"""Where a reference's target may live: as written when it is a path of the
    package, else as Python would read the name in the docstring's module (or
    its class)."""
    target = node.get("reftarget", "").lstrip("~.")
    if target.startswith(PACKAGE + "."):
        return [target]
    module, cls = node.get("py:module"), node.get("py:class")
    found = []
    if module and cls:
        found.append(f"{module}.{cls}.{target}")
    if module:
        found.append(f"{module}.{target}")
    found.append(f"{PACKAGE}.{target}")
    return found


def resolve_reexport(
    app: Sphinx, env: Any, node: Any, contnode: Any
) -> Optional[nodes.Element]:
    r"""Resolve ``captum_iglens.X`` (an import path) to the entry where X is
    defined, and a short name to what it names in the docstring's module."""
    if node.get("refdomain") != "py":
        return None
    objects = _documented(env)
    for path in _candidates(node):
        try:
            canonical = canonical_name(path)
        except Exception:  # an import error of an optional integration
            canonical = None
        if canonical is None or canonical not in objects:
            continue
        return _resolve(app, env, node, contnode, canonical)
    # A short name that one documented object of the package ends with.
    tail = "." + node.get("reftarget", "").lstrip("~.")
    kinds = set(env.get_domain("py").objtypes_for_role(node["reftype"]) or ())
    matches = [
        name
        for name, entry in objects.items()
        if name.endswith(tail) and (not kinds or entry.objtype in kinds)
    ]
    if len(matches) == 1:
        return _resolve(app, env, node, contnode, matches[0])
    return None


def _resolve(
    app: Sphinx, env: Any, node: Any, contnode: Any, target: str
) -> Optional[nodes.Element]:
    return env.get_domain("py").resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
    )


def tidy_lists(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: List[str]
) -> None:
    r"""Captum's ``Returns:`` lists as reStructuredText reads them: a blank line
    between ``... **delta**:`` and its ``- **attributions** ...`` items, and an
    item's continuation lines aligned with its text."""
    out: List[str] = []
    column: Optional[int] = None  # the text column of the current item
    for line in lines:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("- "):
            if column is None and out and out[-1].rstrip().endswith(":"):
                out.append("")
            column = indent + 2
        elif column is not None:
            if not stripped or indent < column:
                column = None
            elif indent > column:
                line = " " * column + stripped
        out.append(line)
    lines[:] = out


_PROSE: Dict[Tuple[str, str], List[str]] = {}


def keep_prose(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: List[str]
) -> None:
    r"""Before napoleon: a constant's, attribute's or property's docstring is
    prose ("Every point is read by one readout: ..."), not napoleon's
    ``type: text``; it is kept as written."""
    if what in ("attribute", "data", "property"):
        _PROSE[(what, name)] = list(lines)


def restore_prose(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: List[str]
) -> None:
    r"""After napoleon: the docstring :func:`keep_prose` kept."""
    kept = _PROSE.pop((what, name), None)
    if kept is not None:
        lines[:] = kept


def setup(app: Sphinx) -> Dict[str, Any]:
    app.connect("autodoc-process-docstring", keep_prose, priority=100)
    app.connect("autodoc-process-docstring", restore_prose, priority=900)
    app.connect("autodoc-process-docstring", tidy_lists, priority=100)
    app.connect("builder-inited", generate)
    app.connect("env-check-consistency", check_public_names)
    app.connect("missing-reference", resolve_reexport)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

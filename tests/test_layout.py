"""The package's layout rules: no import cycle between modules, helpers never
import the algorithms they serve, and every module imports on its own."""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import pytest

import captum_iglens

PACKAGE = Path(captum_iglens.__file__).parent
# What _utils folders and the data-only modules may never import.
ALGORITHMS = ("captum_iglens.attr.layer_ig_lens", "captum_iglens.studies")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> Dict[str, Set[str]]:
    """Each module's imports of package modules, at any depth of the file (those
    made only for type checkers excepted)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        found = set()
        tree = ast.parse(path.read_text())
        for node in list(ast.walk(tree)):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == (
                "TYPE_CHECKING"
            ):
                node.body = []
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [
                    f"{node.module}.{a.name}" for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _cycle(graph: Dict[str, Set[str]]) -> list:
    state: Dict[str, int] = {}
    stack: list = []

    def visit(node: str) -> list:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycle_between_modules():
    graph = _imports()
    # A package's __init__ only re-exports its modules: its edges are not cycles.
    modules = {m: {t for t in deps if not _is_package(t)} for m, deps in graph.items()}
    assert _cycle(modules) == []


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


@pytest.mark.parametrize(
    "prefix",
    [
        "captum_iglens._utils",
        "captum_iglens.attr._utils",
        "captum_iglens.hf",
        "captum_iglens.readout",
        "captum_iglens.settings",
        "captum_iglens.result",
        "captum_iglens.viewer",
    ],
)
def test_helpers_never_import_the_algorithms(prefix):
    for module, deps in _imports().items():
        if module.startswith(prefix):
            bad = [d for d in deps if d.startswith(ALGORITHMS)]
            assert bad == [], f"{module} imports {bad}"


def test_every_module_imports_alone():
    names = sorted(n for n in _imports() if not n.endswith("__main__"))
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m.startswith('captum_iglens')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_one_constant_per_name():
    names = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = []
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for target in targets:
                if target.isupper() and not target.startswith("_"):
                    names.setdefault(target, []).append(_module(path))
    repeated = {k: v for k, v in names.items() if len(v) > 1}
    assert repeated == {}

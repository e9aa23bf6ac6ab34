"""The package's layout rules: no import cycle between modules, helpers never
import the algorithms they serve, and every module imports on its own."""

import ast
import functools
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Union

import pytest

import captum_iglens

PACKAGE = Path(captum_iglens.__file__).parent
# What _utils folders and the data-only modules may never import.
ALGORITHMS = ("captum_iglens.attr.layer_ig_lens", "captum_iglens.studies")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)  # read only: parsed once per session
def _imports(type_checking: bool = False) -> Dict[str, Set[str]]:
    """Each module's imports of package modules, at any depth of the file
    (function-level imports included; those made only for type checkers only
    with ``type_checking``). Relative imports are resolved, and an imported name
    counts as its module's deepest package module."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        found = set()
        tree = ast.parse(path.read_text())
        if not type_checking:
            for node in list(ast.walk(tree)):
                if isinstance(node, ast.If) and getattr(node.test, "id", "") == (
                    "TYPE_CHECKING"
                ):
                    node.body = []
        package = (
            name.split(".") if path.name == "__init__.py" else (name.split(".")[:-1])
        )
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package[: len(package) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    found.add(target)
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


def test_no_import_cycle_of_any_kind():
    # Package __init__ edges, function-level and type-checking imports all count:
    # importing a package runs its __init__, which imports its modules.
    assert _cycle(_imports(type_checking=True)) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


_LOWER = ("captum_iglens.attr", "captum_iglens.hf", "captum_iglens.integrations")


@pytest.mark.parametrize(
    "prefix",
    ["captum_iglens._utils", "captum_iglens.readout", "captum_iglens.result"],
)
def test_the_bottom_imports_nothing_above_it(prefix):
    above = _LOWER + ("captum_iglens.studies", "captum_iglens.plots")
    for module, deps in _imports(type_checking=True).items():
        if module == prefix or module.startswith(prefix + "."):
            bad = [d for d in deps if d.startswith(above)]
            assert bad == [], f"{module} imports {bad}"


def test_the_viewer_knows_no_result_kind():
    kinds = _LOWER + ("captum_iglens.studies", "captum_iglens.result")
    for module, deps in _imports(type_checking=True).items():
        if module.startswith("captum_iglens.viewer"):
            bad = [d for d in deps if d.startswith(kinds)]
            assert bad == [], f"{module} imports {bad}"


_STUDIES = ("comparison", "validation", "batch")


def test_the_studies_share_a_neutral_method_registry():
    graph = _imports()
    study = tuple(f"captum_iglens.studies.{name}" for name in _STUDIES)
    for module, deps in graph.items():
        if module.startswith("captum_iglens.studies.methods"):
            assert [d for d in deps if d.startswith(study)] == [], module
        for name in _STUDIES:
            if module.startswith(f"captum_iglens.studies.{name}"):
                other = tuple(s for s in study if not s.endswith(name))
                assert [d for d in deps if d.startswith(other)] == [], module
    for name in ("comparison", "validation"):
        users = [
            m
            for m, deps in graph.items()
            if m.startswith(f"captum_iglens.studies.{name}")
            and "captum_iglens.studies.methods.registry" in deps
        ]
        assert users, f"studies.{name} does not read the method registry"


MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 500


def _code_lines(
    node: Union[ast.FunctionDef, ast.AsyncFunctionDef], lines: List[str]
) -> int:
    """A function's code lines (its ``def`` line on): those neither blank nor
    only a comment, its docstring excluded (a nested function's lines count)."""
    first = node.body[0]
    docstring = ast.get_docstring(node, clean=False) is not None
    skipped = range(first.lineno, first.end_lineno + 1) if docstring else range(0)
    count = 0
    for number in range(node.lineno, node.end_lineno + 1):
        text = lines[number - 1].strip()
        if number not in skipped and text and not text.startswith("#"):
            count += 1
    return count


def _oversized(source: str, where: str) -> List[str]:
    """Each function of ``source`` over 80 code lines and each class over 500
    lines, as ``where:line name (size)``."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = _code_lines(node, lines)
            if size > MAX_FUNCTION_LINES:
                found.append(
                    f"{where}:{node.lineno} function {node.name} has {size} code "
                    f"lines (at most {MAX_FUNCTION_LINES})"
                )
        elif isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_CLASS_LINES:
                found.append(
                    f"{where}:{node.lineno} class {node.name} has {size} lines "
                    f"(at most {MAX_CLASS_LINES})"
                )
    return found


def test_no_function_over_80_code_lines_and_no_class_over_500_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += _oversized(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == [], "\n".join(found)


def test_the_size_check_counts_code_lines_and_names_the_place():
    body = "".join(f"    x{i} = {i}\n" for i in range(79))  # and its def line
    padding = '    """A docstring.\n\n    Lines.\n    """\n\n    # a comment\n\n'
    fits = f"def fits():\n{padding}{body}"
    assert _oversized(fits, "m.py") == []
    long = f"import os\n\n\ndef long():\n{padding}{body}    return x0\n"
    assert _oversized(long, "m.py") == [
        "m.py:4 function long has 81 code lines (at most 80)"
    ]
    methods = "".join(
        f"    def f{i}(self):\n        return {i}\n\n" for i in range(167)
    )
    assert _oversized(f"class Big:\n{methods}", "m.py") == [
        "m.py:1 class Big has 501 lines (at most 500)"
    ]


def test_every_result_kind_has_a_viewer():
    from captum_iglens._utils.serialization import JsonDocument

    for name in sorted(n for n in _imports() if not n.endswith("__main__")):
        importlib.import_module(name)
    kinds = _subclasses(JsonDocument)
    assert len(kinds) >= 4
    lacking = [k.__name__ for k in kinds if not callable(getattr(k, "to_html", None))]
    assert lacking == []


def _subclasses(cls: type) -> List[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


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


@pytest.mark.slow
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

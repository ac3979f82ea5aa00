"""The package's imports point one way: config.py at the base, no import cycles between ampft modules.

The graph is read from the source (`ast`), from the statements that run at import time (module level,
including inside `if`/`try`, not inside functions or `if TYPE_CHECKING:`). Importing `a.b.c` runs the
packages `a` and `a.b` first, so it is an edge to those too, except to the importer's own packages (which
are already being initialised when it runs). A package that imports its subpackages by discovery
(`pkgutil.iter_modules(__path__)`, as `ampft.tasks` does with the task families) imports each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ampft

SRC = Path(ampft.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = ("ampft", *path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _top_level(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody
                                  + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _top_level(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
                continue
            base = node.module or ""
            if node.level:  # relative: from . import x / from .mod import y
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])])
            targets.add(base)
            targets |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
        if "iter_modules" in {getattr(n.func, "attr", None) for n in ast.walk(ast.parse(path.read_text()))
                              if isinstance(n, ast.Call)}:
            targets |= {m for m in modules if m.rpartition(".")[0] == name and modules[m].name == "__init__.py"}
        own = set(_ancestors(name)) | {name}
        edges = set()
        for target in targets:
            if target in modules:
                edges |= {target, *(a for a in _ancestors(target) if a in modules)}
        graph[name] = edges - own
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_graph_sees_the_package():
    graph = import_graph()
    # a sanity check of the reader: known edges are found (absolute, submodule and parent-package ones)
    assert "ampft.config" in graph["ampft.validation"]
    assert "ampft.precision" in graph["ampft.validation"]
    assert "ampft.data" in graph["ampft.validation"]  # through ampft.data.load: its package runs first
    assert {"ampft.tasks.classification", "ampft.tasks.token_classification",
            "ampft.tasks.question_answering"} <= graph["ampft.tasks"]  # discovered family packages
    assert "ampft.tasks" not in graph["ampft.tasks.classification.family"]  # its own package: already running


def test_no_import_cycles():
    assert _cycle(import_graph()) is None, " -> ".join(_cycle(import_graph()))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _ampft_imports(module: str) -> list[str]:
    tree = ast.parse((SRC / module).read_text())
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return [n for n in names if n == "ampft" or n.startswith("ampft.")]


def test_config_is_the_base():
    """config.py imports from ampft only the error classes (whose module imports nothing from ampft), at
    module level or inside functions."""
    assert _ampft_imports("config.py") == ["ampft.errors"]
    assert _ampft_imports("errors.py") == []

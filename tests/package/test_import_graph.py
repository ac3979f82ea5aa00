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


# Package level: each module or subpackage directly under src/ampft is one node (`ampft.tasks.classification.family`
# is `tasks`), and every import of ampft counts, inside functions too: a deferred import dodges a cycle at import
# time but is still a dependency. Only `if TYPE_CHECKING:` imports are left out (annotations, never run: a lower
# layer may name the interface of the objects handed down to it, as data/ and engine name `tasks.base.Family`).


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If)
              and ast.unparse(n.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")]
    return {id(inner) for block in blocks for stmt in block.body for inner in ast.walk(stmt)}


def package_graph(src: Path = SRC) -> dict[str, dict[str, list[str]]]:
    """{package: {package it imports: ["path:line", ...]}} over the top-level modules and subpackages of `src`."""
    nodes = {p.stem if p.is_file() else p.name for p in src.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    graph: dict[str, dict[str, list[str]]] = {n: {} for n in nodes}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        node = rel.with_suffix("").parts[0]
        if node not in nodes:
            continue  # src/ampft/__init__.py: the version string
        package = rel.parent.parts if path.name == "__init__.py" else rel.with_suffix("").parts[:-1]
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        for imp in ast.walk(tree):
            if id(imp) in skip or not isinstance(imp, ast.Import | ast.ImportFrom):
                continue
            if isinstance(imp, ast.Import):
                names = [a.name.split(".") for a in imp.names]
            elif imp.level:  # relative: resolved against the importing module's package
                base = ["ampft", *package[: len(package) - imp.level + 1], *filter(None, [imp.module])]
                names = [base + [a.name] if len(base) == 1 else base for a in imp.names]
            else:
                base = (imp.module or "").split(".")
                names = [base + [a.name] for a in imp.names] if base == ["ampft"] else [base]
            for name in names:
                if name[0] == "ampft" and len(name) > 1 and name[1] in nodes and name[1] != node:
                    graph[node].setdefault(name[1], []).append(f"{rel}:{imp.lineno}")
    return graph


def package_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """One cycle, as a path that returns to its start, per group of packages that import each other (a
    strongly connected component of more than one package)."""
    reach = {n: set() for n in graph}
    for start in graph:
        todo = [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in reach[start]:
                    reach[start].add(nxt)
                    todo.append(nxt)
    groups = {frozenset(m for m in reach[n] if n in reach[m]) for n in graph if n in reach[n]}
    return [_cycle({n: set(graph[n]) & group for n in group}) for group in sorted(groups, key=sorted)]


def cycle_report(graph: dict[str, dict[str, list[str]]], cycles: list[list[str]]) -> str:
    """Each cycle, then each of its edges with the imports that make it."""
    return "\n".join(" -> ".join(c) + "".join(f"\n    {a} -> {b}: {', '.join(graph[a][b])}"
                                             for a, b in zip(c, c[1:], strict=False))
                     for c in cycles)


def test_no_package_cycles():
    graph = package_graph()
    cycles = package_cycles(graph)
    assert not cycles, "package import cycles:\n" + cycle_report(graph, cycles)


def test_package_graph_reads_every_kind_of_import(tmp_path):
    """The reader, on a package written here: module-level, function-level, `from ampft import x`, relative
    and TYPE_CHECKING imports, and a cycle through three packages that is named."""
    src = tmp_path / "ampft"
    for folder in ("a", "a/sub", "b", "d"):
        (src / folder).mkdir(parents=True)
        (src / folder / "__init__.py").write_text("")
    files = {
        "__init__.py": "import ampft.a\n",
        "a/sub/deep.py": "from ampft.b.x import y\nfrom .. import inner\n",
        "a/inner.py": "def f():\n    from ampft import c\n",
        "b/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ampft.d import T\ny = 1\n",
        "b/__init__.py": "from . import x\n",
        "c.py": "import ampft.b.x as bx\nimport os\n",
        "d/__init__.py": "from ampft.c import bx\n",
    }
    for name, text in files.items():
        (src / name).write_text(text)
    graph = package_graph(src)
    assert {n: set(e) for n, e in graph.items()} == {"a": {"b", "c"}, "b": set(), "c": {"b"}, "d": {"c"}}
    assert graph["a"]["c"] == ["a/inner.py:2"]
    assert package_cycles(graph) == []
    (src / "b" / "x.py").write_text("def g():\n    import ampft.a.inner\n")
    graph = package_graph(src)
    assert package_cycles(graph) == [["a", "b", "a"]]  # a -> c -> b -> a is in the same group; one cycle named
    assert cycle_report(graph, package_cycles(graph)) == (
        "a -> b -> a\n    a -> b: a/sub/deep.py:1\n    b -> a: b/x.py:2")

"""The layers hold: app/ and kvcore/ have no import cycle (counting every import: in functions
and under TYPE_CHECKING too), and kvcore/ is pure (standard library only, neither agent/ nor app/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def module_names(root: Path, package: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the same tree it imports (`from a.b import c` names a.b.c when
    that is a module, else a.b)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[name] |= {t for t in targets if t in mods and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_app_has_no_import_cycle() -> None:
    assert cycles(import_edges(module_names(REPO, "app"))) == []


def test_the_check_finds_a_cycle_hidden_in_a_function_and_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p.b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    (pkg / "c.py").write_text("import p.a\n")
    assert cycles(import_edges(module_names(tmp_path, "p"))) == [["p.a", "p.b"]]


def top_level_imports(package: str) -> dict[str, set[str]]:
    """module path -> the top-level names it imports (absolute imports, anywhere in the file)."""
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
        out[str(path.relative_to(REPO))] = names
    return out


def test_the_shared_core_imports_only_the_standard_library_and_itself() -> None:
    import sys

    foreign = {
        path: sorted(n for n in names if n != "kvcore" and n not in sys.stdlib_module_names)
        for path, names in top_level_imports("kvcore").items()
    }
    assert {p: n for p, n in foreign.items() if n} == {}


def test_the_agent_and_the_app_both_import_the_shared_core_and_the_agent_never_imports_the_app() -> None:
    agent, app = top_level_imports("agent"), top_level_imports("app")
    assert any("kvcore" in names for names in agent.values())
    assert any("kvcore" in names for names in app.values())
    assert sorted(p for p, names in agent.items() if "app" in names) == []


def test_the_shared_core_has_no_import_cycle() -> None:
    assert cycles(import_edges(module_names(REPO, "kvcore"))) == []


def test_test_helpers_are_imported_one_way_absolute_from_the_repository_root() -> None:
    """`from tests.pg import ...`: no relative imports, no bare helper names, no sys.path edits. The
    one exception is the real-vLLM smoke script (run by tests/realvllm/setup.sh outside pytest) and
    the fallback import it needs in tests/realvllm/server.py."""
    import sys

    tests = REPO / "tests"
    helpers = {p.stem for p in tests.rglob("*.py")} - {"__init__"} - set(sys.stdlib_module_names)
    found: list[str] = []
    for path in sorted(tests.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel == "tests/realvllm/smoke.py" or "fixtures" in path.parts:
            continue
        text = path.read_text()
        if re.search(r"sys\.path\.(insert|append)\(", text):
            found.append(f"{rel}: edits sys.path")
        tree = ast.parse(text, rel)
        fallback = {id(n) for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) for n in ast.walk(h)}
        for node in ast.walk(tree):
            if id(node) in fallback:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    found.append(f"{rel}:{node.lineno}: relative import")
                elif node.module and node.module.split(".")[0] in helpers:
                    found.append(f"{rel}:{node.lineno}: bare `from {node.module}`")
            elif isinstance(node, ast.Import):
                found += [f"{rel}:{node.lineno}: bare `import {a.name}`" for a in node.names if a.name in helpers]
    assert found == []
    assert all(
        (d / "__init__.py").is_file() for d in [tests, *tests.rglob("*")] if d.is_dir() and any(d.glob("test_*.py"))
    )

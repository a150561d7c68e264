"""docs/architecture.md is true: its layers hold for every import in the code (in functions and
under TYPE_CHECKING too), SQL stays in app/storage/, the parts that build on another part are the
ones the document names, and every package of app/ is placed in the document's table.

The layers, lowest first (a module imports only its own layer and those below):
  foundation  kvcore/, kvscope/__init__.py (the version), kvscope/errors.py, app/paths.py,
              app/selfmetrics.py   (no project imports)
  storage     app/storage/
  settings    app/settings.py, app/context.py
  access      the role machinery every route states (app/auth/roles.py, guard.py and what it needs)
  web         app/web/ (typed route deps, time ranges, templating, CSRF, errors, jobs, docs)
  domain      app/derived/ and app/charts/ (shared computations and figures; no cycle between them)
  parts       app/<part>/ for each part of app.main.PARTS (and app/backup/)
  entry       app/main.py, app/cli.py, every part's cli.py, kvscope/
The agent and the simulator stand beside the app on the foundation: they import kvcore and
kvscope's version and errors, never app/. The app imports of the agent only the libraries named in
AGENT_LIBRARIES (each for a reason docs/architecture.md gives); kvscope/ (entry) starts the agent
and the simulator. No import goes up the layers: the settings check the shape of
the alerts section (the channel shape lives in app/settings.py); which rules and parameters exist,
the alerts part checks when it starts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_import_graph import REPO, module_names

PARTS = ("ingest", "dashboard", "controller", "alerts", "ab", "export", "sizing", "auth", "backup")
FOUNDATION = {"kvscope", "kvscope.errors", "app.paths", "app.selfmetrics"}
# the agent's modules the app runs itself: the A/B and probe workloads (the own-machine executor),
# the rollout's preflight and probe, the engine catalog, the reuse-distance summary the sizing page
# reads, and the private-file helpers (0600 files, 0700 folders)
AGENT_LIBRARIES = (
    "agent.workloads",
    "agent.preflight",
    "agent.preflight_policy",
    "agent.probe",
    "agent.engines",
    "agent.kvevents.reuse",
    "agent.private_files",
)
ACCESS = {"app.auth.roles", "app.auth.guard", "app.auth.sessions", "app.auth.client_addr", "app.auth.limiter"}
RANK = {"foundation": 0, "storage": 1, "settings": 2, "access": 3, "web": 4, "derived": 5, "charts": 5}
PART_RANK, ENTRY_RANK = 7, 8
# the parts that build on another part (A/B runs rollouts; sizing applies a size through a
# rollout and checks it with an A/B; the Prometheus source serves the dashboard's chart JSON):
# docs/architecture.md names exactly these
PART_DEPENDS = {("ab", "controller"), ("sizing", "controller"), ("sizing", "ab"), ("export", "dashboard")}


def layer_of(mod: str) -> tuple[int, str] | None:
    """(rank, group) of a project module; None outside the app's layering (agent, simulator)."""
    top, _, rest = mod.partition(".")
    if top == "kvcore" or mod in FOUNDATION:
        return RANK["foundation"], "foundation"
    if top == "kvscope":
        return ENTRY_RANK, "entry"
    if top != "app":
        return None
    sub = rest.partition(".")[0]
    if mod in ("app.settings", "app.context"):
        return RANK["settings"], "settings"
    if mod in ACCESS:
        return RANK["access"], "access"
    if mod in ("app", "app.main", "app.cli") or (sub in PARTS and mod.endswith(".cli")):
        return ENTRY_RANK, "entry"
    if sub in RANK:
        return RANK[sub], "domain" if sub in ("derived", "charts") else sub
    if sub in PARTS:
        return PART_RANK, sub
    raise AssertionError(f"{mod} is in no layer: place it in docs/architecture.md and in this test")


def project_modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in ("app", "kvcore", "kvscope", "agent", "simulator"):
        mods |= module_names(REPO, pkg)
    return mods


def imports_of(path: Path, mods: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in mods}


def layer_violations() -> list[str]:
    mods = project_modules()
    bad: list[str] = []
    for name, path in sorted(mods.items()):
        me = layer_of(name)
        for target in sorted(imports_of(path, mods) - {name}):
            if me is None:  # agent/ and simulator/: the foundation and their own tree only
                own = name.partition(".")[0]
                there = layer_of(target)
                if target.partition(".")[0] != own and (there is None or there[1] != "foundation"):
                    bad.append(f"{name} -> {target}")
                continue
            it = layer_of(target)
            if it is None and (me[1] == "entry" or target.startswith(AGENT_LIBRARIES)):
                continue
            if it is None:
                bad.append(f"{name} -> {target} (not one of the agent libraries the app may use)")
            elif it[0] > me[0]:
                bad.append(f"{name} -> {target} (up from {me[1]} to {it[1]})")
            elif it[0] == me[0] == PART_RANK and it[1] != me[1] and (me[1], it[1]) not in PART_DEPENDS:
                bad.append(f"{name} -> {target} (part {me[1]} on part {it[1]}, not declared)")
    return bad


def test_every_import_goes_down_the_documented_layers() -> None:
    assert layer_violations() == []


def test_the_agent_and_the_simulator_never_import_the_app() -> None:
    mods = project_modules()
    for name, path in mods.items():
        if name.partition(".")[0] in ("agent", "simulator"):
            assert not {t for t in imports_of(path, mods) if t.startswith("app")}, name


SQL_NAMES = {"select", "insert", "update", "delete", "text", "func", "and_", "or_", "case", "literal_column"}


def test_sql_is_written_only_in_the_storage_layer() -> None:
    """Outside app/storage/ (and migrations/) code may name sqlalchemy's Engine and Connection
    types, never build or run a statement."""
    bad: list[str] = []
    for name, path in sorted(module_names(REPO, "app").items()):
        if name.startswith("app.storage"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sqlalchemy"):
                names = {a.name for a in node.names}
                if node.module != "sqlalchemy" or names - {"Engine", "Connection"}:
                    bad.append(f"{name}: from {node.module} import {sorted(names)}")
            elif isinstance(node, ast.Attribute) and node.attr in ("execute", "exec_driver_sql", "scalars"):
                bad.append(f"{name}: .{node.attr}(...) at line {node.lineno}")
            elif isinstance(node, ast.Name) and node.id in SQL_NAMES and isinstance(node.ctx, ast.Load):
                pass  # plain names such as `text` are common words; the import check above is the rule
    assert bad == []


def test_the_check_finds_an_upward_import_and_an_undeclared_part_dependency() -> None:
    assert layer_of("app.storage.raw_store") == (RANK["storage"], "storage")
    assert layer_of("app.sizing.cli") == (ENTRY_RANK, "entry")
    assert layer_of("app.alerts.rules") == (PART_RANK, "alerts")
    assert ("alerts", "sizing") not in PART_DEPENDS and ("sizing", "controller") in PART_DEPENDS


DOC = REPO / "docs" / "architecture.md"


def test_the_document_places_every_package_and_top_level_module_of_the_app() -> None:
    text = DOC.read_text()
    packages = sorted(p.name for p in (REPO / "app").iterdir() if (p / "__init__.py").exists())
    top_modules = sorted(p.name for p in (REPO / "app").glob("*.py") if p.name != "__init__.py")
    missing = [f"app/{p}/" for p in packages if f"app/{p}/" not in text]
    missing += [f"app/{m}" for m in top_modules if f"app/{m}" not in text]
    assert missing == [], f"docs/architecture.md does not place {missing}"


def test_the_document_names_exactly_the_parts_that_build_on_another_part() -> None:
    text = DOC.read_text()
    m = re.search(r"Parts that build on another part:(.*?)\n\n", text, re.S)
    assert m, "docs/architecture.md lost its 'Parts that build on another part:' paragraph"
    named = set(re.findall(r"`app/(\w+)/` on `app/(\w+)/`", m.group(1)))
    assert named == PART_DEPENDS


def test_the_document_lists_the_parts_create_app_mounts() -> None:
    from app.main import PARTS as MOUNTED

    text = DOC.read_text()
    for part in MOUNTED:
        pkg = part.__module__.split(".")[1] if hasattr(part, "__module__") else str(part)
        assert f"app/{pkg}/" in text, pkg


def test_the_agent_libraries_the_app_uses_pull_in_no_other_part_of_the_agent() -> None:
    """What the app imports of the agent (AGENT_LIBRARIES) imports only kvcore, the foundation and
    other agent libraries: never the agent's loop, pusher or launchers."""
    mods = project_modules()
    bad = []
    for name, path in sorted(mods.items()):
        if name.startswith(AGENT_LIBRARIES):
            for target in imports_of(path, mods):
                if target.startswith("agent") and target != "agent" and not target.startswith(AGENT_LIBRARIES):
                    bad.append(f"{name} -> {target}")
    assert bad == []


def test_the_app_and_the_agent_read_their_settings_through_one_stdlib_mechanism() -> None:
    """app/settings.py and agent/settings.py both layer their sources with
    kvcore/settings_sources.py, which imports the standard library only; nothing else of the
    agent reads KVSCOPE_* variables itself."""
    import sys

    mods = project_modules()
    for reader in ("app.settings", "agent.settings"):
        assert "kvcore.settings_sources" in imports_of(mods[reader], mods), reader
    tree = ast.parse(mods["kvcore.settings_sources"].read_text())
    tops = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    tops |= {
        n.module.partition(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0
    }
    assert tops - {"__future__"} <= set(sys.stdlib_module_names)
    readers = [
        name
        for name, path in mods.items()
        if name.startswith("agent")
        and name != "agent.settings"
        and re.search(r"environ\.get\(\"KVSCOPE_", path.read_text())
    ]
    assert readers == []


# --- the tests mirror the code (docs/architecture.md, "The tests")
TEST_TIERS = {"realvllm", "browser", "rig", "scale", "security"}
MIRRORS = {"app": REPO / "app", "agent": REPO / "agent", "kvcore": REPO / "kvcore", "simulator": REPO / "simulator"}
TESTS = REPO / "tests"


def _test_folders(root: Path) -> list[Path]:
    """Folders holding at least one test module (data folders such as captures/ hold none)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("test_*.py")))


def _mirror_misses() -> list[str]:
    misses = []
    for folder in _test_folders(TESTS):
        name = folder.name
        if name in TEST_TIERS or name == "fixtures":
            continue
        if name == "kvscope":
            for sub in _test_folders(folder):
                if not (REPO / "kvscope" / f"{sub.name}.py").is_file():
                    misses.append(f"tests/kvscope/{sub.name}/ names no command of kvscope/")
            continue
        code = MIRRORS.get(name)
        if code is None:
            misses.append(f"tests/{name}/ mirrors no package and is no declared tier")
            continue
        for sub in _test_folders(folder):
            if not (code / sub.name / "__init__.py").is_file():
                misses.append(f"tests/{name}/{sub.name}/ mirrors no package {name}/{sub.name}/")
    return misses


def test_every_test_folder_mirrors_a_package_of_the_code_or_is_a_declared_tier() -> None:
    assert _mirror_misses() == []


def test_the_document_names_every_tier_of_the_tests() -> None:
    text = DOC.read_text()
    for tier in TEST_TIERS:
        assert f"`tests/{tier}/`" in text, tier


def test_the_test_folders_are_packages_so_helpers_import_one_way() -> None:
    missing = [
        str(p.relative_to(REPO))
        for p in TESTS.rglob("test_*.py")
        if "__pycache__" not in p.parts and not (p.parent / "__init__.py").is_file()
    ]
    assert missing == []

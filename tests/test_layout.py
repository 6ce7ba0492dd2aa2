"""The package's shape: no import cycles (lazy imports included), command-line code only in the
CLI layer, every extension point a registry, and no citation of files outside the repository."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import rulegraph

PACKAGE = Path(rulegraph.__file__).parent
ROOT = PACKAGE.parent
#: what the core may not import: the command line's libraries
CLI_ONLY = ("click", "rich")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


#: modules that import by a computed name, and the tables that name what they import (read here,
#: so the cycle check follows those imports too)
DYNAMIC = {
    "rulegraph": lambda: [f"rulegraph.{module}" for module in rulegraph._PUBLIC.values()],
    "rulegraph.cli": lambda: [f"rulegraph.cli.{module}" for module, _, _ in _commands().values()],
}


def _commands():
    from rulegraph.cli import COMMANDS
    return COMMANDS


def _is_import_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
        or isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))


def _imports(name: str, path: Path, known: set[str]) -> list[str]:
    """The rulegraph modules ``name`` imports anywhere in its text (function bodies too), by
    import statements and by ``importlib.import_module`` (a literal name, or a table in :data:`DYNAMIC`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if _is_import_module(node):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                literal = target.value
                found += [f"{package}{literal}" if literal.startswith(".") else literal]
            else:
                assert name in DYNAMIC, f"{name} imports a computed module name; list what it imports in DYNAMIC"
                found += DYNAMIC[name]()
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found += [t for t in targets if t in known and t != name]
    return [t for t in found if t in known and t != name]


def _external(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_the_package_has_no_import_cycle():
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in _imports(name, path, set(modules)))
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_cycle_check_sees_lazy_imports(tmp_path):
    """The check above would catch a cycle made of a function-level import, or of importlib."""
    (tmp_path / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "c.py").write_text("import importlib\nimportlib.import_module('.b', __package__)\n")
    known = {"pkg.a", "pkg.b", "pkg.c"}
    assert _imports("pkg.a", tmp_path / "a.py", known) == ["pkg.b"]
    assert _imports("pkg.c", tmp_path / "c.py", known) == ["pkg.b"]
    (tmp_path / "d.py").write_text("import importlib\nname = 'b'\nimportlib.import_module(name)\n")
    with pytest.raises(AssertionError, match="computed module name"):
        _imports("pkg.d", tmp_path / "d.py", known)


@pytest.mark.parametrize("name", [n for n in _modules() if not n.startswith("rulegraph.cli")])
def test_command_line_libraries_stay_in_the_cli_layer(name):
    assert not _external(_modules()[name]) & set(CLI_ONLY), f"{name} imports {CLI_ONLY}; move it to rulegraph.cli"


def test_no_citation_of_files_outside_the_repository():
    offenders = [str(p.relative_to(ROOT)) for p in [*PACKAGE.rglob("*.py"), *(ROOT / "rules").glob("*.yaml")]
                 if "seeds/" in p.read_text() or "DESIGN.md" in p.read_text()]
    assert not offenders


def test_every_pass_has_its_rule_registry():
    from rulegraph.passes import PASSES
    from rulegraph.propagation import RULES
    assert sorted(PASSES) == sorted(RULES)


def test_a_registry_refuses_a_name_twice_and_names_the_choices():
    from rulegraph.errors import RulegraphError
    from rulegraph.registry import Registry
    r = Registry("widget")
    r.register("round")(object())
    with pytest.raises(RuntimeError, match="widget 'round' is registered twice"):
        r.register("round")(object())
    with pytest.raises(RulegraphError, match="unknown widget 'rond'; did you mean 'round'"):
        r.get("rond")


def test_test_modules_have_unique_names():
    """pytest imports test modules by their base name (the test folders are not packages): two
    ``test_x.py`` in different folders stop the whole run at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []

"""The code's shape, checked: small classes and functions where decisions and protocols live,
and no session state compared as a bare string outside the lifecycle table and the store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("processors", "workers", "streams")
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 60
STATE_NAMES = {"active", "suspended", "closed", "execution", "terminated"}
# the table itself, and the store whose scripts spell the states (held to the table by
# tests/streams/test_generations_equivalence.py)
STATE_OWNERS = {"processors/lifecycle.py", "streams/generations.py", "streams/generations_memory.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(ROOT)), ast.parse(p.read_text()))
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def test_no_class_or_function_too_long():
    too_long = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _length(node) > MAX_CLASS_LINES:
                too_long.append(f"{path}: class {node.name} ({_length(node)} lines)")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > MAX_FUNCTION_LINES:
                too_long.append(f"{path}: {node.name} ({_length(node)} lines)")
    assert not too_long, too_long


def _state_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in STATE_NAMES


def test_session_states_are_compared_only_through_the_enums():
    """A session state written as a bare string in a comparison is a second vocabulary, and
    the start of a transition encoded outside the table."""
    found = []
    for path, tree in _modules():
        if path in STATE_OWNERS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for op in operands:
                    seq = op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set)) else [op]
                    if any(_state_literal(x) for x in seq):
                        found.append(f"{path}:{node.lineno}")
    assert not found, found


@pytest.mark.parametrize("name", ["TRANSITIONS", "transition"])
def test_the_table_is_read_where_sessions_change_state(name):
    """The dispatch core and the control plane's session records go through the one table."""
    users = {path for path, tree in _modules()
             for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names)}
    if name == "TRANSITIONS":
        assert users == set(), users  # nobody reads the raw table: transition() is the door
    else:
        assert "processors/dispatch.py" in users


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path, node: ast.AST, known: set[str]) -> set[str]:
    """The chunkserve modules one import statement names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    assert isinstance(node, ast.ImportFrom)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    return out | ({base} if base in known else set())


def test_no_import_cycle_is_hidden_by_an_import_inside_a_function_or_type_check():
    """Layers point down: an import made late (in a function, under TYPE_CHECKING) must not
    close a circle that the module-level imports would refuse."""
    paths = {_module_name(p): p for pkg in (*PACKAGES, "schemas", "infra") for p in (ROOT / pkg).rglob("*.py")}
    known = set(paths)
    top: dict[str, set[str]] = {}
    late: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        top[name], late[name] = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                (top if node in tree.body else late)[name] |= _imports(name, path, node, known)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(top.get(m, ()))
        return False

    cycles = [f"{m} -> {t}" for m in sorted(late) for t in sorted(late[m]) if t != m and reaches(t, m)]
    assert cycles == []


# what each package may import of chunkserve's: schemas <- streams <- processors, workers <- infra
MAY_IMPORT = {"schemas": {"schemas"}, "streams": {"schemas", "streams"},
              "processors": {"schemas", "streams", "processors"}, "workers": {"schemas", "streams", "workers"},
              "infra": {"schemas", "streams", "processors", "workers", "infra"}}


def test_imports_point_downward():
    """No package imports one above it, at module level or late (in a function)."""
    paths = {_module_name(p): p for pkg in MAY_IMPORT for p in (ROOT / pkg).rglob("*.py")}
    known = set(paths)
    upward = []
    for name, path in paths.items():
        pkg = name.split(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                upward += [f"{name} -> {t}" for t in sorted(_imports(name, path, node, known))
                           if t.split(".")[0] not in MAY_IMPORT[pkg]]
    assert upward == []

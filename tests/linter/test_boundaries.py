"""The engine's shape, checked from the source: rules import only the public
model (and ``torchlint.rule``), and the engine's modules import each other
without a cycle, function-level imports included."""
from __future__ import annotations

import ast
import os
from typing import Dict, List, Set

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = os.path.join(REPO, "torchlint")
RULES = os.path.join(REPO, "rules")
# What a rule may import from torchlint: the model, and the Rule/Evidence base.
RULE_FACING = {"torchlint.model", "torchlint.rule"}


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(path: str, package: str) -> Set[str]:
    """Every torchlint module ``path`` imports at run time, at any depth
    (imports only a type checker reads are left out)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found: Set[str] = set()
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _under_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("torchlint"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.startswith("torchlint"):
                found.add(module)
                # ``from torchlint import crossfile`` imports a module too
                found.update(f"{module}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def engine_graph() -> Dict[str, Set[str]]:
    modules = {
        f"torchlint.{name[:-3]}": os.path.join(ENGINE, name)
        for name in os.listdir(ENGINE)
        if name.endswith(".py") and name != "__init__.py"
    }
    return {module: imported_modules(path, "torchlint") & set(modules) - {module} for module, path in modules.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    state: Dict[str, int] = {}
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_the_engine_imports_without_a_cycle():
    cycle = find_cycle(engine_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_function_level_and_type_checking_imports_are_told_apart(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from torchlint.walker import Walker\n"
        "def f():\n    from torchlint import crossfile\n"
    )
    found = imported_modules(str(module), "torchlint")
    assert "torchlint.crossfile" in found
    assert "torchlint.walker" not in found


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(RULES) if n.startswith("tl") and n.endswith(".py")))
def test_a_rule_imports_only_the_model(name):
    imported = {m for m in imported_modules(os.path.join(RULES, name), "torchlint.rules") if not m.startswith("torchlint.rules")}
    # ``from torchlint.model import X`` adds ``torchlint.model.X``: the module is what counts
    modules = {m for m in imported if m in RULE_FACING or not any(m.startswith(f + ".") for f in RULE_FACING)}
    assert modules <= RULE_FACING, f"{name} imports {sorted(modules - RULE_FACING)}"


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(RULES) if n.startswith("tl") and n.endswith(".py")))
def test_a_rule_does_not_read_the_walk_stack(name):
    with open(os.path.join(RULES, name), encoding="utf-8") as handle:
        source = handle.read()
    assert "ctx.stack" not in source, f"{name} reads ctx.stack; ask ctx.site() instead"

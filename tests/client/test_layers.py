"""The client's architecture contract: it imports only protocol among our packages, and its modules
form no import cycle. Every import counts (TYPE_CHECKING blocks and function-local ones included)."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
OURS = {"client", "protocol", "server", "storage"}


def imports(path: Path, module: str) -> set[str]:
    """Every module of ours that ``path`` (the module ``module``) imports, anywhere in the file."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)   # "from pkg import module"
    return {m for m in found if m.split(".")[0] in OURS}


def client_graph() -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (SRC / "client").rglob("*.py")}
    return {m: {i for i in imports(p, m) if i in modules and i != m} | {i for i in imports(p, m) if i not in modules}
            for m, p in modules.items()}


def test_the_client_imports_only_protocol_of_ours() -> None:
    bad = {m: sorted(i for i in deps if i.split(".")[0] not in ("client", "protocol"))
           for m, deps in client_graph().items()}
    assert {m: d for m, d in bad.items() if d} == {}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt in graph and not state.get(nxt):
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return None
    for node in sorted(graph):
        if not state.get(node):
            found = visit(node)
            if found:
                return found
    return None


def test_the_client_has_no_import_cycle() -> None:
    graph = {m: {d for d in deps if d.startswith("client")} for m, deps in client_graph().items()}
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None

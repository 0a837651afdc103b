"""The architecture contract (docs/architecture.md): no import cycle in src/, and the package layers.

Every ``import`` statement of a module counts, wherever it is: module level, inside a function, or
under ``if TYPE_CHECKING:`` (they are the same coupling, and a function-local import only hides a
cycle from the interpreter). The layers:

    protocol  imports nothing of ours
    storage   imports only protocol
    client    imports only protocol
    server    imports storage and protocol

A new top-level package in src/ is a break until it is added to ``LAYERS``. Importing a module
implies importing the packages that contain it; those edges (a submodule to its own ancestor
packages) are not counted, or every package whose ``__init__`` re-exports its submodules would be
a cycle. Dynamic imports (``importlib.import_module``) are not seen.

The check of the real src/ is ``test_src_has_no_import_cycles_or_layer_breaks``; the other tests run
the same checker on small synthetic trees to show that it finds what it must.

docs/architecture.md has one line per module saying its job: a line that starts with the module's
path under src/ (``server/turns.py  TurnRunner: ...``), followed by the job.
``test_every_module_has_its_line_in_architecture_md`` fails when a module has no such line, and when
a line names a module that no longer exists.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ARCHITECTURE_MD = SRC.parent / "docs" / "architecture.md"

#: top-level package -> the other top-level packages of ours it may import
LAYERS: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "storage": frozenset({"protocol"}),
    "client": frozenset({"protocol"}),
    "server": frozenset({"storage", "protocol"}),
}


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under src (a package is its ``__init__``)."""
    mods = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).with_suffix("")
        if not all(part.isidentifier() for part in rel.parts):
            continue                    # not importable (e.g. a stray file in a dashed folder)
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (every import statement, wherever it is)."""
    mods = modules(src)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        here = mod if mod in packages else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets = [source] + [f"{source}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                r = resolve(target)
                if r and r != mod and not (r in packages and mod.startswith(r + ".")):
                    graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found, key=lambda c: (-len(c), c))


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """``"a.b -> c.d"`` for every import across top-level packages that LAYERS does not allow."""
    bad = []
    for mod, targets in sorted(graph.items()):
        top = mod.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            if other == top:
                continue
            if top not in LAYERS:
                bad.append(f"{mod} -> {target} ({top} is not in the layer table)")
            elif other not in LAYERS[top]:
                bad.append(f"{mod} -> {target} ({top} may import only {sorted(LAYERS[top]) or 'nothing of ours'})")
    return bad


def violations(src: Path) -> list[str]:
    graph = import_graph(src)
    return [f"import cycle of {len(c)} modules: {', '.join(c)}" for c in cycles(graph)] + \
        [f"layer broken: {b}" for b in layer_breaks(graph)]


# ---------------------------------------------------------------- the real tree
def test_src_has_no_import_cycles_or_layer_breaks() -> None:
    found = violations(SRC)
    assert not found, "\n".join(found)


# ---------------------------------------------------------------- the checker, on synthetic trees
def write_tree(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return src


CLEAN = {
    "protocol/__init__.py": "from .codes import Code\nfrom .frame import encode\n",
    "protocol/codes.py": "import enum\nclass Code(enum.IntEnum):\n    A = 1\n",
    "protocol/frame.py": "from protocol.codes import Code\ndef encode(): return Code.A\n",
    "storage/__init__.py": "from storage.store import Store\n",
    "storage/store.py": "from protocol import Code\nfrom . import models\n",
    "storage/models.py": "import dataclasses\n",
    "client/__init__.py": "",
    "client/app.py": "import protocol.frame\nfrom client import ui\n",
    "client/ui.py": "def draw():\n    from protocol.codes import Code\n    return Code\n",
    "server/__init__.py": "",
    "server/app.py": "from server.handlers import chat\nfrom storage import Store\nimport protocol\n",
    "server/handlers/__init__.py": "",
    "server/handlers/chat.py": "from ..errors import Oops\nfrom server import errors\n",
    "server/errors.py": "class Oops(Exception): pass\n",
}


def test_a_layered_tree_without_cycles_passes(tmp_path: Path) -> None:
    src = write_tree(tmp_path, CLEAN)
    graph = import_graph(src)
    assert graph["server.handlers.chat"] == {"server.errors"}   # relative imports resolved
    assert graph["client.ui"] == {"protocol.codes"}             # a function-local import is an edge
    assert graph["storage.store"] == {"protocol", "storage.models"}
    assert violations(src) == []


def test_a_module_level_cycle_is_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, {**CLEAN, "server/errors.py": "from server.app import x\n"})
    assert violations(src) == ["import cycle of 3 modules: server.app, server.errors, server.handlers.chat"]


def test_a_cycle_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, {**CLEAN, "storage/models.py": (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from storage.store import Store\n")})
    assert violations(src) == ["import cycle of 2 modules: storage.models, storage.store"]


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, {**CLEAN, "protocol/codes.py": (
        "import enum\n"
        "class Code(enum.IntEnum):\n"
        "    A = 1\n"
        "def helper():\n"
        "    from .frame import encode\n"
        "    return encode()\n")})
    assert violations(src) == ["import cycle of 2 modules: protocol.codes, protocol.frame"]


def test_layer_breaks_are_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, {
        **CLEAN,
        "protocol/frame.py": "from protocol.codes import Code\ndef encode():\n    import storage\n",
        "storage/models.py": "from server.errors import Oops\n",
        "client/ui.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from storage import Store\n",
        "server/errors.py": "import client.app\n",
        "tools/__init__.py": "import protocol\n",
    })
    found = violations(src)
    # (storage -> server -> storage is also a cycle, reported first)
    assert found[0].startswith("import cycle of ")
    assert found[1:] == [
        "layer broken: client.ui -> storage (client may import only ['protocol'])",
        "layer broken: protocol.frame -> storage (protocol may import only nothing of ours)",
        "layer broken: server.errors -> client.app (server may import only ['protocol', 'storage'])",
        "layer broken: storage.models -> server.errors (storage may import only ['protocol'])",
        "layer broken: tools -> protocol (tools is not in the layer table)",
    ]


# ---------------------------------------------------------------- one line per module in docs/architecture.md
#: a module's line: its path under src/ (in one of our packages) at the start, then its job
MODULE_LINE = re.compile(r"^\s*((?:%s)/[\w/]*\.py)\s+\S" % "|".join(LAYERS))


def module_paths(src: Path) -> set[str]:
    """``server/turns.py`` for every module under src (``__init__.py`` included)."""
    return {path.relative_to(src).as_posix() for path in modules(src).values()}


def documented_paths(doc: str) -> set[str]:
    return {m.group(1) for line in doc.splitlines() if (m := MODULE_LINE.match(line))}


def doc_gaps(src: Path, doc: str) -> list[str]:
    """Modules without a line, and lines naming modules that do not exist."""
    have, documented = module_paths(src), documented_paths(doc)
    return [f"no line in docs/architecture.md for {m}" for m in sorted(have - documented)] + \
        [f"docs/architecture.md lists {m}, which is not in src/" for m in sorted(documented - have)]


def test_every_module_has_its_line_in_architecture_md() -> None:
    found = doc_gaps(SRC, ARCHITECTURE_MD.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_a_module_without_a_line_is_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, CLEAN)
    doc = "\n".join(f"{p}   what it does" for p in sorted(module_paths(src)) if p != "server/errors.py")
    doc += "\nserver/errors.py\n"                      # a bare path says no job: not a line
    doc += "see server/errors.py for the errors\n"       # a mention in prose is not a line either
    assert doc_gaps(src, doc) == ["no line in docs/architecture.md for server/errors.py"]
    assert doc_gaps(src, doc + "  server/errors.py  Oops, the one error\n") == []


def test_a_line_for_a_module_that_is_gone_is_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, CLEAN)
    doc = "\n".join(f"{p}   what it does" for p in sorted(module_paths(src)))
    assert doc_gaps(src, doc + "\nserver/old.py  removed long ago\n") == [
        "docs/architecture.md lists server/old.py, which is not in src/"]

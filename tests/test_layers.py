"""The layer plan kept honest: every import in `ctxkit/` points down the table in docs/ARCHITECTURE.md.

Read statically (AST), so imports inside functions count as much as module-level ones: a lazy upward
import is still an upward dependency. Also: no import cycles between modules, no `_private` name
imported from another module, and each module's docstring names the layer the table gives it.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ctxkit"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


def module_name(path: Path) -> str:
    """`ctxkit/compress/window.py` -> `ctxkit.compress.window`; a package's `__init__` is the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@lru_cache(maxsize=1)
def layer_table() -> dict[str, int]:
    """The first fenced block of ARCHITECTURE.md: `Lk  a.py  sub/  sub/x.py` rows, continuation lines indented."""
    text = ARCHITECTURE.read_text()
    block = text.split("```\n", 2)[1]
    table: dict[str, int] = {}
    layer = None
    for line in block.splitlines():
        head = re.match(r"^L(\d)\s+(.*)$", line)
        if head:
            layer, rest = int(head.group(1)), head.group(2)
        elif line.startswith(" ") and layer is not None:
            rest = line
        else:
            continue
        for entry in rest.split():
            table[entry] = layer
    return table


def layer_of(module: str) -> int | None:
    """The layer the table gives `module`: an exact file entry wins over its folder's entry."""
    table = layer_table()
    path = modules()[module].relative_to(PACKAGE).as_posix()
    if path in table:
        return table[path]
    for folder in sorted((e for e in table if e.endswith("/")), key=len, reverse=True):
        if path.startswith(folder):
            return table[folder]
    return None


def imports_of(module: str) -> list[tuple[str, str | None, int]]:
    """(target module, imported name or None, line) for every ctxkit import in `module`, lazy ones included."""
    path = modules()[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, str | None, int]] = []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "ctxkit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "ctxkit":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full, None, node.lineno) if full in modules() else (base, alias.name, node.lineno))
    resolved = []
    for target, name, line in found:
        while target not in modules() and "." in target:
            target = target.rsplit(".", 1)[0]
        resolved.append((target, name, line))
    return resolved


def import_graph() -> dict[str, set[str]]:
    """module -> the ctxkit modules it imports (the package root `ctxkit` itself excluded)."""
    return {m: {t for t, _, _ in imports_of(m) if t not in (m, "ctxkit")} for m in modules()}


def test_layer_table_covers_every_module():
    unplaced = [m for m in modules() if m != "ctxkit" and layer_of(m) is None]
    assert unplaced == [], f"modules missing from the layer table in {ARCHITECTURE.name}: {unplaced}"
    stale = [e for e in layer_table() if not (PACKAGE / e).exists()]
    assert stale == [], f"layer table names files that do not exist: {stale}"


def test_imports_point_down_only():
    upward = []
    for module in modules():
        if module == "ctxkit":
            continue  # the package face re-exports names lazily from every layer
        for target, _, line in imports_of(module):
            if target == "ctxkit" or target == module:
                continue
            if layer_of(target) > layer_of(module):
                upward.append(f"{modules()[module].relative_to(REPO)}:{line}: L{layer_of(module)} imports {target} (L{layer_of(target)})")
    assert upward == [], "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_no_private_names_imported_across_modules():
    leaks = [
        f"{modules()[m].relative_to(REPO)}:{line}: imports {name} from {target}"
        for m in modules()
        for target, name, line in imports_of(m)
        if name and name.startswith("_") and not name.startswith("__") and target != m
    ]
    assert leaks == [], "private names imported across modules:\n" + "\n".join(leaks)


@pytest.mark.parametrize("module", [m for m in sorted(modules()) if m != "ctxkit"])
def test_module_docstring_names_its_layer(module):
    path = modules()[module]
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    tags = re.findall(r"(?<![\w-])L(\d)(?![\w-])", doc)
    assert tags, f"{path.relative_to(REPO)}: the docstring does not name its layer (L{layer_of(module)})"
    assert int(tags[0]) == layer_of(module), (
        f"{path.relative_to(REPO)}: the docstring says L{tags[0]}, {ARCHITECTURE.name} says L{layer_of(module)}"
    )


def test_module_size():
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in modules().values() if (n := len(p.read_text().splitlines())) > 520]
    assert long == [], "modules over ~500 lines:\n" + "\n".join(long)


def test_public_names_are_grouped_under_their_layer_in_the_package_face():
    """`ctxkit/__init__.py` lists each public name under a `# Lk` comment: it must be its module's layer."""
    wrong, layer = [], None
    for line in (PACKAGE / "__init__.py").read_text().splitlines():
        head = re.match(r"^\s*# L(\d)\s*$", line)
        entry = re.match(r'^\s*"(\w+)": "(ctxkit[\w.]*)",', line)
        if head:
            layer = int(head.group(1))
        elif entry:
            name, module = entry.groups()
            if layer_of(module) != layer:
                wrong.append(f"{name} ({module}) listed under L{layer}, the table says L{layer_of(module)}")
    assert wrong == []

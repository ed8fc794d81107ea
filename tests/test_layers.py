"""The layer plan kept honest: every import in `ctxkit/` points down the table in docs/ARCHITECTURE.md.

Read statically (AST), so imports inside functions count as much as module-level ones: a lazy upward
import is still an upward dependency. Also: no import cycles between modules, no `_private` name
imported from another module, package faces that resolve, siblings that never meet, and no module left at the top
but the base layer.
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
    """`ctxkit/compress/window.py` -> `ctxkit.context.compress.window`; a package's `__init__` is the package."""
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


def test_module_size():
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in modules().values() if (n := len(p.read_text().splitlines())) > 520]
    assert long == [], "modules over ~500 lines:\n" + "\n".join(long)


def test_public_names_are_grouped_under_their_package_in_the_package_face():
    """`ctxkit/__init__.py` lists each public name under a `# <package>/` comment (or `# L0 ...`): its module
    must sit in that package."""
    wrong, group = [], None
    for line in (PACKAGE / "__init__.py").read_text().splitlines():
        head = re.match(r"^\s*# (\w+/|L0\b)", line)
        entry = re.match(r'^\s*"(\w+)": "(ctxkit[\w.]*)",', line)
        if head:
            group = head.group(1)
        elif entry:
            name, module = entry.groups()
            path = modules()[module].relative_to(PACKAGE).as_posix()
            if (group == "L0" and "/" in path) or (group != "L0" and not path.startswith(group)):
                wrong.append(f"{name} ({module}) listed under {group}")
    assert wrong == []


PACKAGES = ("log", "text", "text.tokenizer", "text.template", "text.rendering", "text.vendor", "context", "training", "cli")
SIBLINGS = ("log/", "text/")


def faces() -> dict[str, dict[str, str]]:
    """package -> its face's `_EXPORTS` (name -> defining module), read statically."""
    out = {}
    for package in PACKAGES:
        tree = ast.parse((PACKAGE / package.replace(".", "/") / "__init__.py").read_text())
        exports = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_EXPORTS")
        out[package] = ast.literal_eval(exports)
    return out


def test_every_package_has_a_face_and_every_name_resolves_to_its_defining_module():
    import importlib

    for package, exports in faces().items():
        face = importlib.import_module(f"ctxkit.{package}")
        assert sorted(face.__all__) == sorted(exports) and exports, package
        for name, module in exports.items():
            assert module in modules(), f"ctxkit.{package}: {name} names a module that does not exist: {module}"
            assert module == f"ctxkit.{package}" or module.startswith(f"ctxkit.{package}."), f"{name}: {module} is outside ctxkit.{package}"
            assert getattr(face, name) is getattr(importlib.import_module(module), name), f"ctxkit.{package}.{name}"


def test_no_face_exports_a_name_equal_to_one_of_its_submodules():
    clashes = []
    for package, exports in faces().items():
        folder = PACKAGE / package.replace(".", "/")
        subs = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        clashes += [f"ctxkit.{package}.{name}" for name in exports if name in subs]
    assert clashes == []


def test_importing_a_package_loads_none_of_its_modules():
    """The faces are lazy: `import ctxkit.text` runs no renderer, template or tokenizer code."""
    code = ("import sys, ctxkit.log, ctxkit.text, ctxkit.context, ctxkit.training, ctxkit.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('ctxkit.') and m.count('.') > 1))")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_sibling_packages_never_import_each_other():
    crossing = []
    for module in modules():
        here = modules()[module].relative_to(PACKAGE).as_posix()
        for target, _, line in imports_of(module):
            there = modules()[target].relative_to(PACKAGE).as_posix()
            for a, b in ((SIBLINGS[0], SIBLINGS[1]), (SIBLINGS[1], SIBLINGS[0])):
                if here.startswith(a) and there.startswith(b):
                    crossing.append(f"{here}:{line} imports {target}")
    assert crossing == [], "log/ and text/ are siblings:\n" + "\n".join(crossing)


def test_no_module_left_at_the_top_but_the_base_layer():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert top == ["content.py", "edits.py", "errors.py", "events.py", "kept_set.py", "registry.py"]


def test_imports_inside_functions_say_why():
    """An import inside a function is there for a reason its `# lazy: <why>` comment gives (an optional or heavy
    dependency loaded on first use); everything else is imported at module level."""
    unexplained = []
    for module, path in modules().items():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here, before = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "# lazy: " not in here and not before.startswith("# lazy: "):
                        unexplained.append(f"{path.relative_to(REPO)}:{node.lineno}: {here.strip()}")
    assert unexplained == [], "imports inside functions without a `# lazy:` reason:\n" + "\n".join(sorted(set(unexplained)))

"""The house rules of docs/layout.md, checked on the code itself (its import statements, read with ast):

- the reader (reader/trace_reader) is laid out in rooms, lowest first: reading, facts, expectation.py, analyzers,
  comparison, render, then the top (cli.py, scripts.py, declared.py, serve.py, the API in __init__.py); a file
  imports only from its own room or a lower one, lazily or not;
- no import circle, in the reader or in fused_geglu/ (lazy imports count: a circle of them is still a circle);
- no private name (a leading underscore) imported from another file, or reached as module._name, by the reader,
  fused_geglu/ or the suite's scripts; tests may reach into the file they test;
- no file of the reader, fused_geglu/ or the suite's own top-level code over 600 lines;
- the reader never imports torch (nor the suite: common, inspect_trace, the scripts).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "reader" / "trace_reader"
GEGLU = ROOT / "fused_geglu"
ROOMS = ["reading", "facts", "expectation", "analyzers", "comparison", "render"]  # then the top
MAX_LINES = 600


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package_dir: Path) -> list[tuple[int, str, list[str]]]:
    """(line, the module imported, the names taken from it) of every import in the file, relative ones resolved."""
    me = module_name(path, package_dir)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module, [a.name for a in node.names]))
    return out


def files(package_dir: Path) -> dict[str, Path]:
    return {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


def graph(package_dir: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports (a submodule named in `from pkg import sub` too): line}."""
    mods = files(package_dir)
    out: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        deps: dict[str, int] = {}
        for line, target, names in imports(path, package_dir):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            # `from pkg import sub` imports the submodule sub; names that are no submodule come from pkg itself
            for t in subs + ([target] if len(subs) < len(names) or not names else []):
                if t in mods and t != mod:
                    deps.setdefault(t, line)
        out[mod] = deps
    return out


def room(mod: str) -> int:
    parts = mod.split(".")
    return ROOMS.index(parts[1]) if len(parts) > 1 and parts[1] in ROOMS else len(ROOMS)


def circles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    found, done = [], set()

    def walk(node, path):
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in g[node]:
            walk(nxt, path + [node])
        done.add(node)

    for n in g:
        walk(n, [])
    return found


def test_the_reader_has_its_rooms():
    mods = files(READER)
    for r in ROOMS:
        assert any(room(m) == ROOMS.index(r) for m in mods), f"no file in the room {r}"
    assert {"trace_reader.cli", "trace_reader.scripts", "trace_reader.declared", "trace_reader"} <= set(mods)


def test_no_import_runs_up_a_floor():
    g = graph(READER)
    ups = [f"{m} (line {line}) imports {d}: room {ROOMS[room(d)] if room(d) < len(ROOMS) else 'top'} is above "
           f"{ROOMS[room(m)] if room(m) < len(ROOMS) else 'top'}" for m, deps in g.items() for d, line in deps.items()
           if room(d) > room(m) and not m == "trace_reader"]
    assert not ups, "\n".join(ups)


@pytest.mark.parametrize("package_dir", [READER, GEGLU], ids=["trace_reader", "fused_geglu"])
def test_no_import_circle(package_dir):
    g = graph(package_dir)
    # the package's own __init__ imports its files (the API): a file importing the package itself would be a circle
    assert not circles(g), "\n".join(" -> ".join(c) for c in circles(g))


def own_code() -> list[Path]:
    """The reader, fused_geglu/ and the suite's own top-level Python files (scripts, harness, benchmarks)."""
    return sorted([*READER.rglob("*.py"), *GEGLU.rglob("*.py"), *ROOT.glob("*.py")])


def test_no_private_name_leaves_its_file():
    ours = {module_name(p, READER) for p in READER.rglob("*.py")} | {module_name(p, GEGLU) for p in GEGLU.rglob("*.py")}
    ours |= {p.stem for p in ROOT.glob("*.py")}
    bad = []
    for path in own_code():
        base = READER if READER in path.parents else GEGLU if GEGLU in path.parents else ROOT
        aliases = {}
        for line, target, names in (imports(path, base) if base != ROOT else imports_top(path)):
            if target in ours or target.split(".")[0] in ("trace_reader", "fused_geglu"):
                bad += [f"{path.relative_to(ROOT)}:{line}: imports {n} from {target}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    aliases[a.asname or a.name] = node.module or "."
            elif isinstance(node, ast.Import):
                for a in node.names:
                    aliases[(a.asname or a.name).split(".")[0]] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if target in ours or target.split(".")[0] in ("trace_reader", "fused_geglu", ".", "") or \
                        node.value.id in ours:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def imports_top(path: Path) -> list[tuple[int, str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.lineno, node.module or "", [a.name for a in node.names]))
    return out


def test_no_file_is_over_600_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in own_code()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)


def test_the_reader_never_imports_torch_or_the_suite():
    suite = {p.stem for p in ROOT.glob("*.py")}
    bad = []
    for path in READER.rglob("*.py"):
        for line, target, _ in imports(path, READER):
            top = target.split(".")[0]
            if top in ("torch", "triton", "numpy", "transformers") or top in suite:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    allowed = {"reader/trace_reader/facts/peaks.py"}  # write_snapshot(): the one command that reads torch's table
    bad = [b for b in bad if b.split(":")[0] not in allowed]
    assert not bad, "\n".join(bad)


def test_the_checks_see_what_they_look_for(tmp_path):
    """Each rule fails on a package that breaks it (so a rule that reads nothing cannot pass by accident)."""
    pkg = tmp_path / "trace_reader"
    for d in ("reading", "render"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "reading" / "a.py").write_text("from ..render.b import draw\n")
    (pkg / "render" / "b.py").write_text("def draw():\n    from ..reading import a\n")
    g = graph(pkg)
    assert g["trace_reader.reading.a"] == {"trace_reader.render.b": 1}
    assert room("trace_reader.render.b") > room("trace_reader.reading.a")
    assert circles(g) == [["trace_reader.reading.a", "trace_reader.render.b", "trace_reader.reading.a"]]

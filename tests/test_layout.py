"""The layout's rules that import-linter cannot check (its contracts are in pyproject.toml, run by `make test`)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib

from tests.paths import ROOT

OWN = ("gateway", "engine")


SANS_IO = ("realtime", "live", "core")  # the protocol cores and what they share


def test_the_sans_io_cores_import_no_event_loop_thread_or_model() -> None:
    modules = sorted(f"gateway.{core}.{p.stem}" for core in SANS_IO for p in (ROOT / "gateway" / core).glob("*.py"))
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(','.join(m for m in ('asyncio', 'threading', 'onnxruntime', 'torch') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "", f"importing the sans-I/O cores loaded {loaded.stdout.strip()}"


def test_every_module_of_the_gateway_is_in_a_layer() -> None:
    """The layers contract (pyproject.toml) names every module and package of gateway/, so lint-imports checks
    each one's imports; a new one must take its place there."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    package = ROOT / "gateway"
    modules = {f"gateway.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"gateway.{p.parent.name}" for p in package.glob("*/__init__.py")}
    assert modules == named


def _deferred_own_imports(path: str) -> list[tuple[int, str]]:
    """The project's own imports below a module's top level (TYPE_CHECKING blocks aside)."""
    tree = ast.parse((ROOT / path).read_text())
    top = set()
    for node in tree.body:
        top.add(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            top.update(ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and node not in top:
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n.split(".")[0] in OWN for n in names):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_deferred_import_of_our_own_says_why() -> None:
    files = subprocess.run(["git", "ls-files", "gateway/*.py", "engine/*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    unexplained = []
    for path in files:
        lines = (ROOT / path).read_text().splitlines()
        for lineno, statement in _deferred_own_imports(path):
            above = lineno - 2  # a comment on the line, or above it and the imports that follow it
            while above >= 0 and lines[above].strip().startswith(("from ", "import ")) and "#" not in lines[above]:
                above -= 1
            if "#" not in lines[lineno - 1] and not lines[above].strip().startswith("#"):
                unexplained.append(f"{path}:{lineno}: {statement}")
    assert not unexplained, "imports inside functions need a comment saying why:\n" + "\n".join(unexplained)

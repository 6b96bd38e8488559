"""The layout's rules that import-linter cannot check (its contracts are in pyproject.toml, run by `make test`)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.paths import ROOT

OWN = ("gateway", "engine")


def test_the_sans_io_core_imports_no_event_loop_thread_or_model() -> None:
    modules = sorted(f"gateway.realtime.{p.stem}" for p in (ROOT / "gateway" / "realtime").glob("*.py"))
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(','.join(m for m in ('asyncio', 'threading', 'onnxruntime', 'torch') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "", f"importing gateway.realtime loaded {loaded.stdout.strip()}"


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


def test_the_old_import_paths_still_work_with_a_deprecation_warning() -> None:
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
from gateway.transports.websocket import realtime_route
from gateway.runtime.gateway import Gateway
import gateway.server
try:
    gateway.server.Gateway
except DeprecationWarning as w:
    print("server:", w)
try:
    import gateway.realtime_ws
except DeprecationWarning as w:
    print("realtime_ws:", w)
warnings.simplefilter("ignore", DeprecationWarning)
import gateway.realtime_ws
assert gateway.realtime_ws.realtime_route is realtime_route and gateway.server.Gateway is Gateway
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "server: gateway.server.Gateway moved to gateway.runtime.gateway.Gateway" in done.stdout
    assert "realtime_ws: gateway.realtime_ws moved to gateway.transports.websocket" in done.stdout

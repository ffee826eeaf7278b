"""The tree keeps its lanes apart: no import circle among robotd's and drivers' modules
(imports under `if TYPE_CHECKING:` count: a circle of types is still a circle), and the
worker never imports the link (the policy side knows nothing of the robot side)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("robotd", "drivers")


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    own = {m for m in out if m in known and m != name}
    if path.name == "__init__.py":  # a package's face importing its own children
        own = {m for m in own if not m.startswith(name + ".")}
    return own


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_no_module_imports_itself_round_a_circle() -> None:
    try:
        order = list(graphlib.TopologicalSorter(_graph()).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None
    assert "robotd.control.kernel" in order  # the graph really holds the tree


def test_the_worker_does_not_import_the_link() -> None:
    bad = {
        (name, dep)
        for name, deps in _graph().items()
        if name.startswith("robotd.worker")
        for dep in deps
        if dep.startswith("robotd.link")
    }
    assert not bad, bad

"""`robotd check`'s look at the local worker's policy (policy.serve, MODULE:CLASS): is the
module there, and does its source bind CLASS, found without running any of it.

Not imported, here or in a subprocess: importing a policy module runs its code, and a
policy's commonly imports torch or JAX, takes the GPU and loads weights at import:
seconds to minutes and gigabytes, beside the running daemon whose worker holds that GPU
(check is the gate before a restart), and a failure of that kind says nothing about the
config. Found, not run: the module's spec is looked up with the finders import itself
uses (sys.meta_path, the parent package's search path, never its __init__ executed), and
its source parsed (ast) for a top-level binding of CLASS. What this cannot judge is
passed: a module that is not Python source (an extension), or that may bind names it
does not spell out (`import *`, a module `__getattr__`, globals(), `global`,
sys.modules, a package extending its __path__). A module that raises when imported is found at run
(`robotd serve`, the local worker: `cannot import module ...`, `importing module ...
raised`)."""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import os
import sys
from importlib.machinery import ModuleSpec

from robotd.config import Loaded

# a source spelling any of these may bind names it does not spell out
DYNAMIC = ("globals()", "locals()", "vars(", "exec(", "sys.modules", "__getattr__",
           "__path__", "setattr(")


def policy_problem(loaded: Loaded) -> str | None:
    """The local worker's policy.serve naming a module that is not there, or a class its
    module's source does not bind, as `SOURCE: policy.serve: 'SPEC': why` (the sentence
    the worker says at run, which imports it); None when fine, remote, or not judged."""
    policy = loaded.config.policy
    if policy.link != "robotd" or policy.worker:
        return None  # a remote worker serves what it was started with
    spec = policy.serve
    why = serve_problem(spec)
    return None if why is None else f"{loaded.blame('policy.serve')}: {spec!r}: {why}"


def openpi_problem(loaded: Loaded) -> str | None:
    """An openpi link to a wss:// server whose policy.openpi.ca_file cannot be read as a
    CA bundle (the link's own words, as it says them when it connects); None when fine or
    not judged. (policy.openpi.api_key_env is not: the unit's environment is not check's.)"""
    policy = loaded.config.policy
    ca_file = policy.openpi.ca_file
    if policy.link != "openpi" or not ca_file or not policy.worker.lower().startswith("wss://"):
        return None
    from robotd.link.openpi.health import tls_context

    try:
        tls_context(ca_file)
    except ValueError as exc:
        why = str(exc).removeprefix("policy.openpi.ca_file ")
        return f"{loaded.blame('policy.openpi.ca_file')}: {why}"
    return None


def serve_problem(spec: str) -> str | None:
    """What is wrong with MODULE:CLASS as far as files show, else None."""
    module, _, attr = spec.partition(":")
    found = find_module(module)
    if isinstance(found, str):
        return f"cannot import module {module!r}: No module named {found!r}"
    if found is None:
        return None
    first = attr.split(".")[0]
    names = bound_names(found)
    if names is None or first in names or _is_submodule(found, first):
        return None
    near = difflib.get_close_matches(first, sorted(n for n in names if n[:1].isupper()), 1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{module!r} has no attribute {attr!r}{hint}"


def find_module(name: str) -> ModuleSpec | str | None:
    """The spec of module `name` (dotted), found as import finds it but executing nothing:
    the first part on sys.path (and the working directory, which `python -m robotd serve`,
    the local worker, has on its path), each next in its parent's search locations. The
    name of the first part that is not there, when one is not; None when a parent is no
    package whose locations can be searched without running it."""
    try:
        return _find_parts(name.split("."))
    except Exception:  # a finder of a plugin's that fails: not ours to judge
        return None


def _find_parts(parts: list[str]) -> ModuleSpec | str | None:
    path: list[str] | None = None
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        spec = _find(full, path)
        if spec is None and i == 0:
            spec = importlib.machinery.PathFinder.find_spec(full, [os.getcwd()])
        if spec is None:
            return full
        if i == len(parts) - 1:
            return spec
        namespace = spec.origin is None and spec.submodule_search_locations is not None
        if not namespace and bound_names(spec) is None:
            return None  # its code may extend its path or put modules in sys.modules
        if spec.submodule_search_locations is None:
            return full + "." + parts[i + 1]  # a plain module has no submodules
        path = list(spec.submodule_search_locations)
    return None


def _find(full: str, path: list[str] | None) -> ModuleSpec | None:
    module = sys.modules.get(full)
    if module is not None:
        return getattr(module, "__spec__", None)
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(full, path, None)
        if spec is not None:
            return spec
    return None


def bound_names(spec: ModuleSpec) -> set[str] | None:
    """The names a module's source binds at its top level (classes, functions,
    assignments, imports, in if/try/with blocks too); None when it is no Python source
    or may bind names it does not spell out (DYNAMIC, `import *`)."""
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, origin)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None  # the worker's import says what is wrong with it
    if any(d in source for d in DYNAMIC):
        return None
    if any(isinstance(n, ast.Global | ast.Match) for n in ast.walk(tree)):
        return None  # a function's `global` may bind one; a match block is not walked here
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        names |= _binds(node)
    return names


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run at import: the body, and what if/try/with/for/while hold."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                out += _top_level([n for n in inner if isinstance(n, ast.stmt)])
        for handler in getattr(node, "handlers", []):
            out += _top_level(handler.body)
    return out


def _binds(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [node.target]
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    names = set()
    for target in targets:
        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names | {
        n.target.id
        for n in ast.walk(node)
        if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)
    }


def _is_submodule(spec: ModuleSpec, name: str) -> bool:
    """A package's submodule may be an attribute once something imported it."""
    if spec.submodule_search_locations is None:
        return False
    found = importlib.machinery.PathFinder.find_spec(
        f"{spec.name}.{name}", list(spec.submodule_search_locations)
    )
    return found is not None

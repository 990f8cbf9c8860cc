"""The layering rules of DESIGN §3, checked by reading the sources (no package is imported):

(a) no two top-level packages import each other, directly or around a longer loop — the `llm-gateway`
    command (`cli/`) sits above the others;
(b) `router/` imports only the standard library, `xxhash` and `core.tokens`; `core/` only the standard
    library and `redis`;
(c) every module of the packages has at most 400 lines.

Every import statement counts, wherever it is: at module level, inside a function (a lazy import), or
under `if TYPE_CHECKING:`. The packages are the ones pyproject.toml packages.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400

ROUTER_MAY_IMPORT = ("xxhash", "core.tokens")
CORE_MAY_IMPORT = ("redis",)


def _packages() -> list[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(p.rstrip("*") for p in patterns)


PACKAGES = _packages()


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if not p.name.startswith("test_"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the module; relative imports stay in the package
    and are skipped."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


@cache
def _package_edges() -> dict[str, dict[str, list[str]]]:
    """package → imported package → where ("path:line module"), for imports between packages."""
    edges: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for package in PACKAGES:
        for path in _modules(package):
            for line, module in _imported(path):
                top = module.partition(".")[0]
                if top in PACKAGES and top != package:
                    edges[package].setdefault(top, []).append(f"{_rel(path)}:{line} {module}")
    return edges


def _cycle_through(start: str) -> list[str] | None:
    """A shortest import loop from `start` back to itself (breadth-first), or None."""
    edges = _package_edges()
    paths: list[list[str]] = [[start]]
    seen = {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(edges[path[-1]]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    return None


def _case(name: str) -> object:
    return pytest.param(name, id=name)


def test_the_packages_are_the_expected_ones() -> None:
    assert {"core", "router", "admission", "gateway", "mock_engine", "bench", "capacity", "cli"} <= set(
        PACKAGES
    )


@pytest.mark.parametrize("package", [_case(p) for p in PACKAGES])
def test_no_import_cycle_between_packages(package: str) -> None:
    cycle = _cycle_through(package)
    if cycle is not None:
        edges = _package_edges()
        where = [f"  {a} -> {b}: {', '.join(edges[a][b][:3])}" for a, b in pairwise(cycle)]
        pytest.fail(f"import cycle {' -> '.join(cycle)}:\n" + "\n".join(where))


def _outside(package: str, allowed: tuple[str, ...]) -> list[str]:
    """Imports of `package` that are neither stdlib, nor the package itself, nor in `allowed` (a module
    and its submodules)."""
    bad = []
    for path in _modules(package):
        for line, module in _imported(path):
            top = module.partition(".")[0]
            if top in sys.stdlib_module_names or top == package:
                continue
            if any(module == ok or module.startswith(ok + ".") for ok in allowed):
                continue
            bad.append(f"{_rel(path)}:{line} {module}")
    return bad


def test_router_imports_only_stdlib_xxhash_and_core_tokens() -> None:
    assert _outside("router", ROUTER_MAY_IMPORT) == []


def test_core_imports_only_stdlib_and_redis() -> None:
    assert _outside("core", CORE_MAY_IMPORT) == []


def test_the_import_scan_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import a\n\ndef f():\n    from b.c import d\n    if x:\n        import e.f as g\n")
    assert sorted(name for _, name in _imported(module)) == ["a", "b.c", "e.f"]


@pytest.mark.parametrize("module", [_case(_rel(p)) for package in PACKAGES for p in _modules(package)])
def test_module_is_at_most_400_lines(module: str) -> None:
    lines = len((REPO / module).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines (at most {MAX_MODULE_LINES}): split it"

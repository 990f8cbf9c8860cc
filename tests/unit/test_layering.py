"""The layering rules of docs/ARCHITECTURE.md ("Packages, and who may import whom"), checked by reading
the sources (no package is imported):

(a) between the top-level packages an import points down only (`PACKAGE_LEVELS`: a package imports
    only packages on a lower level), except the arrows `DECLARED_ARROWS` lists, each to the modules it
    names and with its reason; and no two packages import each other, directly or around a longer loop;
(b) `router/` imports only the standard library, `xxhash` and `core.tokens`; `core/` only the standard
    library and `redis`;
(c) inside `gateway/` the layers are folders (`GATEWAY_LAYERS`, lowest first): a module imports only
    modules of its own layer or a lower one. A layer may name a higher one's types in annotations only
    where `TYPE_ONLY_UPWARD` says so, and only under `if TYPE_CHECKING:` (never run). The gateway's root
    holds only the app, the composition root and the runner;
(d) every module of the packages has at most 300 lines.

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
MAX_MODULE_LINES = 300

ROUTER_MAY_IMPORT = ("xxhash", "core.tokens")
CORE_MAY_IMPORT = ("redis",)

PACKAGE_LEVELS = {
    "core": 0,
    "router": 1,
    "admission": 1,
    "gateway": 2,
    "capacity": 2,
    "mock_engine": 2,
    "bench": 2,
    "cli": 3,
}
"""ARCHITECTURE's picture, floor by floor: a package imports only packages on a lower floor."""

DECLARED_ARROWS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("admission", "router"): (
        ("router.types",),
        "an AdmissionRequest carries the request's RoutingRequest for try_dispatch to route with; "
        "admission never reads it (DESIGN §3: admission may import router types)",
    ),
    ("gateway", "capacity"): (
        ("capacity.autoscale", "capacity.autoscale_settings", "capacity.cost"),
        "the autoscaling signal runs the capacity estimator; the cost alert rules use its cost model",
    ),
    ("bench", "gateway"): (
        (
            "gateway.upstream.engine_metrics",
            "gateway.app",
            "gateway.uvicorn_runner",
            "gateway.config.settings",
            "gateway.ops.local_state",
        ),
        "the engine-metrics parser reads /metrics scrapes; bench.gc_pauses runs the gateway's app in "
        "process to measure its collector pauses; bench.state_call_cost starts the local state server",
    ),
    ("bench", "mock_engine"): (
        ("mock_engine",),
        "the mock engine's fault settings; its physics core for `bench plan-check` and the "
        "disaggregation simulator",
    ),
    ("bench", "capacity"): (("capacity",), "`bench plan-check` checks a capacity plan on the physics core"),
}
"""Arrows beside or up the floors: (from, to) -> (the modules it may import, the reason)."""

GATEWAY_LAYERS = (
    "gateway.base",  # errors and their mapping, API families, metrics, the collector tuning
    "gateway.config",  # every settings model
    "gateway.upstream",  # replicas: registry, slots, discovery, health checks, scraping
    "gateway.api",  # the ASGI edge: request parsing, I/O, the connection guard, OpenAPI
    "gateway.observability",  # the event port, the request's record, spans, the access log
    "gateway.fleet",  # instance membership, autoscaling signal, prefix sharing, alert rules, shared state
    "gateway.proxy.stores",  # idempotency, quarantine, poison evidence, response state
    "gateway.proxy",  # the serve path (gateway.proxy.disagg: the disaggregated legs)
    "gateway.ops",  # the admin API
    "gateway",  # the root: GATEWAY_ROOT
)
"""The gateway's layers, lowest first; a module is in the deepest layer whose package holds it."""

GATEWAY_ROOT = ("gateway", "gateway.app", "gateway.composition", "gateway.uvicorn_runner")

TYPE_ONLY_UPWARD: dict[tuple[str, str], str] = {
    ("gateway.observability", "gateway.proxy"): (
        "the event port and the request's record name the serve path's RequestContext, Reply and "
        "Charge in their signatures; the serve path tells them its events"
    ),
    ("gateway.fleet", "gateway.proxy"): (
        "the autoscaling signal, a subscriber of the event port, names RequestContext and Reply in "
        "its signatures"
    ),
}
"""Annotation-only imports up the layers: (from layer, to layer) -> the reason."""


def _packages() -> list[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(p.rstrip("*") for p in patterns)


PACKAGES = _packages()


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if not p.name.startswith("test_"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, absolute module name, type-only?) of every import in the module, type-only when under
    `if TYPE_CHECKING:`; relative imports stay in the package and are skipped."""
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in type_only
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, id(node) in type_only


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the module (`_imports`)."""
    for line, module, _ in _imports(path):
        yield line, module


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
    assert set(PACKAGES) == set(PACKAGE_LEVELS)


def _within(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in allowed)


@pytest.mark.parametrize("package", [_case(p) for p in PACKAGES])
def test_package_imports_point_down_or_are_declared(package: str) -> None:
    bad = []
    for target, where in _package_edges()[package].items():
        if PACKAGE_LEVELS[target] < PACKAGE_LEVELS[package]:
            continue
        allowed, _ = DECLARED_ARROWS.get((package, target), ((), ""))
        bad += [w for w in where if not _within(w.rpartition(" ")[2], allowed)]
    assert bad == [], f"{package} imports beside or above it, undeclared (DECLARED_ARROWS):\n" + "\n".join(
        bad
    )


def test_every_declared_arrow_is_used() -> None:
    edges = _package_edges()
    unused = []
    for (package, target), (allowed, _) in DECLARED_ARROWS.items():
        imported = [w.rpartition(" ")[2] for w in edges[package].get(target, [])]
        unused += [f"{package} -> {ok}" for ok in allowed if not any(_within(m, (ok,)) for m in imported)]
    assert unused == [], f"declared but not imported (drop them): {unused}"


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
            if _within(module, allowed):
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


def test_the_import_scan_tells_type_only_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "if TYPE_CHECKING:\n    if y:\n        from c import d\nimport e\n"
    )
    assert sorted((name, type_only) for _, name, type_only in _imports(module)) == [
        ("a", True),
        ("b", False),
        ("c", True),
        ("e", False),
        ("typing", False),
    ]


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    """The index in GATEWAY_LAYERS of the deepest layer holding `module`."""
    deepest = max((layer for layer in GATEWAY_LAYERS if _within(module, (layer,))), key=len)
    return GATEWAY_LAYERS.index(deepest)


GATEWAY_MODULES = {_module_name(p): p for p in _modules("gateway")}


def test_the_gateway_root_holds_only_the_app_the_composition_root_and_the_runner() -> None:
    assert sorted(m for m in GATEWAY_MODULES if _layer(m) == len(GATEWAY_LAYERS) - 1) == sorted(GATEWAY_ROOT)


def test_every_gateway_folder_is_a_layer_or_inside_one() -> None:
    folders = {_module_name(p.parent / "__init__.py") for p in (REPO / "gateway").rglob("*.py")}
    assert all(_within(folder, GATEWAY_LAYERS) for folder in folders)
    assert set(GATEWAY_LAYERS) <= folders, "a layer without its folder"


@pytest.mark.parametrize("module", [_case(m) for m in GATEWAY_MODULES])
def test_gateway_module_imports_no_higher_layer(module: str) -> None:
    path = GATEWAY_MODULES[module]
    own = _layer(module)
    bad = []
    for line, imported, type_only in _imports(path):
        if not _within(imported, ("gateway",)) or _layer(imported) <= own:
            continue
        pair = (GATEWAY_LAYERS[own], GATEWAY_LAYERS[_layer(imported)])
        if type_only and pair in TYPE_ONLY_UPWARD:
            continue
        bad.append(f"{_rel(path)}:{line} {imported} (layer {pair[1]})")
    assert bad == [], f"{module} (layer {GATEWAY_LAYERS[own]}) imports a higher layer:\n" + "\n".join(bad)


def test_every_type_only_upward_pair_is_used() -> None:
    used = set()
    for module, path in GATEWAY_MODULES.items():
        for _, imported, type_only in _imports(path):
            if type_only and _within(imported, ("gateway",)) and _layer(imported) > _layer(module):
                used.add((GATEWAY_LAYERS[_layer(module)], GATEWAY_LAYERS[_layer(imported)]))
    assert set(TYPE_ONLY_UPWARD) <= used, f"declared but not used (drop them): {set(TYPE_ONLY_UPWARD) - used}"


@pytest.mark.parametrize("module", [_case(_rel(p)) for package in PACKAGES for p in _modules(package)])
def test_module_is_at_most_300_lines(module: str) -> None:
    lines = len((REPO / module).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines (at most {MAX_MODULE_LINES}): split it"

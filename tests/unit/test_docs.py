"""The reader's documentation stays true: the README and docs/BENCHMARKS.md stay short, the README's first
config is valid, its policy table names every policy, every relative link in README.md and docs/ points
at a file that exists, and every pointer into the benchmark pages — a markdown link's `#anchor`, or a
source file's `docs/BENCHMARKS.md#anchor` or `docs/BENCHMARKS.md, "Heading"` — names a heading there.
(The pages' own blocks — the full configuration, the routing profile, the disaggregated pool, the
access-log fields — are checked by the tests of what they document.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from gateway.config.settings import parse_settings
from router.presets import CUSTOM_POLICY, PRESETS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_README_LINES = 300
BENCHMARKS = REPO / "docs" / "BENCHMARKS.md"
BENCH_LOG = REPO / "docs" / "bench-log"
MAX_BENCHMARKS_LINES = 400
PAGES = sorted([README, *(REPO / "docs").glob("*.md"), *BENCH_LOG.glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)
# In source files: docs/BENCHMARKS.md or docs/bench-log/<file>.md, then `#anchor`, or `, "Heading"` /
# ` ("Heading"` where Heading begins a heading of that page (it may wrap over lines).
SOURCE_POINTER = re.compile(
    r'(docs/(?:BENCHMARKS|bench-log/[\w.-]+)\.md)(?:#([\w-]+)|(?:,\s*|\s*\(\s*)"([^"]+)")?'
)
SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".toml"}


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move details into docs/"


def test_the_benchmarks_page_is_short() -> None:
    lines = len(BENCHMARKS.read_text().splitlines())
    assert lines <= MAX_BENCHMARKS_LINES, (
        f"docs/BENCHMARKS.md has {lines} lines: it holds current results only, rounds go to docs/bench-log/"
    )


def test_the_readme_first_config_is_valid() -> None:
    section = _section(README.read_text(), "A first config in front of vLLM")
    settings = parse_settings(yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0]))
    pool = settings.pools[0]
    assert (pool.engine, pool.policy) == ("vllm", "prefix-index")


def test_the_readme_policy_table_names_every_policy() -> None:
    table = _section(README.read_text(), "Which policy to pick")
    named = set(re.findall(r"`([a-z-]+)`", table))
    assert set(PRESETS) <= named, f"missing from the table: {sorted(set(PRESETS) - named)}"
    assert f"policy: {CUSTOM_POLICY}" in table


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    text = CODE_BLOCK.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to missing files {broken}"


def _headings(page: Path) -> list[str]:
    """The page's headings as rendered (code spans and emphasis markers dropped), outside code blocks."""
    text = CODE_BLOCK.sub("", page.read_text())
    return [re.sub(r"[`*_]", "", h).strip() for h in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE)]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lowercase, punctuation dropped, spaces to hyphens, repeats suffixed -1, -2, …"""
    anchors: set[str] = set()
    for heading in _headings(page):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def _is_benchmark_page(path: Path) -> bool:
    return path == BENCHMARKS or BENCH_LOG in path.parents


def test_anchor_slugs_follow_github() -> None:
    page = REPO / "docs" / "bench-log" / "2026-12-05-rounds.md"
    anchors = _anchors(page)
    assert "where-the-gateways-cpu-goes-issue-7" in anchors
    assert "prefilldecode-disaggregation-issue-18" in anchors
    assert {"targets", "targets-1"} <= anchors  # a repeated heading


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_into_the_benchmark_pages_name_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        dest = (page.parent / path).resolve() if path else page.resolve()
        if _is_benchmark_page(dest) and (not dest.exists() or anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: links to headings that do not exist {broken}"


def _source_files() -> list[Path]:
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"results", "__pycache__"}]
        files += [Path(root) / n for n in names if Path(n).suffix in SOURCE_SUFFIXES]
    return files


def test_source_pointers_into_the_benchmark_pages_name_a_heading() -> None:
    broken = []
    for source in _source_files():
        if source == Path(__file__).resolve():
            continue
        text = source.read_text(errors="replace")
        if "docs/BENCHMARKS" not in text and "docs/bench-log/" not in text:
            continue
        for path, anchor, quoted in SOURCE_POINTER.findall(text):
            page = REPO / path
            where = f"{source.relative_to(REPO)}: {path}"
            if not page.exists():
                broken.append(f"{where} (no such page)")
            elif anchor and anchor not in _anchors(page):
                broken.append(f"{where}#{anchor}")
            elif quoted:
                title = " ".join(quoted.split()).lower()
                if not any(h.lower().startswith(title) for h in _headings(page)):
                    broken.append(f'{where}, "{title}"')
    assert not broken, f"pointers to headings that do not exist: {broken}"

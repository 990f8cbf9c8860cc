"""The reader's documentation stays true: the README stays short, its first config is valid, its policy
table names every policy, and every relative link in README.md and docs/ points at a file that exists.
(The pages' own blocks — the full configuration, the routing profile, the disaggregated pool, the
access-log fields — are checked by the tests of what they document.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway.config.settings import parse_settings
from router.presets import CUSTOM_POLICY, PRESETS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_README_LINES = 300
PAGES = sorted([README, *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move details into docs/"


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
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to missing files {broken}"

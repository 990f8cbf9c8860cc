"""Profile numbers (DESIGN §7) and the YAML loader's error paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mock_engine.physics import (
    DEFAULT_PROFILE_NAME,
    ProfileError,
    available_profiles,
    load_profile,
    parse_profile,
)

PROFILES_DIR = Path(__file__).resolve().parents[3] / "mock_engine" / "profiles"


def _document(name: str = "tiny") -> dict[str, Any]:
    loaded = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_builtin_profiles_are_listed_and_loadable() -> None:
    assert {"h100-13b-fp16", "tiny"} <= set(available_profiles())
    assert load_profile().name == DEFAULT_PROFILE_NAME == "h100-13b-fp16"
    assert load_profile("tiny").scheduler.max_num_seqs == 8


def test_default_profile_reproduces_the_design_memory_example() -> None:
    profile = load_profile("h100-13b-fp16")
    assert profile.kv_bytes_per_token == 163_840
    assert profile.kv_budget_bytes == 44_000_000_000  # decimal GB
    assert profile.kv_capacity_tokens == pytest.approx(268_000, rel=0.01)
    assert profile.kv_capacity_blocks == profile.kv_capacity_tokens // 16


def test_default_profile_closed_form_matches_the_design_table() -> None:
    profile = load_profile("h100-13b-fp16")
    for target in profile.calibration_targets:
        speed = profile.decode_tok_s(target.batch_size, 800)
        assert speed == pytest.approx(target.per_stream_tok_s, rel=0.05)


def test_load_by_path_and_numeric_strings(tmp_path: Path) -> None:
    document = _document()
    document["gpu"]["memory_bandwidth_bytes_per_s"] = "10e9"  # PyYAML leaves 10e9 a string
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    assert load_profile(path).gpu.memory_bandwidth_bytes_per_s == 10e9
    assert load_profile(str(path)).name == "tiny"


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(ProfileError, match=r"unknown name .*tiny"):
        load_profile("a100-70b")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(tmp_path / "nope.yaml")


def _mutated(mutate: Any) -> dict[str, Any]:
    document = _document()
    mutate(document)
    return document


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["model"].pop("n_layers"), r"model\.n_layers: missing"),
        (lambda d: d.pop("gpu"), r"gpu: missing"),
        (lambda d: d["gpu"].update(hbm_bytes="lots"), r"gpu\.hbm_bytes: expected a number, got 'lots'"),
        (lambda d: d["model"].update(d_head=True), r"model\.d_head: expected a number"),
        (lambda d: d["model"].update(d_head=64.5), r"model\.d_head: expected a whole number"),
        (lambda d: d["prefill"].update(tokens_per_s=0), r"prefill\.tokens_per_s: must be > 0"),
        (lambda d: d["decode"].update(step_overhead_s=-1), r"decode\.step_overhead_s: must be a finite"),
        (
            lambda d: d["decode"].update(kv_read_efficiency_ratio=1.5),
            r"kv_read_efficiency_ratio: must be <= 1",
        ),
        (lambda d: d["scheduler"].update(max_num_seq=4), r"scheduler\.max_num_seq: unknown key"),
        (lambda d: d.update(extra=1), r"extra: unknown key"),
        (lambda d: d.update(model=[1]), r"model: expected a mapping"),
        (lambda d: d["calibration"].update(targets={}), r"calibration\.targets: expected a list"),
        (
            lambda d: d["calibration"]["targets"][1].pop("batch_size"),
            r"calibration\.targets\[1\]\.batch_size",
        ),
        (lambda d: d["gpu"].update(hbm_bytes=11_000_000), r"gpu\.hbm_bytes: leaves no KV memory"),
        (
            lambda d: d["prefill"].update(chunk_tokens_per_step=0),
            r"prefill\.chunk_tokens_per_step: must be > 0",
        ),
    ],
)
def test_invalid_documents_name_the_key(mutate: Any, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as caught:
        parse_profile(_mutated(mutate), source="test.yaml")
    assert "test.yaml" in str(caught.value)


def test_document_must_be_a_mapping() -> None:
    with pytest.raises(ProfileError, match="expected a mapping"):
        parse_profile(["not", "a", "mapping"], source="list.yaml")


def test_optional_sections_default() -> None:
    document = _document()
    del document["calibration"], document["description"]
    document["decode"].pop("step_overhead_s")
    document["prefill"].pop("chunk_tokens_per_step")
    profile = parse_profile(document)
    assert profile.calibration_targets == ()
    assert profile.decode.step_overhead_s == 0.0
    assert profile.prefill.chunk_tokens_per_step is None

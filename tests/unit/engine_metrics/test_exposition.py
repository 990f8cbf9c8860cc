from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.upstream.engine_metrics.exposition import ExpositionError, parse_exposition
from tests.unit.engine_metrics import fixtures


def test_reads_names_labels_and_values_and_skips_comments() -> None:
    text = """# HELP x:a A gauge.
# TYPE x:a gauge
x:a{model_name="m",engine="0"} 7.0

x:b 3
"""
    samples = parse_exposition(text)
    assert set(samples) == {"x:a", "x:b"}
    assert samples["x:a"][0].labels == {"model_name": "m", "engine": "0"}
    assert samples["x:a"][0].value == 7.0
    assert samples["x:b"][0].labels == {}
    assert samples["x:b"][0].value == 3.0


def test_label_values_may_hold_escapes_braces_commas_and_spaces() -> None:
    text = r'm{a="x\"y",b="c:\\d",c="{,} }",d="line\nbreak",} 1' + "\n"
    (sample,) = parse_exposition(text)["m"]
    assert sample.labels == {"a": 'x"y', "b": "c:\\d", "c": "{,} }", "d": "line\nbreak"}


def test_timestamps_exemplars_and_special_values() -> None:
    text = """a 1.5e+06 1712345678000
b{le="+Inf"} +Inf
c -Inf
d NaN
e{x="1"} 4 # {trace_id="abc"} 1.0 1712345678.1
"""
    samples = parse_exposition(text)
    assert samples["a"][0].value == 1.5e6
    assert samples["b"][0].value == math.inf
    assert samples["c"][0].value == -math.inf
    assert math.isnan(samples["d"][0].value)
    assert samples["e"][0].value == 4.0


def test_repeated_label_sets_are_all_kept_in_order() -> None:
    samples = parse_exposition(fixtures.VLLM_DP2)
    assert [s.labels["engine"] for s in samples["vllm:num_requests_running"]] == ["0", "1"]


def test_wanted_filter_returns_only_those_names() -> None:
    samples = parse_exposition(fixtures.VLLM_V1, {"vllm:num_requests_running", "absent"})
    assert set(samples) == {"vllm:num_requests_running"}


@pytest.mark.parametrize(
    "line",
    [
        'm{a="1" 2',  # unterminated label block
        'm{a="1} 2',  # unterminated quote
        "m{a=1} 2",  # unquoted label value
        'm{a="1" b="2"} 3',  # missing comma
        'm{1a="x"} 3',  # bad label name
        "m",  # no value
        "m abc",  # non-numeric value
        "m 1 2 3",  # trailing garbage
        "m 1 12.5",  # fractional timestamp
        "m{} 1 x",
    ],
)
def test_malformed_wanted_lines_raise_with_the_line_number(line: str) -> None:
    with pytest.raises(ExpositionError) as excinfo:
        parse_exposition(f"ok 1\n{line}\n", {"m", "ok"})
    assert excinfo.value.line_number == 2


def test_malformed_lines_of_unwanted_names_are_skipped() -> None:
    text = "other{weird syntax here\nm 1\n"
    assert parse_exposition(text, {"m"})["m"][0].value == 1.0
    with pytest.raises(ExpositionError):
        parse_exposition(text)


def test_truncated_body_is_rejected_when_the_cut_line_is_wanted() -> None:
    cut = fixtures.VLLM_V1[: fixtures.VLLM_V1.index("vllm:num_requests_waiting{") + 40]
    with pytest.raises(ExpositionError):
        parse_exposition(cut, {"vllm:num_requests_waiting"})


def test_empty_and_comment_only_bodies_have_no_samples() -> None:
    assert parse_exposition("") == {}
    assert parse_exposition("# HELP x y\n# TYPE x gauge\n\n") == {}


@pytest.mark.parametrize(
    "text",
    [
        fixtures.VLLM_V1,
        fixtures.VLLM_DP2,
        fixtures.VLLM_V0,
        fixtures.SGLANG,
        fixtures.TGI,
        fixtures.LLAMACPP,
        fixtures.LLAMACPP_OLD,
    ],
)
def test_agrees_with_prometheus_client_on_every_fixture(text: str) -> None:
    mine = parse_exposition(text)
    theirs = [
        (s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
    ]
    assert sum(len(v) for v in mine.values()) == len(theirs)
    for name, labels, value in theirs:
        # prometheus_client renames a counter exposed without `_total` (TGI's) to `..._total`
        exposed = name if name in mine else name.removesuffix("_total")
        assert any(s.labels == labels and s.value == value for s in mine[exposed]), (name, labels)

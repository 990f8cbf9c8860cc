"""The calibration run reproduces the design's decode table on the default profile."""

from __future__ import annotations

import pytest

from mock_engine.physics import calibrate, load_profile, render_calibration_markdown
from mock_engine.physics.calibration import measure_decode


def test_default_profile_table_within_five_percent() -> None:
    profile = load_profile("h100-13b-fp16")
    rows = calibrate(profile)
    assert [row.batch_size for row in rows] == [16, 64, 128]
    assert [row.target_per_stream_tok_s for row in rows] == [105, 68, 44]
    for row in rows:
        assert row.context_tokens == 800
        assert row.error_ratio is not None and abs(row.error_ratio) <= 0.05, row
        assert row.measured_aggregate_tok_s == pytest.approx(row.batch_size * row.measured_per_stream_tok_s)
    aggregate_at_64 = rows[1].measured_aggregate_tok_s
    assert aggregate_at_64 == pytest.approx(4_350, rel=0.05)


def test_measured_speed_matches_the_closed_form_step_model() -> None:
    for name in ("h100-13b-fp16", "tiny"):
        profile = load_profile(name)
        for row in calibrate(profile):
            expected = profile.decode_tok_s(row.batch_size, row.context_tokens)
            assert row.measured_per_stream_tok_s == pytest.approx(expected, rel=0.01)


def test_rows_without_targets_and_markdown_rendering() -> None:
    rows = calibrate(load_profile("tiny"), batch_sizes=(2, 8))
    assert rows[0].target_per_stream_tok_s is None and rows[0].error_ratio is None
    assert rows[1].target_aggregate_tok_s == pytest.approx(8 * 705)
    text = render_calibration_markdown("tiny", rows)
    lines = text.splitlines()
    assert lines[0].startswith("Calibration of profile `tiny`")
    assert lines[2].startswith("| batch | context tokens | per-stream tok/s")
    assert lines[4].startswith("| 2 | 256 |") and lines[4].endswith("| — | — |")
    assert lines[5].startswith("| 8 | 256 |") and "| 705 |" in lines[5]


def test_measure_rejects_a_run_too_short_to_measure() -> None:
    with pytest.raises(ValueError, match="decode_tokens"):
        measure_decode(load_profile("tiny"), batch_size=2, context_tokens=256, decode_tokens=2)

"""The `llm-gateway` command (`cli.main`): its subcommands, check-config's answers and exit codes,
hash-key, and `python -m cli` as the entry point without the installed script."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

REPO = Path(__file__).resolve().parents[3]
SUBCOMMANDS = ("serve", "check-config", "hash-key", "demo", "plan", "bench", "mock-engine")


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: llm-gateway")
    assert all(name in out for name in SUBCOMMANDS)


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "required" in capsys.readouterr().err


def test_check_config_accepts_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(REPO / "examples" / "minimal.yaml")]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 pool(s): ")


def test_check_config_refuses_a_bad_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["check-config", "--config", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"llm-gateway: cannot read config file {missing}")
    broken = tmp_path / "broken.yaml"
    broken.write_text("pools: 3\n")
    assert main(["check-config", "--config", str(broken)]) == 2
    assert "llm-gateway: " in capsys.readouterr().err


def test_hash_key_prints_sha256_of_each_stdin_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("sk-one\n\nsk-two\n"))
    assert main(["hash-key"]) == 0
    digests = [hashlib.sha256(key.encode()).hexdigest() for key in ("sk-one", "sk-two")]
    assert capsys.readouterr().out.split() == digests


def test_python_dash_m_cli_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "check-config", "--config", str(REPO / "examples" / "minimal.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")

"""`bench.process_roles`: which part of a gateway's process tree a process is."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.cpu_per_request import Target
from bench.process_roles import ROLES, RoleLedger, role_of


def test_the_root_is_the_supervisor_only_when_it_has_children() -> None:
    me = os.getpid()
    assert role_of(me, me, has_children=True) == "supervisor"
    assert role_of(me, me, has_children=False) == "workers"


def test_a_child_is_a_worker_unless_it_runs_valkey_server() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert role_of(child.pid, os.getpid(), has_children=True) == "workers"
    finally:
        child.kill()
        child.wait()


def test_readings_pair_into_blocks_per_role() -> None:
    ledger = RoleLedger({})
    target = Target("me", "http://127.0.0.1:1", os.getpid())
    before = ledger.read(target)
    sum(i * i for i in range(200_000))
    after = ledger.read(target)
    assert after.sched_ns > before.sched_ns
    assert set(ledger.ns["me"]) == set(ROLES)
    assert sum(ledger.ns["me"].values()) > 0
    assert "| me |" in ledger.render({"me": 1})

"""The bench's CPU budget (tests/bench/_budget.py) attributes CPU to the process that
spent it: a wrong attribution would send an issue-23 investigation to the wrong stage."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench._budget import Budget, describe, machine_idle_s

SPIN = "import time\nwhile time.process_time() < 0.3: pass\n"


@pytest.mark.skipif(machine_idle_s() is None, reason="needs Linux's /proc/stat")
def test_a_child_that_spends_cpu_is_charged_with_it_and_an_idle_one_is_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", SPIN])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        budget = Budget({"spinner": [busy.pid], "sleeper": [idle.pid], "empty": []})
        budget.start()
        os.waitid(os.P_PID, busy.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped yet
        machine = budget.stop()
        busy.wait()
    finally:
        idle.kill()
        idle.wait()
    # the child's own CPU after the start: most of its 0.3 s (its start-up came before)
    assert 0.15 <= machine["cpu_s"]["spinner"] <= 1.0, machine
    assert machine["cpu_s"]["sleeper"] < 0.05, machine
    assert "empty" not in machine["cpu_s"]
    assert machine["busy_cores"] > 0
    line = describe(machine, 1000)
    assert line.startswith(f"machine: {machine['busy_cores']} of {machine['cores']} cores busy")
    assert line.split("CPU s per 1,000 txn: ")[1].startswith("spinner ")  # largest first

"""The subscriber loads pyarrow's first-use modules at start-up, not in its first batch.

pyarrow's first array built from Python or numpy values imports pandas, and its
first ``take`` the compute kernels: ~0.2 s that landed in the first batch's plan.
Run in a child interpreter: the test runner has long imported all of it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import pyarrow as pa
    import common.serve
    import subscriber.daemon as daemon

    assert "pandas" not in sys.modules, "pandas imported before the start"
    seen = {}

    def freeze_imports():
        seen["at_freeze"] = set(sys.modules)

    async def main(config):
        return None

    daemon.freeze_imports = freeze_imports
    daemon._main = main
    daemon.run(None)
    assert "pandas" in seen["at_freeze"], "pyarrow's pandas not loaded before the freeze"
    # What a batch's plan does first: arrays from numpy and Python values, a take.
    before = set(sys.modules)
    idx = pa.array(np.arange(0, 4, 2, dtype=np.int64))
    pa.array([b"a", b"b", b"c", b"d"]).take(idx).to_pylist()
    pa.array([True, False]).filter(pa.array([True, True]))
    new = sorted(set(sys.modules) - before)
    assert not new, f"the first batch would import {new}"
    print("ok")
    """
)


def test_the_first_batch_imports_nothing_pyarrow_loads_on_first_use() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok"

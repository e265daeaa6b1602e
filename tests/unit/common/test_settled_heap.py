"""freeze_settled_heap: once per process, and garbage is collected, not pinned.

Run in a child interpreter: a freeze is process-wide and would pin the test
runner's own objects.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import gc, weakref
    from common.serve import freeze_settled_heap

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    kept = Node()
    garbage = cycle()
    freeze_settled_heap()
    frozen = gc.get_freeze_count()
    assert garbage() is None, "a garbage cycle alive at the freeze was pinned"
    assert frozen > 0, "nothing frozen"
    later = cycle()
    freeze_settled_heap()
    assert gc.get_freeze_count() == frozen, "a second call froze again"
    assert later() is not None, "a second call collected"
    gc.collect()
    assert later() is None, "garbage made after the freeze is not collected"
    print("ok")
    """
)


def test_settled_heap_freezes_once_and_pins_no_garbage() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

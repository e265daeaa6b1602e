"""CaptureHealth's state machine (publisher/capture/health.py): failures in a row turn
capture NOT_SERVING, the first good attempt turns it back."""

from __future__ import annotations

from publisher.capture.health import FAILING_AFTER, CaptureHealth


def _serving(h: CaptureHealth) -> bool:
    return h.serving


def test_failing_after_failures_in_a_row_and_back_on_the_first_good_attempt() -> None:
    """One or two failures are a busy source, not a broken one; three are; one good
    attempt ends it, and the total keeps counting."""
    h = CaptureHealth()
    for _ in range(FAILING_AFTER - 1):
        h.failed(OSError("database is locked"))
        assert h.serving
    h.ok()
    for _ in range(FAILING_AFTER):
        h.failed(OSError("no such table: _txrepl_capture\nmore detail"))
    assert not h.serving
    assert h.last_error == "no such table: _txrepl_capture"
    assert (h.failures, h.in_a_row) == (2 * FAILING_AFTER - 1, FAILING_AFTER)
    h.ok()
    assert _serving(h)  # (a function: mypy would keep the narrowing above)
    assert (h.failures, h.in_a_row, h.last_error) == (2 * FAILING_AFTER - 1, 0, "")


def test_an_error_without_text_is_named_by_its_type() -> None:
    """An exception with an empty or blank message still leaves something to show."""
    h = CaptureHealth()
    h.failed(TimeoutError("   "))
    assert h.last_error == "TimeoutError('   ')"
    h.failed(RuntimeError())
    assert h.last_error == "RuntimeError()"

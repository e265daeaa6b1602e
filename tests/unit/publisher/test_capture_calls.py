"""Procedure call marks (issue 25): their format, and which publication records a call
and hides its row changes (publisher/capture/calls.py)."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from common import values
from common.calls import CallError, call_text, captured_call, parse_call
from publisher.capture.calls import CallScope, read_call
from publisher.config import PublicationConfig


def test_the_call_text_keeps_argument_types() -> None:
    """An exact decimal and text arrive as what they were, by name."""
    call = parse_call(call_text("billing.close", Decimal("12.30"), "eu", None))
    assert call.name == "billing.close"
    assert [values.decode(a) for a in call.args] == [Decimal("12.30"), "eu", None]


def test_unreadable_mark_is_recorded_nowhere_and_hides_nothing() -> None:
    """A begin mark that is not a call: no publication records it, its rows travel."""
    assert read_call(b"not json") is None
    scope = CallScope(["bump"])
    assert scope.begin(None, ready=True) is False
    assert not scope.hiding
    scope.end()


def test_scope_records_listed_ready_outermost_calls_only() -> None:
    """Listed and ready: recorded and hiding until its end; a nested call is not
    recorded again; an unlisted or unready call hides nothing."""
    bump, other = parse_call(call_text("bump", 1)), parse_call(call_text("other"))
    scope = CallScope(["bump"])
    seen: list[tuple[str, bool, bool]] = []  # (mark, recorded, hiding after it)

    def begin(call: object, ready: bool = True) -> None:
        seen.append(("begin", scope.begin(call, ready), scope.hiding))  # type: ignore[arg-type]

    def end() -> None:
        scope.end()
        seen.append(("end", False, scope.hiding))

    begin(bump)
    begin(bump)  # nested inside the recorded one
    end()
    end()
    begin(other)
    end()
    begin(bump, ready=False)
    end()
    assert seen == [
        ("begin", True, True),
        ("begin", False, True),
        ("end", False, True),
        ("end", False, False),
        ("begin", False, False),
        ("end", False, False),
        ("begin", False, False),
        ("end", False, False),
    ]


def test_sqlite_call_without_capture_is_refused_in_one_line(tmp_path: Path) -> None:
    """A database with no capture installed: CallError naming the fix, nothing written."""
    conn = sqlite3.connect(str(tmp_path / "plain.db"), isolation_level=None)
    conn.execute("CREATE TABLE t(x)")
    with pytest.raises(CallError, match="start the publisher"), captured_call(conn, "p"):
        conn.execute("INSERT INTO t VALUES (1)")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_procedure_names_are_checked_at_start() -> None:
    """A padded or three-part name is refused, naming the key."""
    with pytest.raises(ValueError, match="procedures"):
        PublicationConfig(name="shop", tables=["t"], procedures=[" bump"])
    assert PublicationConfig(name="shop", tables=["t"], procedures=["s.bump"]).procedures

"""psycopg placeholders rewritten for the queued pipeline (targets/postgres/_queued.py):
the rewrite is made once per statement text, the values are picked on every call."""

from __future__ import annotations

import pytest

from subscriber.targets.postgres._queued import _converted


def test_each_call_gets_its_own_values_in_placeholder_order() -> None:
    q = b"INSERT INTO t (a, b) VALUES (%s, %s) -- 100%%"
    for a, b in [(1, "x"), (2, None), ("3", "y")]:
        assert _converted(q, (a, b)) == (b"INSERT INTO t (a, b) VALUES ($1, $2) -- 100%", [a, b])
    named = b"UPDATE s SET level = %(new)s WHERE name = %(n)s AND level = %(old)s OR %(new)s < 0"
    for new, old in [(5, 4), (9, 8)]:
        text, values = _converted(named, {"old": old, "n": "sub", "new": new, "unused": 1})
        assert text == b"UPDATE s SET level = $1 WHERE name = $2 AND level = $3 OR $1 < 0"
        assert values == [new, "sub", old]


def test_wrong_parameters_are_refused_by_what_is_wrong() -> None:
    with pytest.raises(TypeError, match="2 placeholders but 1 parameters"):
        _converted(b"SELECT %s, %s", ("only",))
    with pytest.raises(TypeError, match="needs a mapping"):
        _converted(b"SELECT %(a)s", (1,))
    with pytest.raises(TypeError, match="needs a sequence"):
        _converted(b"SELECT %s", {"a": 1})
    with pytest.raises(KeyError):
        _converted(b"SELECT %(a)s", {"b": 1})
    # a refusal leaves nothing behind: the same text with the right parameters works
    assert _converted(b"SELECT %s, %s", (1, 2)) == (b"SELECT $1, $2", [1, 2])

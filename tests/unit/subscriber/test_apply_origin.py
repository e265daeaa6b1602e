"""The apply's origin runs (subscriber/apply/_origin.py, issue 24 R3)."""

from __future__ import annotations

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._origin import by_origin
from subscriber.apply.entry import RawEntry


def _entry(origin: str, *, ops: int = 1, **group: object) -> RawEntry:
    e = pb.Entry(commit_time_us=1_700_000_000_000_000, origin=origin, **group)  # type: ignore[arg-type]
    for _ in range(ops):
        e.ops.add().row.CopyFrom(pb.RowChange(table="t", op=pb.ROW_OP_INSERT))
    return RawEntry(e.SerializeToString())


def test_own_entries_become_empty_and_join_a_run() -> None:
    """Entries of the target's own node keep their commit time and group fields but
    lose their ops, and join the run before them (the first run if they lead)."""
    entries = [_entry("a", continued=True), _entry("a", fragment=1), _entry("b"), _entry("a")]
    out, runs = by_origin(entries, "a")
    assert [len(getattr(e, "ops", [])) for e in out] == [0, 0, 1, 0]
    assert isinstance(out[0], pb.Entry)
    assert out[0].continued
    assert out[0].commit_time_us == 1_700_000_000_000_000
    assert runs == [(0, 4, "b")]


def test_runs_of_one_origin() -> None:
    """A batch of several origins is cut where the origin changes; entries without
    origin (an older publisher's, an empty one) stay in the run they follow."""
    entries = [_entry("b"), _entry("b"), _entry(""), _entry("c"), _entry("b"), RawEntry(b"")]
    out, runs = by_origin(entries, "a")
    assert out == entries
    assert runs == [(0, 3, "b"), (3, 4, "c"), (4, 6, "b")]

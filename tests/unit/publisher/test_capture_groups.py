"""A group's fragments given as Entries or as their ops' bytes log the same bytes
(publisher/capture/groups.py, Publication.append_encoded with ``grouped``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import encode
from publisher.capture.groups import EncodedEntry, GroupWriter
from publisher.capture.protowire import framed
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication

SCHEMA = pb.TableSchema(
    table="t",
    columns=[
        pb.Column(name="id", type=pb.COLUMN_TYPE_INTEGER),
        pb.Column(name="v", type=pb.COLUMN_TYPE_TEXT, nullable=True),
    ],
    primary_key=["id"],
)


def _op(rng: random.Random, n: int) -> bytes:
    row = pb.RowChange(
        table="t", op=pb.ROW_OP_INSERT, row=[encode(n), encode("x" * rng.randint(0, 300))]
    )
    return pb.Op(row=row).SerializeToString()


@pytest.mark.parametrize("shaped", [False, True])
def test_a_group_of_encoded_fragments_logs_the_bytes_of_its_entries(
    tmp_path: Path, shaped: bool
) -> None:
    """Groups of one to five fragments, of the source's own node or another origin, are
    logged byte for byte as the same groups of Entries, with continued/fragment set as
    common/fragments.py P1-P2 say, the same positions and the same consecutive seqs."""
    rng = random.Random(f"groups-{shaped}")
    config = PublicationConfig(name="p", tables=["t"], filter={"t": "1 = 1"} if shaped else {})
    a = Publication(config, open_log(tmp_path / "a"), node="n1")
    b = Publication(config, open_log(tmp_path / "b"), node="n1")
    for pub in (a, b):
        pub.append(pb.Entry(commit_time_us=1, ops=[pb.Op(schema=SCHEMA)]), 1)
    position, n = 1, 0
    for _ in range(12):
        origin = rng.choice(["", "other"])
        ga, gb = GroupWriter(a), GroupWriter(b)
        for _fragment in range(rng.randint(1, 5)):
            ops = [_op(rng, n := n + 1) for _ in range(rng.randint(1, 6))]
            t = 1_700_000_000_000_000 + n
            position += len(ops)
            entry = pb.Entry.FromString(framed(ops))
            entry.commit_time_us, entry.origin = t, origin
            ga.add(entry, position)
            gb.add(EncodedEntry(framed(ops), t, origin), position)
        assert ga.finish(position) == gb.finish(position)
        assert a.position == b.position == position
    a.log.flush()
    b.log.flush()
    logged = a.log.read(1, max_entries=1000)
    assert len(logged) > 12
    assert logged == b.log.read(1, max_entries=1000)
    entries = [pb.Entry.FromString(e) for e in logged[1:]]
    assert any(e.continued for e in entries)
    assert any(e.fragment > 1 for e in entries)
    for pub in (a, b):
        pub.log.close()

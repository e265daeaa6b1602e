"""A plain, obviously-correct applier: entries one by one into Python dicts.

Used as the oracle in property tests and by in-process test subscribers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from common.rpc import txrepl_pb2 as pb
from common.values import decode


@dataclass
class ReferenceTarget:
    schemas: dict[str, pb.TableSchema] = field(default_factory=dict)
    tables: dict[str, dict[tuple[object, ...], dict[str, object]]] = field(default_factory=dict)
    level: int = 0

    def apply(self, seq: int, entry: pb.Entry) -> None:
        assert seq == self.level + 1, f"gap: {seq} after {self.level}"
        for op in entry.ops:
            kind = op.WhichOneof("kind")
            if kind == "schema":
                self.schemas[op.schema.table] = op.schema
                self.tables.setdefault(op.schema.table, {})
                names = [c.name for c in op.schema.columns]
                for row in self.tables[op.schema.table].values():
                    for n in names:
                        row.setdefault(n, None)
            elif kind == "row":
                self._row(op.row)
        self.level = seq

    def _row(self, rc: pb.RowChange) -> None:
        schema = self.schemas[rc.table]
        names = [c.name for c in schema.columns]
        rows = self.tables[rc.table]
        if rc.op == pb.ROW_OP_TRUNCATE:
            rows.clear()
            return
        if rc.op in (pb.ROW_OP_UPDATE, pb.ROW_OP_DELETE):
            rows.pop(tuple(decode(v) for v in rc.key), None)
        if rc.op in (pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE):
            row = dict(zip(names, (decode(v) for v in rc.row), strict=False))
            key = tuple(row[k] for k in schema.primary_key)
            rows[key] = row

    def apply_all(self, first_seq: int, entries: Iterable[pb.Entry]) -> None:
        for i, e in enumerate(entries):
            self.apply(first_seq + i, e)

    def snapshot(self) -> dict[str, list[tuple[object, ...]]]:
        out = {}
        for table, rows in self.tables.items():
            names = [c.name for c in self.schemas[table].columns]
            out[table] = sorted(tuple(r.get(n) for n in names) for r in rows.values())
        return out

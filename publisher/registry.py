"""The publisher's registry of subscribers (Virtuoso's RS_LEVEL / RS_VALID).

One row per (publication, subscriber), created on the subscriber's first sync
request: acked level, valid flag, feed state, connected since, last ack, cut
count and last cut reason; plus a table of timestamped state transitions.
SQLAlchemy Core, so any SQLAlchemy URL works; SQLite in the data directory by
default.  Every method is one short transaction; the feed calls them from the
event loop through a worker thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import sqlalchemy as sa

from common.feedstatus import CutKind, cut_label

__all__ = ["MeteredRegistry", "Registry", "SubscriberRow"]

_meta = sa.MetaData()

subscribers = sa.Table(
    "subscribers",
    _meta,
    sa.Column("publication", sa.String, primary_key=True),
    sa.Column("subscriber", sa.String, primary_key=True),
    sa.Column("incarnation", sa.String, nullable=False, default=""),
    sa.Column("level", sa.BigInteger, nullable=False, default=0),
    sa.Column("valid", sa.Boolean, nullable=False, default=True),
    sa.Column("invalid_reason", sa.String, nullable=False, default=""),
    sa.Column("waive_delta", sa.Boolean, nullable=False, default=False),
    sa.Column("state", sa.String, nullable=False, default="disconnected"),
    sa.Column("connected_since", sa.Float, nullable=True),
    sa.Column("last_ack", sa.Float, nullable=True),
    sa.Column("level_time", sa.Float, nullable=True),  # commit time of the acked entry
    sa.Column("cuts", sa.Integer, nullable=False, default=0),
    sa.Column("last_cut_reason", sa.String, nullable=False, default=""),
    sa.Column("created", sa.Float, nullable=False),
)

transitions = sa.Table(
    "transitions",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("publication", sa.String, nullable=False),
    sa.Column("subscriber", sa.String, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("state", sa.String, nullable=False),
    sa.Column("reason", sa.String, nullable=False, default=""),
)


@dataclass(frozen=True)
class SubscriberRow:
    publication: str
    subscriber: str
    incarnation: str
    level: int
    valid: bool
    invalid_reason: str
    waive_delta: bool
    state: str
    connected_since: float | None
    last_ack: float | None
    level_time: float | None
    cuts: int
    last_cut_reason: str


class Registry:
    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url)
        if self.engine.dialect.name == "sqlite":

            @sa.event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn: object, _rec: object) -> None:
                cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

        _meta.create_all(self.engine)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    def get(self, publication: str, subscriber: str) -> SubscriberRow | None:
        with self.engine.connect() as c:
            row = c.execute(sa.select(subscribers).where(_key(publication, subscriber))).first()
        return _row(row) if row is not None else None

    def list_subscribers(self, publication: str | None = None) -> list[SubscriberRow]:
        q = sa.select(subscribers).order_by(subscribers.c.publication, subscribers.c.subscriber)
        if publication:
            q = q.where(subscribers.c.publication == publication)
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    def ensure(
        self, publication: str, subscriber: str, incarnation: str, level: int
    ) -> SubscriberRow:
        """The subscriber's row, created on its first sync request."""
        with self._lock, self.engine.begin() as c:
            row = c.execute(sa.select(subscribers).where(_key(publication, subscriber))).first()
            if row is None:
                c.execute(
                    subscribers.insert().values(
                        publication=publication,
                        subscriber=subscriber,
                        incarnation=incarnation,
                        level=level,
                        valid=True,
                        invalid_reason="",
                        waive_delta=False,
                        state="disconnected",
                        cuts=0,
                        last_cut_reason="",
                        created=time.time(),
                    )
                )
                row = c.execute(sa.select(subscribers).where(_key(publication, subscriber))).one()
        return _row(row)

    def _update(self, publication: str, subscriber: str, **values: object) -> None:
        with self._lock, self.engine.begin() as c:
            c.execute(subscribers.update().where(_key(publication, subscriber)).values(**values))

    def set_state(self, publication: str, subscriber: str, state: str, reason: str = "") -> None:
        now = time.time()
        values: dict[str, object] = {"state": state}
        if state in ("syncing",):
            values["connected_since"] = now
        if state == "disconnected":
            values["connected_since"] = None
        with self._lock, self.engine.begin() as c:
            c.execute(subscribers.update().where(_key(publication, subscriber)).values(**values))
            c.execute(
                transitions.insert().values(
                    publication=publication,
                    subscriber=subscriber,
                    at=now,
                    state=state,
                    reason=reason,
                )
            )

    def ack(
        self, publication: str, subscriber: str, level: int, level_time: float | None = None
    ) -> None:
        self._update(
            publication,
            subscriber,
            level=level,
            last_ack=time.time(),
            level_time=level_time,
        )

    def set_level(self, publication: str, subscriber: str, level: int, incarnation: str) -> None:
        self._update(publication, subscriber, level=level, incarnation=incarnation)

    def record_cut(self, publication: str, subscriber: str, kind: CutKind, reason: str) -> None:
        """Count a cut; ``kind`` is for subclasses that label it (the text is kept)."""
        with self._lock, self.engine.begin() as c:
            c.execute(
                subscribers.update()
                .where(_key(publication, subscriber))
                .values(cuts=subscribers.c.cuts + 1, last_cut_reason=reason)
            )

    def mark_invalid(self, publication: str, subscriber: str, reason: str) -> None:
        self._update(publication, subscriber, valid=False, invalid_reason=reason)
        self.set_state(publication, subscriber, "invalid", reason)

    def mark_valid(self, publication: str, subscriber: str, level: int | None = None) -> None:
        values: dict[str, object] = {"valid": True, "invalid_reason": "", "waive_delta": True}
        if level is not None:
            values["level"] = level
        self._update(publication, subscriber, **values)
        self.set_state(publication, subscriber, "disconnected", "marked valid by an operator")

    def drop(self, publication: str, subscriber: str) -> SubscriberRow | None:
        """Delete the subscriber's row (it then holds no log back); the row as it was,
        None when there was none.  The timeline keeps a "dropped" transition."""
        with self._lock, self.engine.begin() as c:
            row = c.execute(sa.select(subscribers).where(_key(publication, subscriber))).first()
            if row is None:
                return None
            c.execute(subscribers.delete().where(_key(publication, subscriber)))
            c.execute(
                transitions.insert().values(
                    publication=publication,
                    subscriber=subscriber,
                    at=time.time(),
                    state="dropped",
                    reason="dropped by an operator",
                )
            )
        return _row(row)

    def end_waiver(self, publication: str, subscriber: str) -> None:
        self._update(publication, subscriber, waive_delta=False)

    def min_valid_level(self, publication: str) -> int | None:
        with self.engine.connect() as c:
            v = c.execute(
                sa.select(sa.func.min(subscribers.c.level)).where(
                    subscribers.c.publication == publication, subscribers.c.valid.is_(True)
                )
            ).scalar()
        return None if v is None else int(v)

    def timeline(self, publication: str, subscriber: str) -> list[tuple[float, str, str]]:
        with self.engine.connect() as c:
            return [
                (r.at, r.state, r.reason)
                for r in c.execute(
                    sa.select(transitions)
                    .where(
                        transitions.c.publication == publication,
                        transitions.c.subscriber == subscriber,
                    )
                    .order_by(transitions.c.id)
                )
            ]


def _key(publication: str, subscriber: str) -> sa.ColumnElement[bool]:
    return sa.and_(subscribers.c.publication == publication, subscribers.c.subscriber == subscriber)


def _row(r: sa.Row[object]) -> SubscriberRow:
    m = r._mapping
    return SubscriberRow(
        publication=m["publication"],
        subscriber=m["subscriber"],
        incarnation=m["incarnation"],
        level=int(m["level"]),
        valid=bool(m["valid"]),
        invalid_reason=m["invalid_reason"],
        waive_delta=bool(m["waive_delta"]),
        state=m["state"],
        connected_since=m["connected_since"],
        last_ack=m["last_ack"],
        level_time=m["level_time"],
        cuts=int(m["cuts"]),
        last_cut_reason=m["last_cut_reason"],
    )


class MeteredRegistry(Registry):
    """The registry, counting cuts by kind (its metric label) as the feed records them."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.cuts_by_reason: dict[tuple[str, str], int] = {}

    def record_cut(self, publication: str, subscriber: str, kind: CutKind, reason: str) -> None:
        super().record_cut(publication, subscriber, kind, reason)
        key = (publication, cut_label(kind))
        self.cuts_by_reason[key] = self.cuts_by_reason.get(key, 0) + 1

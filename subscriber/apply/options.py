"""How an :class:`~subscriber.apply.Applier` behaves.

``ApplyOptions`` mirrors ``[apply]`` of the subscriber config (``subscriber.config``
keeps the TOML side free of Spark and Arrow); :meth:`ApplyOptions.from_config`
converts.  The writer a target URL gets is the registry's business
(``subscriber.targets.open_writer``): the apply knows only the Writer protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.backoff import Backoff

__all__ = ["ApplyOptions", "TableOptions"]


@dataclass(frozen=True)
class TableOptions:
    """Per source table: the "Manipulate" step (Spark SQL) and history mode.

    ``rename`` maps source to target column names; ``drop`` lists source columns
    not replicated; ``computed`` adds target columns from Spark SQL expressions
    over the source columns; rows for which ``filter`` (a Spark SQL predicate over
    the source columns) is not true are deleted on the target; ``target`` is the
    target table's name.  ``history`` keeps every version instead of overwriting.
    """

    target: str = ""
    rename: Mapping[str, str] = field(default_factory=dict)
    drop: tuple[str, ...] = ()
    computed: Mapping[str, str] = field(default_factory=dict)
    filter: str = ""
    history: bool = False

    def __post_init__(self) -> None:
        if self.history and self.transforms:
            raise ValueError("history mode keeps the source's columns: no transforms with it")

    @property
    def transforms(self) -> bool:
        return bool(self.rename or self.drop or self.computed or self.filter)

    @property
    def shaped(self) -> bool:
        """The target table is not the source's as is: another name, transforms or history."""
        return bool(self.target) or self.transforms or self.history


@dataclass(frozen=True)
class ApplyOptions:
    """Error policy, retries of transient target errors, per-table options."""

    error_policy: str = "stop"  # or "skip": store the poisoned entry and move past it
    retries: int = 5  # attempts in all for a transient target error
    # Waits between them: 0.2 s, doubling, at most 5 s (no jitter: one applier per target).
    retry_backoff: Backoff = field(
        default_factory=lambda: Backoff(initial_s=0.2, max_s=5.0, multiplier=2.0, jitter=0.0)
    )
    jdbc_min_rows: int = 0  # PostgreSQL: stage through Spark JDBC from this many rows
    # Plain-table batches of fewer row changes: net effect in the driver, no Spark
    # job (its fixed cost would bound the in-sync lag); catch-up batches go through
    # Spark (1,000,000 keeps them in the driver: docs/apply.md); 0: every batch.
    spark_min_rows: int = 10_000
    tables: Mapping[str, TableOptions] = field(default_factory=dict)
    # Plain rows steps carry each row's source commit time (``_commit_us``), which
    # conflict resolution reads (an updatable subscription; parses every entry).
    commit_times: bool = False

    def __post_init__(self) -> None:
        if self.error_policy not in ("stop", "skip"):
            raise ValueError("error_policy: must be 'stop' or 'skip'")
        if self.retries < 1:
            raise ValueError("retries: must be at least 1")
        if self.spark_min_rows < 0:
            raise ValueError("spark_min_rows: must not be negative")

    @classmethod
    def from_config(cls, config: Any) -> ApplyOptions:
        """From a ``subscriber.config.ApplyConfig`` (read by attribute)."""
        return cls(
            error_policy=config.error_policy,
            retries=config.retries,
            jdbc_min_rows=config.jdbc_min_rows,
            spark_min_rows=config.spark_min_rows,
            tables={
                name: TableOptions(
                    target=t.target,
                    rename=dict(t.rename),
                    drop=tuple(t.drop),
                    computed=dict(t.computed),
                    filter=t.filter,
                    history=t.history,
                )
                for name, t in config.tables.items()
            },
        )

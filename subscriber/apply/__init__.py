"""Spark apply engine: batches of entries -> net effect in Spark -> one target transaction.

The engine knows targets only through the :class:`Writer` protocol; the writers
live in ``subscriber.targets``.  ``EventBuffer``, ``shaped_rows``,
``target_schema`` and ``arrow_frame`` are the face the snapshot's transforms
(``subscriber.reinit.shape``) use to shape rows exactly as the apply does.

Public face (see ``docs/apply.md``)::

    spark = create_spark_session(SparkSettings(master="local[2]"))
    applier = Applier(spark, open_writer("sqlite:///target.db"), subscription="s1")
    # open_writer: subscriber.targets (the apply knows only the Writer protocol)
    state = applier.load_state()
    result = applier.apply(state.level + 1, entries, incarnation="...")
"""

from subscriber.apply._events import EventBuffer
from subscriber.apply._shape import shaped_rows, target_schema
from subscriber.apply.engine import Applier, ApplyResult, Planned
from subscriber.apply.entry import AnyEntry, RawEntry
from subscriber.apply.errors import (
    ApplyError,
    GapError,
    PoisonEntryError,
    SchemaError,
    TransientError,
    WriterError,
)
from subscriber.apply.options import ApplyOptions, TableOptions
from subscriber.apply.session import SparkSettings, arrow_frame, create_spark_session
from subscriber.apply.writer import StoredError, SubscriptionState, Writer

__all__ = [
    "AnyEntry",
    "Applier",
    "ApplyError",
    "ApplyOptions",
    "ApplyResult",
    "EventBuffer",
    "GapError",
    "Planned",
    "PoisonEntryError",
    "RawEntry",
    "SchemaError",
    "SparkSettings",
    "StoredError",
    "SubscriptionState",
    "TableOptions",
    "TransientError",
    "Writer",
    "WriterError",
    "arrow_frame",
    "create_spark_session",
    "shaped_rows",
    "target_schema",
]

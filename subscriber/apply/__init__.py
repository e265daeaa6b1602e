"""Spark apply engine: batches of entries -> net effect in Spark -> one target transaction.

Public face (see ``docs/apply.md``)::

    spark = create_spark_session(SparkSettings(master="local[2]"))
    applier = Applier(spark, SqliteWriter("target.db"), subscription="s1")
    state = applier.load_state()
    result = applier.apply(state.level + 1, entries, incarnation="...")
"""

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
from subscriber.apply.options import ApplyOptions, TableOptions, open_writer
from subscriber.apply.postgres import PostgresWriter
from subscriber.apply.session import SparkSettings, create_spark_session
from subscriber.apply.sqlite import SqliteWriter
from subscriber.apply.writer import StoredError, SubscriptionState, Writer

__all__ = [
    "AnyEntry",
    "Applier",
    "ApplyError",
    "ApplyOptions",
    "ApplyResult",
    "GapError",
    "Planned",
    "PoisonEntryError",
    "PostgresWriter",
    "RawEntry",
    "SchemaError",
    "SparkSettings",
    "SqliteWriter",
    "StoredError",
    "SubscriptionState",
    "TableOptions",
    "TransientError",
    "Writer",
    "WriterError",
    "create_spark_session",
    "open_writer",
]

"""The long-lived SparkSession of a subscriber daemon."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SparkSettings",
    "arrow_frame",
    "create_spark_session",
    "ensure_spark_alive",
    "spark_status",
]

_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")


@dataclass(frozen=True)
class SparkSettings:
    """How to start Spark; validated once, at construction.

    ``conf`` entries override the defaults set by :func:`create_spark_session`;
    ``jars`` are local paths (JDBC drivers from Debian packages, Maven being
    unreachable) joined into ``spark.jars``, which also ships them to executors.
    ``executor_cores`` (0: Spark's default) and ``executor_memory`` ("": default)
    size the executors of a cluster; ``python`` is the interpreter executors run
    Python workers with ("": this process's, right for local masters and for
    clusters whose machines share the same path and packages).
    """

    master: str = "local[2]"
    app_name: str = "txrepl-subscriber"
    conf: Mapping[str, str] = field(default_factory=dict)
    jars: Sequence[str] = ()
    shuffle_partitions: int = 2
    log_level: str = "WARN"
    executor_cores: int = 0
    executor_memory: str = ""
    python: str = ""

    @classmethod
    def from_config(cls, config: Any) -> SparkSettings:
        """From a ``subscriber.config.SparkConfig`` (read by attribute)."""
        return cls(
            master=config.master,
            conf=dict(config.conf),
            jars=tuple(config.jars),
            shuffle_partitions=config.shuffle_partitions,
            log_level=config.log_level,
            executor_cores=getattr(config, "executor_cores", 0),
            executor_memory=getattr(config, "executor_memory", ""),
            python=getattr(config, "python", ""),
        )

    def __post_init__(self) -> None:
        if not self.master:
            raise ValueError("SparkSettings.master: must not be empty")
        if not self.app_name:
            raise ValueError("SparkSettings.app_name: must not be empty")
        if self.shuffle_partitions < 1:
            raise ValueError("SparkSettings.shuffle_partitions: must be at least 1")
        if self.log_level.upper() not in _LOG_LEVELS:
            raise ValueError(f"SparkSettings.log_level: must be one of {', '.join(_LOG_LEVELS)}")
        if self.executor_cores < 0:
            raise ValueError("SparkSettings.executor_cores: must not be negative")
        for key, value in self.conf.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"SparkSettings.conf: {key!r} must map a string to a string")


def create_spark_session(settings: SparkSettings) -> SparkSession:
    """Start (or join) the process's SparkSession, tuned for small, frequent batches.

    The UI is off, the driver binds to loopback, Python workers run this
    interpreter (so they see the venv's packages), shuffles use few partitions
    and DataFrames move through Arrow in batches of up to a million rows (one
    partition per batch); the driver JVM JIT-compiles with C1 only.  Spark's
    own logging is cut to WARN.
    """
    # Spark's launcher and its Python workers read these from the environment.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The driver's PYSPARK_PYTHON is also what executors start Python workers with.
    python = settings.python or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    # deferred: pyspark loads when a session is made, not with this module
    from pyspark.sql import SparkSession

    conf: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.default.parallelism": str(settings.shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        # createDataFrame(pyarrow.Table) makes one partition per Arrow batch: with
        # the default 10,000 rows a 100k-row batch became 10 tasks, and the JVM
        # spent about twice the CPU of one task on the net-effect job.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000000",
        # Below this many bytes (48 MB by default) createDataFrame(pyarrow.Table)
        # turns the table into rows in the driver and ships them, Java-serialized
        # row by row, inside the tasks: a 72k-row net-effect job cost the JVM
        # 0.5 s of CPU that way, against 0.15 s when the Arrow bytes travel as
        # they are and executors decode them (and on a cluster, the executors do).
        "spark.sql.execution.arrow.localRelationThreshold": "0",
        # The driver JVM (in local mode, the executor too) runs many small jobs
        # whose generated code keeps the C2 JIT busy: measured on 2 cores, C2 took
        # ~2/3 of the JVM's CPU over the first W1 batches, and C1 alone halved
        # the JVM CPU per batch with no slower tasks.  Set the option in ``conf``
        # to override (it replaces this value).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
    }
    if settings.jars:
        conf["spark.jars"] = ",".join(settings.jars)
    if settings.executor_cores:
        conf["spark.executor.cores"] = str(settings.executor_cores)
    if settings.executor_memory:
        conf["spark.executor.memory"] = settings.executor_memory
    conf.update(settings.conf)

    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = _start(builder)
    spark.sparkContext.setLogLevel(settings.log_level.upper())
    return spark


# Pauses before the second and third start of a driver whose JVM died before it said
# its port.
_START_RETRY_PAUSES = (2.0, 5.0)


def _start(builder: Any) -> SparkSession:
    """``builder.getOrCreate()``, started again (twice at most) if the JVM dies at birth.

    The launcher's JVM sometimes dies before it says its port, without a word on
    stderr (seen a few times in a thousand starts on a busy 2-core machine while other
    JVMs start or stop, twice in a row once, within a second).  A pause and another
    start cost seconds; a real fault (no Java, a bad option) fails every time and is
    raised after the last one.
    """
    log = structlog.get_logger(__name__)
    for attempt, pause in enumerate((*_START_RETRY_PAUSES, None), start=1):
        try:
            spark: SparkSession = builder.getOrCreate()
            return spark
        except Exception as exc:  # pyspark raises its own runtime error class
            if "JAVA_GATEWAY_EXITED" not in str(exc) or pause is None:
                raise
            log.warning("spark start retried", error=str(exc), attempt=attempt, pause_s=pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def spark_status(spark: SparkSession) -> str | None:
    """None when ``spark`` can run a job now, else why not (for logs and error states).

    On a cluster master (not ``local``) a session without any registered executor
    cannot run a job: Spark would wait for one without a time limit.
    """
    try:
        sc = spark.sparkContext
        jsc = sc._jsc
        if jsc is None or jsc.sc().isStopped():
            return "the SparkContext is stopped"
        master = str(sc.master)
        if master.startswith("local"):
            return None
        # The map lists the driver's block manager too.
        executors = int(jsc.sc().getExecutorMemoryStatus().size()) - 1
        if executors < 1:
            return f"no Spark executor registered (master {master})"
    except Exception as e:  # the JVM or its gateway is gone
        return f"Spark does not answer: {type(e).__name__}: {e}"
    return None


def ensure_spark_alive(spark: SparkSession, settings: SparkSettings) -> SparkSession:
    """``spark`` if its context still runs, else a new session made from ``settings``.

    A driver's context stops for good when Spark gives up on its master ("All
    masters are unresponsive") or the master removes the application; every later
    job then fails.  Callers keep the returned session (and hand it to their
    appliers).  A session whose executors are merely missing is returned as is:
    executors come back when workers do.
    """
    try:
        jsc = spark.sparkContext._jsc
        stopped = jsc is None or bool(jsc.sc().isStopped())
    except Exception:
        stopped = True
    if not stopped:
        return spark
    with contextlib.suppress(Exception):
        spark.stop()
    return create_spark_session(settings)


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``spark.createDataFrame(table)``, with the table's chunks combined first.

    PySpark 4.0 loses rows of a table made of several Arrow chunks when some are
    empty: chunks of 0, 0 and 1 rows gave an empty DataFrame (found by the property
    test of ``tests/integration/subscriber/test_apply_small.py``; ``pa.concat_tables`` of
    segments makes such tables).  One chunk avoids it, at the cost of one copy.
    """
    if any(col.num_chunks > 1 for col in table.columns):
        table = table.combine_chunks()
    df = spark.createDataFrame(table)
    if table.num_rows <= _records_per_batch(spark):
        # One Arrow batch is one partition; saying so lets a group-by or window
        # over it run as one stage, without a shuffle (0.135 s instead of 0.21 s
        # for a 72k-row net-effect job here).  coalesce(1) merges nothing here.
        df = df.coalesce(1)
    return df


def _records_per_batch(spark: SparkSession) -> int:
    """``spark.sql.execution.arrow.maxRecordsPerBatch`` of ``spark``: rows per partition
    of a DataFrame made from Arrow (0 when unknown, so that nothing is coalesced)."""
    value = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    try:
        return max(int(value or 10000), 0)
    except ValueError:
        return 0

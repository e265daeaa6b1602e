"""The Spark boundary (subscriber/apply/_spark.py): py4j's and pyspark's errors, raised
by a real session, become txrepl errors; anything else passes through unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from py4j.protocol import Py4JError, Py4JNetworkError

from common import errors as common
from subscriber.apply import Applier, ApplyError, ApplyOptions, TableOptions
from subscriber.apply._spark import spark_errors, translate
from subscriber.apply.errors import (
    SchemaError,
    SparkError,
    SparkJobError,
    SparkQueryError,
    SparkUnavailable,
)

pytestmark = pytest.mark.spark


def _raised(block: Any) -> BaseException:
    with pytest.raises(BaseException) as info, spark_errors():
        block()
    return info.value


def test_an_analysis_error_becomes_a_permanent_query_error(spark: Any) -> None:
    """A query that does not analyse: SparkQueryError, a PermanentError, the cause kept."""
    from pyspark.errors import AnalysisException

    exc = _raised(lambda: spark.sql("SELECT no_such_column FROM range(1)").collect())
    assert isinstance(exc, SparkQueryError)
    assert isinstance(exc, common.PermanentError)
    assert isinstance(exc, SparkError)
    assert not isinstance(exc, ApplyError)
    assert isinstance(exc.__cause__, AnalysisException)
    assert str(exc).startswith("Spark refused a query: AnalysisException: ")


def test_a_failed_jvm_call_becomes_a_transient_job_error(spark: Any) -> None:
    """A Java exception through py4j (pyspark re-raises it as one of its own, else a
    Py4JJavaError): SparkJobError, a TransientError."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    jvm = spark._jvm
    exc = _raised(lambda: jvm.java.lang.Integer.parseInt("not a number"))
    assert isinstance(exc, SparkJobError)
    assert isinstance(exc, common.TransientError)
    assert isinstance(exc.__cause__, Py4JJavaError | PySparkException)
    assert "NumberFormatException" in str(exc)


def test_a_lost_gateway_becomes_spark_unavailable() -> None:
    """py4j's network and protocol errors: SparkUnavailable, a TransientError."""
    for raw in (Py4JNetworkError("Answer from Java side is empty"), Py4JError("gone")):
        mapped = translate(raw)
        assert isinstance(mapped, SparkUnavailable)
        assert isinstance(mapped, common.TransientError)
        assert type(raw).__name__ in str(mapped)


def test_other_errors_pass_through_unchanged() -> None:
    """Not Spark's: left alone (a txrepl error too)."""
    assert translate(ValueError("x")) is None
    with pytest.raises(ValueError), spark_errors():
        raise ValueError("x")
    with pytest.raises(SchemaError), spark_errors():
        raise SchemaError("already ours")


def test_the_applier_plans_inside_the_boundary(spark: Any) -> None:
    """A transform's filter that Spark cannot analyse fails the batch as SparkQueryError
    (not narrowed, nothing stored): the planning runs inside the boundary."""
    from common.rpc import txrepl_pb2 as pb

    class NoWriter:
        dialect = "none"

        def load_state(self, subscription: str) -> Any:
            from subscriber.apply import SubscriptionState

            return SubscriptionState()

    options = ApplyOptions(tables={"t": TableOptions(filter="no_such_column > 0")})
    applier = Applier(spark, NoWriter(), "s", options=options)  # type: ignore[arg-type]
    schema = pb.TableSchema(
        table="t",
        columns=[pb.Column(name="k", type=pb.COLUMN_TYPE_INTEGER)],
        primary_key=["k"],
    )
    row = pb.Op(row=pb.RowChange(table="t", op=pb.ROW_OP_INSERT, row=[pb.Value(int=1)]))
    with pytest.raises(SparkQueryError):
        applier._plan(1, [pb.Entry(ops=[pb.Op(schema=schema), row])], {})

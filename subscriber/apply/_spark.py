"""The Spark boundary: py4j's and pyspark's errors become txrepl errors here, once.

Everything the apply asks of Spark (the net-effect jobs, the transforms, history
versions) runs inside the planning of a batch, which runs inside
:func:`spark_errors`.  The mapping, tested in
``tests/integration/subscriber/test_apply_spark_errors.py``:

==================================================  ==========================
raised by py4j / pyspark                            raised as
==================================================  ==========================
``py4j.protocol.Py4JNetworkError`` (gateway gone)   :class:`SparkUnavailable`
other ``py4j.protocol.Py4JError`` (JVM gone)        :class:`SparkUnavailable`
``py4j.protocol.Py4JJavaError`` (a job failed)      :class:`SparkJobError`
``pyspark.errors.AnalysisException`` (and its       :class:`SparkQueryError`
``ParseException``)
any other ``pyspark.errors.PySparkException``       :class:`SparkJobError`
anything else                                       unchanged
==================================================  ==========================

None of them is an :class:`~subscriber.apply.errors.ApplyError`: a batch that
Spark failed is neither narrowed nor stored as poisoned; the subscription
reconnects and tries it again, as it did with the raw errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from common.errors import TxreplError
from subscriber.apply.errors import SparkError, SparkJobError, SparkQueryError, SparkUnavailable

__all__ = ["spark_errors", "translate"]


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a Py4JJavaError whose JVM is gone cannot render itself
        text = ""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line[:500]}".rstrip(": ")


def translate(exc: BaseException) -> SparkError | None:
    """The txrepl error for a py4j or pyspark error; None for any other exception."""
    # Deferred: py4j and pyspark load with the SparkSession, not with this module.
    from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError
    from pyspark.errors import AnalysisException, PySparkException

    what = _first_line(exc)
    if isinstance(exc, AnalysisException):
        return SparkQueryError(f"Spark refused a query: {what}")
    if isinstance(exc, Py4JJavaError | PySparkException):
        return SparkJobError(f"a Spark job failed: {what}")
    if isinstance(exc, Py4JNetworkError | Py4JError):
        return SparkUnavailable(f"Spark does not answer: {what}")
    return None


@contextlib.contextmanager
def spark_errors() -> Iterator[None]:
    """Run a block of Spark work; its py4j / pyspark errors leave it translated."""
    try:
        yield
    except TxreplError:
        raise
    except Exception as exc:
        mapped = translate(exc)
        if mapped is None:
            raise
        raise mapped from exc

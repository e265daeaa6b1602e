"""The subscriber's SparkSession starts beside the subscriptions, not before them (issue 23).

An in-sync batch needs no Spark job (its net effect is computed in the driver), so an
applier on a session that is still starting loads its state and applies small batches;
only a Spark job waits for the session.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from subscriber.apply import Applier, ApplyOptions
from subscriber.apply.lazy import LazySpark
from subscriber.targets.sqlite import SqliteWriter
from tests.support.entries import INC, ITEMS, entry, ins, schema_op

pytestmark = pytest.mark.spark


def test_small_batches_apply_while_the_session_is_still_starting(
    spark: Any, tmp_path: Path
) -> None:
    """Held back session: state loaded, two entries applied; released: a Spark job runs."""
    release = threading.Event()

    def start() -> Any:
        release.wait(300)
        return spark

    lazy = LazySpark(start)
    applier = Applier(cast(Any, lazy), SqliteWriter(str(tmp_path / "t.db")), "s")
    # Before this change load_state waited for the warm-up jobs, hence for the JVM.
    applier.WARM_UP_WAIT_S = 3600
    assert applier.load_state().level == 0
    one = entry(schema_op(ITEMS), ins("items", 1, "a", Decimal("1.50")))
    assert applier.apply(1, [one], incarnation=INC).level == 1
    assert applier.apply(2, [entry(ins("items", 2, "b", None))], incarnation=INC).level == 2
    assert lazy.starting  # all of it without the session

    release.set()
    applier.configure(ApplyOptions(spark_min_rows=0))  # every batch's net effect in Spark
    assert applier.apply(3, [entry(ins("items", 3, "c", None))], incarnation=INC).level == 3
    assert lazy.session() is spark


def test_a_session_that_failed_to_start_raises_its_error_at_first_use() -> None:
    """The start's error is kept: every use of the session raises it, none waits."""

    def start() -> Any:
        raise RuntimeError("no Java runtime")

    lazy = LazySpark(start)
    with pytest.raises(RuntimeError, match="no Java runtime"):
        lazy.sparkContext  # noqa: B018 - the attribute read is the use
    assert lazy.failed

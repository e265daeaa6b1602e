"""A Spark driver whose JVM dies at birth is started again; other faults are not."""

from __future__ import annotations

from typing import Any

import pytest

from subscriber.apply import session


class _Builder:
    """Fails ``getOrCreate`` with the given errors, then returns a session."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def getOrCreate(self) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "session"


def _gateway_exited() -> Exception:
    return RuntimeError(
        "[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number."
    )


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("subscriber.apply.session.time.sleep", slept.append)
    return slept


def test_two_jvm_deaths_in_a_row_are_outlived(pauses: list[float]) -> None:
    builder = _Builder(_gateway_exited(), _gateway_exited())
    started: object = session._start(builder)
    assert started == "session"
    assert builder.calls == 3
    assert pauses == list(session._START_RETRY_PAUSES)


def test_a_jvm_that_never_starts_raises_after_the_last_try(pauses: list[float]) -> None:
    builder = _Builder(*(_gateway_exited() for _ in range(5)))
    with pytest.raises(RuntimeError, match="JAVA_GATEWAY_EXITED"):
        session._start(builder)
    assert builder.calls == len(session._START_RETRY_PAUSES) + 1


def test_another_fault_is_raised_at_once(pauses: list[float]) -> None:
    builder = _Builder(ValueError("spark.executor.memory: bad size"))
    with pytest.raises(ValueError, match="bad size"):
        session._start(builder)
    assert builder.calls == 1
    assert pauses == []

"""Publisher start-up (issue 23): capture starts before the registry and the port, so a
start that fails after it (an unusable registry) must still end in one line, leave
the log closed and whole, and lose nothing for the next start."""

from __future__ import annotations

from pathlib import Path

from publisher.log import open_log
from tests.support.harness import Pair, publisher_start_fails, wait_until
from tests.support.workload import W1, run_sqlite, sqlite_source


def test_an_unusable_registry_stops_the_start_in_one_line_and_the_next_start_captures_all(
    tmp_path: Path,
) -> None:
    txns = list(W1().transactions(3))
    pair = Pair(tmp_path, tables=["accounts", "orders"])
    src = sqlite_source(pair.source_path)
    try:
        pair.start_publisher()  # installs capture
        run_sqlite(src, txns[:1])
        wait_until(lambda: pair.head() >= 1, 60, "the first transaction to be captured")
        assert pair.pub is not None
        before = pair.head()
        pair.pub.stop()
        run_sqlite(src, txns[1:])  # committed while the publisher is down

        pair.publisher_extra = {
            "registry_url": f"sqlite:///{tmp_path / 'no' / 'registry.db'}",
            "metrics_listen": "",  # not the fixed default port (publisher_start_fails)
        }
        line = publisher_start_fails(pair, first=False)
        assert "registry cannot be opened" in line
        assert "registry_url" in line
        with open_log(tmp_path / "publisher" / "publications" / "shop") as log:
            assert log.head >= before  # unlocked, and whole: what capture logged meanwhile

        pair.publisher_extra = {}
        pair.start_publisher()  # the log's lock was released, its recovery finds it whole
        wait_until(lambda: pair.head() > before, 60, "the new transactions to be captured")
    finally:
        pair.stop()
        src.close()

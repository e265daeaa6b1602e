"""A serve loop stops when asked, not when its poll timeout runs out (common/_serve_stop.py)."""

from __future__ import annotations

import socket
import socketserver
import threading
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from common._serve_stop import stop_serving
from common.metrics import MetricsServer


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        pass


def _assert_refused(host: str, port: int, what: str) -> None:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return
    raise AssertionError(f"{what} still accepts connections")


def test_a_loop_polling_once_an_hour_stops_when_asked() -> None:
    """With a poll timeout of an hour, stop_serving() still returns, and the loop has
    ended: a plain shutdown() would wait for the hour (the daemons' metrics endpoint
    polls every 0.5 s, which every graceful stop used to wait out)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    loop = threading.Thread(target=server.serve_forever, args=(3600.0,), daemon=True)
    loop.start()
    stopper = threading.Thread(target=stop_serving, args=(server,), daemon=True)
    stopper.start()
    # Not a timing bound: the alternative is an hour.
    stopper.join(120)
    assert not stopper.is_alive(), "stop_serving waited for the serve loop's poll timeout"
    loop.join(120)
    assert not loop.is_alive()
    server.server_close()
    host, port = server.server_address[:2]
    _assert_refused(str(host), int(port), "the stopped endpoint")


def test_the_metrics_endpoint_serves_until_stopped_and_refuses_after() -> None:
    """A scrape before stop() gets the registry's metrics; after it the port is closed."""
    registry = CollectorRegistry()
    Counter("txrepl_test_events", "events", registry=registry).inc(3)
    server = MetricsServer("127.0.0.1:0", registry)
    address = server.start()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as resp:
        assert "txrepl_test_events_total 3.0" in resp.read().decode()
    server.stop()
    host, port = address.rsplit(":", 1)
    _assert_refused(host, int(port), "the stopped metrics endpoint")

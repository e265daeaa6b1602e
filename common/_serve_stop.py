"""Stop a ``socketserver`` serve loop without waiting for its poll timeout.

``BaseServer.shutdown()`` sets a flag and waits for ``serve_forever`` to see it,
which it does only between two ``select()`` calls; prometheus_client's
``start_http_server`` runs that loop with the default 0.5 s timeout, so an idle
endpoint took 0-0.5 s (0.25 s on average) to stop, in every graceful stop of
either daemon.

The argument that the stop is prompt and complete: ``shutdown()`` runs in a
helper thread while this one connects to the listening socket every 20 ms until
the helper returns.  Each connection makes the loop's ``select()`` return; the
loop then serves it (an empty request, answered by nothing) and checks the flag.
A connection made before the flag is set only costs one more round, and the next
one, 20 ms later, finds the flag set; so the loop ends within a round of
``shutdown()`` being called, however long its poll timeout.  ``shutdown()``'s own
guarantee is kept: when this returns, the loop has ended and serves no more
scrapes (handlers already running finish on their own threads).  A refused or
failed connection is ignored: the loop may have ended between two rounds.
"""

from __future__ import annotations

import socket
import socketserver
import threading

__all__ = ["stop_serving"]

_ROUND_S = 0.02


def stop_serving(server: socketserver.BaseServer) -> None:
    """``server.shutdown()``, woken at once instead of at the loop's next poll."""
    stopper = threading.Thread(target=server.shutdown, name="serve-stop", daemon=True)
    stopper.start()
    # An AF_INET/AF_INET6 server (a tuple address), as every server of txrepl is.
    address = server.server_address
    assert isinstance(address, tuple), address
    host, port = str(address[0]), int(address[1])
    if host in ("0.0.0.0", "::", ""):  # a wildcard bind answers on loopback too
        host = "::1" if ":" in str(host) else "127.0.0.1"
    while stopper.is_alive():
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
        except OSError:
            pass
        stopper.join(_ROUND_S)

"""sd_notify for ``Type=notify`` units: READY, STOPPING, WATCHDOG, STATUS.

Sends datagrams to ``$NOTIFY_SOCKET`` when systemd (or a test) set it; does
nothing otherwise.  The daemons send READY=1 once their port accepts
connections, WATCHDOG=1 every third of ``WatchdogSec`` while healthy, and
STOPPING=1 when a drain starts.  Written directly on a unix datagram socket (the protocol is
one line of text) so that the exact moment of READY is under our control.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Notifier"]


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        if self.address.startswith("@"):
            self.address = "\0" + self.address[1:]
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process systemd watches; a child must not ping for it.
        mine = not pid.isdigit() or int(pid) == os.getpid()
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and mine else 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, state: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                s.sendto(state.encode(), self.address)
            except OSError:
                pass  # systemd went away; nothing to tell

    def ready(self, status: str = "") -> None:
        self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    def watchdog(self) -> None:
        self.notify("WATCHDOG=1")

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")

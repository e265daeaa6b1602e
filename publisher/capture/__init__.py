"""Capture: turns committed source transactions into publication entries."""

from publisher.capture.sqlite import SqliteCapture

__all__ = ["SqliteCapture"]

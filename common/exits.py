"""Exit statuses of the ``txrepl`` command: one per class of operator error.

An operator error ends in one line on stderr naming what to fix, and an exit
status a script can tell apart (docs/operations.md, "Exit statuses"):

====  ==================  ==========================================================
  0   OK
  1   FAILED              the work failed at run time: the server is unreachable, a
                          call was refused, the daemon stopped on an error
  2   CONFIG              bad command line or configuration (argparse, ConfigError)
  3   UNREADABLE_FILE     a file an option or key names cannot be read
                          (``--token-file``, ``--ca``, ``--cert``, ``--key``, ...)
  4   PORT_BUSY           a daemon cannot listen: its gRPC, control or metrics port
                          is taken or not available (ListenError)
  5   TLS_MISMATCH        the client and the server disagree on TLS: a plaintext
                          client against a TLS port, a TLS client against a
                          plaintext port, or a certificate the other side does
                          not trust
130   INTERRUPTED         ^C
====  ==================  ==========================================================

How a TLS mismatch is recognised (grpc reports all of them as UNAVAILABLE):

- a TLS client against a plaintext port: the handshake fails with
  ``WRONG_VERSION_NUMBER`` (the server answered with HTTP/2 bytes);
- a certificate not trusted, either way: ``CERTIFICATE_VERIFY_FAILED`` (the
  server's certificate is not signed by ``--ca``), or an alert naming the client
  certificate (mutual TLS: no client certificate, or one the server does not trust);
- a plaintext client against a TLS port: grpc only says "Socket closed", as for
  any server that hangs up, so the address is probed once with a TLS
  ClientHello (no verification, 2 s): a server that answers with a TLS
  handshake is a TLS port.  Only on this failure, so the probe costs nothing
  on the paths that work.
"""

from __future__ import annotations

import re
import socket
import ssl

import grpc

from common.errors import describe_rpc_error

__all__ = [
    "CONFIG",
    "FAILED",
    "INTERRUPTED",
    "OK",
    "PORT_BUSY",
    "TLS_MISMATCH",
    "UNREADABLE_FILE",
    "rpc_failure",
    "speaks_tls",
]

OK = 0
FAILED = 1
CONFIG = 2
UNREADABLE_FILE = 3
PORT_BUSY = 4
TLS_MISMATCH = 5
INTERRUPTED = 130

_PEER = re.compile(r"ipv[46]:(\[[^\]]+\]|[^:\s]+):(\d+)")
_CLIENT_CERT = ("CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE")


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` answers a TLS ClientHello with a TLS handshake."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]"), port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=None),
        ):
            return True
    except ssl.SSLEOFError:
        return False  # hung up on the ClientHello: not a TLS server
    except ssl.SSLError as e:
        # A TLS alert (a client certificate is required, say) comes from a TLS server.
        return "ALERT" in str(e).upper()
    except OSError:
        return False


def rpc_failure(e: grpc.RpcError, *, plaintext: bool | None = None) -> tuple[str, int]:
    """One line for a failed call and its exit status (module docstring).

    ``plaintext``: whether the client used a plaintext channel (None: unknown, then
    a closed socket is probed as if it were).
    """
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or ""
    if code != grpc.StatusCode.UNAVAILABLE:
        return describe_rpc_error(e), FAILED
    peer = _PEER.search(details)
    where = f"{peer.group(1)}:{peer.group(2)}" if peer else "the server"
    if "WRONG_VERSION_NUMBER" in details:
        return (
            f"TLS mismatch: {where} speaks plaintext, this client TLS: drop --tls/--ca/"
            "--cert/--key (ca_file, tls = true), or configure [tls] on the server",
            TLS_MISMATCH,
        )
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (
            f"TLS mismatch: {where}'s certificate is not signed by the CA this client "
            "trusts: give --ca (ca_file) the CA that signed the server's certificate",
            TLS_MISMATCH,
        )
    if any(k in details for k in _CLIENT_CERT):
        return (
            f"TLS mismatch: {where} requires a client certificate it trusts (mutual TLS): "
            "give --cert and --key (cert_file, key_file) signed by its client CA",
            TLS_MISMATCH,
        )
    closed = plaintext is not False and "Socket closed" in details and peer is not None
    if closed and peer is not None and speaks_tls(peer.group(1), int(peer.group(2))):
        return (
            f"TLS mismatch: {where} speaks TLS, this client plaintext: give --ca FILE "
            "(or --tls for the system's roots; ca_file or tls = true in a config)",
            TLS_MISMATCH,
        )
    return describe_rpc_error(e), FAILED

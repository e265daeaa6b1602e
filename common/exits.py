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
- a plaintext client against a TLS port, or a TLS client without a certificate
  against a mutual-TLS port: grpc only says "Socket closed", as for any server
  that hangs up, so the address is probed once (:func:`probe_tls`: a TLS
  handshake without verification and one read, 2 s at most): a server that
  answers the handshake is a TLS port; one that then hangs up (or sends the
  alert ``CERTIFICATE_REQUIRED``) instead of waiting for the HTTP/2 preface
  wants a client certificate.  Only on this failure, so the probe costs nothing
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
    "probe_tls",
    "rpc_failure",
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


def probe_tls(host: str, port: int, timeout: float = 2.0) -> str:
    """What ``host:port`` speaks: ``"tls"``, ``"tls-client-cert"`` (TLS that requires
    a client certificate), ``"not-tls"``, or ``"unknown"`` (unreachable)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]"), port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=None) as tls,
        ):
            # TLS 1.3: the server checks the client's certificate after our side of
            # the handshake is done; its refusal arrives on the first read, as an
            # alert or (grpc) as the connection closed at once.  A server content
            # with us waits for the HTTP/2 preface instead: the read times out.
            tls.settimeout(timeout / 2)
            try:
                return "tls-client-cert" if tls.recv(1) == b"" else "tls"
            except ssl.SSLEOFError:
                return "tls-client-cert"
            except ssl.SSLError as e:
                return "tls-client-cert" if "CERTIFICATE" in str(e).upper() else "tls"
            except TimeoutError:
                return "tls"
    except ssl.SSLEOFError:
        return "not-tls"  # hung up on the ClientHello
    except ssl.SSLError as e:
        if "ALERT" in str(e).upper():  # a TLS server refusing us
            return "tls-client-cert" if "CERTIFICATE" in str(e).upper() else "tls"
        return "not-tls"
    except OSError:
        return "unknown"


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
    client_cert = (
        f"TLS mismatch: {where} requires a client certificate it trusts (mutual TLS): "
        "give --cert and --key (cert_file, key_file) signed by its client CA"
    )
    if any(k in details for k in _CLIENT_CERT):
        return client_cert, TLS_MISMATCH
    if "Socket closed" not in details or peer is None:
        return describe_rpc_error(e), FAILED
    speaks = probe_tls(peer.group(1), int(peer.group(2)))
    if plaintext is not False and speaks.startswith("tls"):
        return (
            f"TLS mismatch: {where} speaks TLS, this client plaintext: give --ca FILE "
            "(or --tls for the system's roots; ca_file or tls = true in a config)",
            TLS_MISMATCH,
        )
    if plaintext is not True and speaks == "tls-client-cert":
        return client_cert, TLS_MISMATCH
    return describe_rpc_error(e), FAILED

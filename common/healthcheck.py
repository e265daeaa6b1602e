"""``python -m common.healthcheck ADDRESS``: exit 0 when a daemon reports SERVING.

For container health checks and scripts: one standard gRPC health check
(``grpc.health.v1``) against ``ADDRESS`` (or the address in ``--addr-file``),
with the same TLS options as the CLI.  Exit status: 0 SERVING, 1 anything else
(unreachable, NOT_SERVING, TLS failure), 2 bad usage.

A container image's ``HEALTHCHECK`` line is fixed when the image is built, so
each TLS option also has an environment variable, read when the option is not
given: ``TXREPL_HEALTHCHECK_CA``, ``_CERT``, ``_KEY`` (mutual TLS),
``_SERVER_NAME`` (the name in the daemon's certificate: the check connects to
the address in the addr file, ``0.0.0.0:7400`` say) and ``_TLS=1`` (TLS with the
system's roots).  Set them on the container (compose ``environment:``) and the
image's own health check speaks TLS (deploy/docker, docs/operations.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# As in common/cli.py: grpc's own handshake logs would add lines under ours.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.config import ConfigError
from common.exits import rpc_failure
from common.security import ClientTls, add_client_args, client_channel, client_from_args

__all__ = ["check", "main"]


def check(
    address: str, service: str = "", timeout: float = 3.0, *, tls: ClientTls | None = None
) -> str:
    """The health status name of ``service`` at ``address`` (raises grpc.RpcError)."""
    with client_channel(address, tls) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.healthcheck", description=__doc__)
    p.add_argument("address", nargs="?", default="", help="host:port")
    p.add_argument("--addr-file", default="", help="read host:port from this file")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0)
    add_client_args(p)
    env = os.environ
    p.set_defaults(
        tls=env.get("TXREPL_HEALTHCHECK_TLS", "") not in ("", "0"),
        ca=env.get("TXREPL_HEALTHCHECK_CA", ""),
        cert=env.get("TXREPL_HEALTHCHECK_CERT", ""),
        key=env.get("TXREPL_HEALTHCHECK_KEY", ""),
        server_name=env.get("TXREPL_HEALTHCHECK_SERVER_NAME", ""),
    )
    args = p.parse_args(argv)
    address = args.address
    if args.addr_file:
        try:
            address = Path(args.addr_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            print(f"unhealthy: cannot read {args.addr_file}: {e.strerror}", file=sys.stderr)
            return 1
    if not address:
        p.error("give an ADDRESS or --addr-file")
    try:
        tls, _ = client_from_args(args)
        status = check(address, args.service, args.timeout, tls=tls)
    except ConfigError as e:  # an unreadable --ca/--cert/--key
        print(f"unhealthy: {e}", file=sys.stderr)
        return 1
    except grpc.RpcError as e:
        # Exit 1 whatever the cause (a container runtime knows only 0 and 1); the
        # line says what to fix when it is a TLS mismatch.
        print(f"unhealthy: {rpc_failure(e, plaintext=tls is None)[0]}", file=sys.stderr)
        return 1
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())

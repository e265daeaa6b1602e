"""Run the shell commands of the user documentation exactly as written.

What is run: every fenced block whose info string is ``sh``, ``bash``, ``shell`` or
``console`` in the documents given, in document order, in one session (a scratch
directory holding a copy of ``deploy/``, ``PATH`` starting with this interpreter's
``bin/``, no other substitution), so later blocks see the daemons and files earlier
ones made: README.md's tour starts the daemons, docs/operations.md's examples use them.

- A block whose first line is ``# not run by tests: REASON`` is skipped (systemd,
  docker, ``make test`` itself); the marker is visible in the rendered document.
- A line starting a daemon (``txrepl publisher run ...``, ``python -m subscriber run
  ...``: the reader runs it "in its own terminal") is started in the background as
  written; the next command waits until the daemon answers gRPC health on the address
  its config names, and a subscriber until every subscription is ``in_sync`` (what the
  tour tells the reader to wait for).  Every other run of lines goes to ``bash -e -o
  pipefail``: a command exiting non-zero fails its block and ends the session (later
  blocks depend on earlier ones).
- At the end every daemon gets SIGTERM; the documents promise a drain and exit 0.

``python -m tests.support.doccommands SCRATCH DOC...`` prints one JSON report.  The
pytest side (tests/integration/pair/test_doc_commands.py) runs it inside a private
network namespace (``unshare -rn``) when the kernel allows, so the documented fixed
ports (7400, 7401, 9464, 9465) never meet another test's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_INFO = {"sh", "bash", "shell", "console"}
SKIP_MARKER = "# not run by tests:"
DAEMON_LINE = re.compile(
    r"^\s*(?:\S*/)?(?:txrepl(?:\s+--\S+(?:\s+[^-\s]\S*)?)*|python3?\s+-m)\s+"
    r"(publisher|subscriber)\s+run\b"
)
# An indented (4-space) code line that looks like a command: the docs must fence it.
STRAY_COMMAND = re.compile(r"^ {4,}(?:txrepl|python3? -m|sqlite3|make|mkdir|systemctl|docker)\b")


@dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    text: str

    @property
    def skip_reason(self) -> str:
        first = self.text.lstrip("\n").splitlines()[0] if self.text.strip() else ""
        return first[len(SKIP_MARKER) :].strip() if first.startswith(SKIP_MARKER) else ""


@dataclass
class Result:
    doc: str
    line: int
    status: str  # "ok", "skipped", "failed", "not run"
    detail: str = ""
    seconds: float = 0.0
    output: str = ""  # what the block printed (stdout and stderr, the end of it)


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    daemons: dict[str, int | None] = field(default_factory=dict)  # command -> exit status
    stop_seconds: float = 0.0


def shell_blocks(doc: Path) -> list[Block]:
    """The fenced shell blocks of ``doc``, in order."""
    blocks: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(```+|~~~+)\s*(\S*)", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).lower(), i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if info in SHELL_INFO:
            blocks.append(Block(str(doc.relative_to(ROOT)), start + 1, "\n".join(body) + "\n"))
    return blocks


def stray_commands(doc: Path) -> list[str]:
    """Commands in indented code blocks (outside fences), which no test would run."""
    out: list[str] = []
    in_fence = ""
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        m = re.match(r"^(```+|~~~+)", line)
        if m and not in_fence:
            in_fence = m.group(1)
        elif in_fence and line.startswith(in_fence):
            in_fence = ""
        elif not in_fence and STRAY_COMMAND.match(line):
            out.append(f"{doc.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def _segments(text: str) -> list[tuple[str, str]]:
    """("daemon", line) for daemon starts, ("shell", lines) for the runs between them."""
    segs: list[tuple[str, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        if DAEMON_LINE.match(line):
            if "".join(pending).strip():
                segs.append(("shell", "\n".join(pending) + "\n"))
            pending = []
            segs.append(("daemon", line.strip()))
        else:
            pending.append(line)
    if "".join(pending).strip():
        segs.append(("shell", "\n".join(pending) + "\n"))
    return segs


@dataclass
class _Daemon:
    command: str
    kind: str
    address: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


class Session:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.env = dict(os.environ)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env.pop("PYTHONPATH", None)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.daemons: list[_Daemon] = []
        self.waiting: list[_Daemon] = []

    def start_daemon(self, line: str) -> None:
        kind = DAEMON_LINE.match(line).group(1)  # type: ignore[union-attr]
        m = re.search(r"--config\s+(\S+)", line)
        if m is None:
            raise RuntimeError(f"a daemon command without --config: {line}")
        cfg = tomllib.loads((self.scratch / m.group(1)).read_text())
        address = cfg.get("listen" if kind == "publisher" else "control_listen", "")
        log = self.scratch / f"{kind}-{len(self.daemons)}.log"
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {line}"],
                cwd=self.scratch,
                env=self.env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        d = _Daemon(line, kind, address, proc, log)
        self.daemons.append(d)
        self.waiting.append(d)

    def wait_daemons(self, timeout: float = 180.0) -> None:
        """Until each daemon started since the last wait is ready (see module doc)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from common.rpc import txrepl_pb2 as pb
        from common.rpc import txrepl_pb2_grpc as rpc

        for d in self.waiting:
            deadline = time.monotonic() + timeout
            while True:
                if d.proc.poll() is not None:
                    raise RuntimeError(
                        f"`{d.command}` exited with {d.proc.returncode}:\n{d.tail()}"
                    )
                try:
                    with grpc.insecure_channel(d.address) as ch:
                        serving = (
                            health_pb2_grpc.HealthStub(ch)
                            .Check(health_pb2.HealthCheckRequest(), timeout=2)
                            .status
                            == health_pb2.HealthCheckResponse.SERVING
                        )
                        if serving and d.kind == "subscriber":
                            subs = (
                                rpc.SubscriberControlStub(ch)
                                .Status(pb.StatusRequest(), timeout=5)
                                .subscriptions
                            )
                            serving = bool(subs) and all(s.state == "in_sync" for s in subs)
                except grpc.RpcError:
                    serving = False
                if serving:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"`{d.command}` not ready after {timeout:.0f}s:\n{d.tail()}")
                time.sleep(0.2)
        self.waiting = []

    def run_block(self, block: Block) -> Result:
        printed: list[str] = []
        try:
            for kind, text in _segments(block.text):
                if kind == "daemon":
                    self.start_daemon(text)
                    continue
                self.wait_daemons()
                out = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", text],
                    cwd=self.scratch,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                printed.append(out.stdout + out.stderr)
                if out.returncode != 0:
                    return Result(
                        block.doc,
                        block.line,
                        "failed",
                        f"exit {out.returncode} in:\n{text}stdout:\n{out.stdout[-2000:]}"
                        f"stderr:\n{out.stderr[-3000:]}",
                    )
            self.wait_daemons()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return Result(block.doc, block.line, "failed", str(e))
        return Result(block.doc, block.line, "ok", output="".join(printed)[-4000:])

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for d in reversed(self.daemons):  # the subscriber first: it drains into the target
            if d.proc.poll() is None:
                d.proc.send_signal(signal.SIGTERM)
                try:
                    d.proc.wait(90)
                except subprocess.TimeoutExpired:
                    os.killpg(d.proc.pid, signal.SIGKILL)
                    d.proc.wait(30)
            codes[d.command] = d.proc.returncode
        return codes


def run_docs(scratch: Path, docs: list[Path]) -> Report:
    """Run every shell block of ``docs`` in order in ``scratch`` (see the module doc)."""
    shutil.copytree(ROOT / "deploy", scratch / "deploy", dirs_exist_ok=True)
    session = Session(scratch)
    report = Report()
    failed = False
    try:
        for doc in docs:
            for block in shell_blocks(doc):
                if block.skip_reason:
                    report.results.append(Result(block.doc, block.line, "skipped"))
                elif failed:
                    report.results.append(Result(block.doc, block.line, "not run"))
                else:
                    t0 = time.monotonic()
                    result = session.run_block(block)
                    result.seconds = round(time.monotonic() - t0, 2)
                    report.results.append(result)
                    failed = result.status == "failed"
    finally:
        t0 = time.monotonic()
        report.daemons = session.stop()
        report.stop_seconds = round(time.monotonic() - t0, 2)
    return report


def main(argv: list[str]) -> int:
    scratch, docs = Path(argv[0]), [ROOT / d for d in argv[1:]]
    if os.environ.get("TXREPL_DOCTEST_NETNS"):
        # Inside `unshare -rn`: only a loopback, down until brought up.
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    def _terminate(signum: int, frame: object) -> None:
        raise SystemExit(f"doccommands: signal {signum}")  # run_docs stops its daemons

    signal.signal(signal.SIGTERM, _terminate)
    report = run_docs(scratch, docs)
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Configuration: strict validation with errors naming the file and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.backoff import Backoff
from common.config import ConfigError
from publisher.config import load_config as load_publisher
from subscriber.config import load_config as load_subscriber

PUB = """
server_name = "pub1"
source = "sqlite:///src.db"
listen = "127.0.0.1:7400"

[[publication]]
name = "shop"
tables = ["accounts"]
"""

SUB = """
server_name = "sub1"
target = "sqlite:///t.db"

[[subscription]]
publisher = "pub1"
address = "127.0.0.1:7400"
publication = "shop"
"""


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_valid_configs_load_with_defaults_and_relative_paths(tmp_path: Path) -> None:
    pub = load_publisher(_write(tmp_path, PUB))
    assert pub.publication[0].max_delta == 1_000_000
    assert pub.source_url.sqlite_path == tmp_path.resolve() / "src.db"
    sub = load_subscriber(_write(tmp_path, SUB, "s.toml"))
    assert sub.subscription[0].id == "pub1.shop"
    assert sub.spark.master == "local[2]"


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (PUB + "\nbogus = 1\n", "bogus", "unknown key"),
        (PUB.replace('listen = "127.0.0.1:7400"', 'listen = "nowhere"'), "", "not host:port"),
        (PUB + "\n[log]\nfsync = 'sometimes'\n", "log.fsync", "'sometimes' is not allowed"),
        (
            PUB.replace('name = "shop"', 'name = "shop"\nmax_delta = -1'),
            "publication[0]",
            "max_delta must be positive",
        ),
        (
            PUB.replace('name = "shop"', 'name = "shop"\nqueue_threshold = "many"'),
            "publication[0].queue_threshold",
            "expected an integer",
        ),
        (PUB.replace('server_name = "pub1"', ""), "server_name", "required key is missing"),
        (
            PUB.replace('server_name = "pub1"', 'server_name = "pub1"\ntrace_every = -1'),
            "",
            "trace_every must be 0 (off) or a positive N",
        ),
        (
            PUB.replace("sqlite:///src.db", "mariadb://root@127.0.0.1"),
            "source",
            "name the database",
        ),
    ],
)
def test_publisher_config_errors_name_file_and_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_publisher(path)
    assert str(path) in str(err.value)
    assert key in str(err.value)
    assert problem in str(err.value)


def test_subscriber_unknown_key_in_subscription(tmp_path: Path) -> None:
    path = _write(tmp_path, SUB + 'adress = "x"\n')
    with pytest.raises(ConfigError, match=r"subscription\[0\]\.adress: unknown key"):
        load_subscriber(path)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_subscriber(_write(tmp_path, "server_name = "))
    with pytest.raises(ConfigError, match="file not found"):
        load_subscriber(tmp_path / "absent.toml")


def test_environment_overrides(tmp_path: Path) -> None:
    from common.config import load_toml
    from subscriber.config import SubscriberConfig

    cfg = load_toml(
        SubscriberConfig,
        _write(tmp_path, SUB),
        environ={"TXREPL_SPARK__MASTER": "local[1]", "TXREPL_CONTROL_LISTEN": "127.0.0.1:9"},
    )
    assert cfg.spark.master == "local[1]"
    assert cfg.control_listen == "127.0.0.1:9"


def test_backoff_is_capped_and_jittered() -> None:
    b = Backoff(initial_s=0.5, max_s=4.0, multiplier=2.0, jitter=0.25)
    assert b.delay(1, 0.5) == pytest.approx(0.5)
    assert b.delay(3, 0.5) == pytest.approx(2.0)
    assert b.delay(30, 0.5) == pytest.approx(4.0)
    assert b.delay(30, 0.0) == pytest.approx(3.0)
    assert b.delay(30, 0.999) == pytest.approx(5.0, rel=0.01)


def test_backoff_section_loads_into_the_shared_backoff_value(tmp_path: Path) -> None:
    """[backoff] and its keys build a common.backoff.Backoff; a bad value names the section."""
    text = SUB.replace(
        "[[subscription]]", "[backoff]\ninitial_s = 0.1\nmax_s = 1.0\n\n[[subscription]]"
    )
    cfg = load_subscriber(_write(tmp_path, text))
    assert cfg.backoff == Backoff(initial_s=0.1, max_s=1.0)
    bad = SUB.replace("[[subscription]]", "[backoff]\njitter = 2\n\n[[subscription]]")
    with pytest.raises(ConfigError, match="backoff"):
        load_subscriber(_write(tmp_path, bad))


def test_subscriber_refuses_a_negative_trace_every(tmp_path: Path) -> None:
    """The subscriber's trace_every is checked as the publisher's (common.trace)."""
    bad = "trace_every = -1\n" + SUB
    with pytest.raises(ConfigError, match=r"trace_every must be 0 \(off\) or a positive N"):
        load_subscriber(_write(tmp_path, bad))


def test_daemon_refuses_bad_config_at_start(tmp_path: Path) -> None:
    """`txrepl publisher run` with an unknown key exits 2 naming the file and the key."""
    path = _write(tmp_path, "bogus = 1\n" + PUB)
    proc = subprocess.run(
        [sys.executable, "-m", "publisher", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{path}: bogus: unknown key" in proc.stderr


def test_example_configs_are_valid() -> None:
    """The annotated examples in deploy/examples/ load as they are."""
    root = Path(__file__).resolve().parents[3] / "deploy" / "examples"
    pub = load_publisher(root / "publisher.toml")
    sub = load_subscriber(root / "subscriber.toml")
    assert pub.publication[0].tables == ["accounts", "orders"]
    assert sub.subscription[0].publication == "shop"


def test_unrelated_txrepl_variables_are_ignored(tmp_path: Path) -> None:
    """TXREPL_BENCH_T and friends share the prefix but name no key: they are not overrides."""
    from common.config import load_toml
    from subscriber.config import SubscriberConfig

    cfg = load_toml(
        SubscriberConfig,
        _write(tmp_path, SUB),
        environ={"TXREPL_BENCH_T": "1000", "TXREPL_ADMIN_TOKEN": "x", "TXREPL_SERVER_NAME": "s9"},
    )
    assert cfg.server_name == "s9"


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ("\n[batch]\nmax_delay_ms = -5\n", "batch", "max_delay_ms must be between 0 and 60000"),
        ("\n[apply]\nspark_min_rows = -1\n", "apply", "spark_min_rows must not be negative"),
        ("\n[batch]\nack_interval_ms = -1\n", "batch", "ack_interval_ms must be between 0 and"),
        ('\n[batch]\nplan_ahead = "yes"\n', "batch.plan_ahead", "expected true or false"),
    ],
)
def test_subscriber_batch_and_apply_limits_are_checked(
    tmp_path: Path, extra: str, key: str, problem: str
) -> None:
    path = _write(tmp_path, SUB + extra)
    with pytest.raises(ConfigError) as err:
        load_subscriber(path)
    assert key in str(err.value)
    assert problem in str(err.value)


def test_subscriber_batch_and_apply_defaults(tmp_path: Path) -> None:
    sub = load_subscriber(_write(tmp_path, SUB))
    assert sub.batch.max_delay_ms == 0  # no longer used (issue 23)
    assert sub.batch.plan_ahead is True
    assert sub.batch.ack_interval_ms == 5  # coalesced acks (subscriber/stream.py)
    assert sub.apply.spark_min_rows == 10_000

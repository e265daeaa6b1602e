"""Typed, frozen configuration loaded from TOML, validated once at the entry point.

Each daemon declares its configuration as frozen dataclasses; :func:`load_toml`
reads a file into them.  Validation is strict: an unknown key, a missing
required key, a value of the wrong type or outside its allowed values fails with
:class:`ConfigError`, whose message names the file and the dotted key
(``subscriber.toml: subscription[0].address: ...``).

Environment overrides: ``TXREPL_<KEY>`` for top-level scalar keys and
``TXREPL_<SECTION>__<KEY>`` for keys of a top-level table, e.g.
``TXREPL_LISTEN=0.0.0.0:7400`` or ``TXREPL_SPARK__MASTER=spark://h:7077``.
Values are parsed as TOML scalars where possible (``10``, ``true``), else taken
as strings.  Components receive the resulting objects and never read
``os.environ`` themselves.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from common.errors import TxreplError

__all__ = ["ConfigError", "UnreadableFileError", "from_mapping", "load_toml", "parse_address"]

T = TypeVar("T")


class ConfigError(TxreplError):
    """Bad configuration: the message names the file and the key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


class UnreadableFileError(ConfigError):
    """A file named by a command-line option or a config key cannot be read."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(path, key, problem)
        self.args = (f"{key} {path!r}: {problem}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "table"
    if dataclasses.is_dataclass(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, source: str, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(
                source, key, f"{value!r} is not allowed; use one of {', '.join(map(repr, allowed))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, source, key)
            except ConfigError as e:
                errors.append(e.problem)
        raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
        (item,) = get_args(tp)[:1]
        items = [_convert(v, item, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a table, got {value!r}")
        _, vt = get_args(tp)
        return {str(k): _convert(v, vt, source, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a table, got {value!r}")
        return from_mapping(tp, value, source=source, prefix=key)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(source, key, f"expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(source, key, f"expected an integer, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(source, key, f"expected true or false, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(source, key, f"expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, str):
            return Path(value)
        raise ConfigError(source, key, f"expected a path string, got {value!r}")
    raise TypeError(f"unsupported config type {tp!r} at {key}")


def from_mapping(cls: type[T], data: Mapping[str, Any], *, source: str, prefix: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``data``, strictly."""
    assert dataclasses.is_dataclass(cls)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # TOML keys may use '-' or '_'; fields use '_'.
    normalised: dict[str, Any] = {}
    for raw_key, value in data.items():
        name = raw_key.replace("-", "_")
        dotted = f"{prefix}.{raw_key}" if prefix else raw_key
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(source, dotted, f"unknown key (known keys here: {known})")
        normalised[name] = _convert(value, hints[name], source, dotted)
    for name, f in fields.items():
        if name in normalised:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            dotted = f"{prefix}.{name}" if prefix else name
            raise ConfigError(source, dotted, "required key is missing")
    try:
        obj = cls(**normalised)
    except ValueError as e:  # __post_init__ checks
        raise ConfigError(source, prefix, str(e)) from None
    return obj


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_env(
    data: dict[str, Any], environ: Mapping[str, str], known: set[str] | None = None
) -> dict[str, Any]:
    """Overlay ``TXREPL_*`` variables; with ``known``, only those naming a known key.

    Variables for other purposes (``TXREPL_BENCH_T``, ``TXREPL_ADMIN_TOKEN``) share
    the prefix, so a variable whose first part names no key of this file is ignored.
    """
    out = dict(data)
    for name, text in environ.items():
        if not name.startswith("TXREPL_") or name in ("TXREPL_CONFIG",):
            continue
        path = name[len("TXREPL_") :].lower().split("__")
        if known is not None and path[0] not in known:
            continue
        if len(path) == 1:
            out[path[0]] = _env_value(text)
        elif len(path) == 2:
            section = dict(out.get(path[0], {}))
            section[path[1]] = _env_value(text)
            out[path[0]] = section
    return out


def load_toml(cls: type[T], path: str | Path, environ: Mapping[str, str] | None = None) -> T:
    """Load and validate ``cls`` from the TOML file at ``path`` plus environment overrides."""
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found") from None
    except OSError as e:
        raise ConfigError(source, "", f"cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "", f"not valid TOML: {e}") from None
    assert dataclasses.is_dataclass(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    data = apply_env(data, os.environ if environ is None else environ, known)
    # Relative paths in a config file are relative to the file.
    return from_mapping(cls, _with_base(data, p.parent.resolve()), source=source)


def _with_base(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(data)
    out.setdefault("config_dir", str(base))
    return out


def parse_address(text: str, *, field: str = "address") -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too); raise ValueError naming ``field``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{field}: {text!r} is not host:port")
    return host.strip("[]"), int(port)

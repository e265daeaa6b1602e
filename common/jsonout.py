"""One style for every ``--json`` output of the ``txrepl`` commands.

The style (docs/operations.md, "JSON output"):

- one JSON document on stdout, indented by 2, and nothing else on stdout (messages
  and errors go to stderr); the exit status is the same as without ``--json``;
- the top level is always an object (a list sits under a plural key, e.g.
  ``{"subscribers": [...]}``), so a field can be added without breaking a script;
- keys are the proto field names, snake_case (``lag_entries``, not ``lagEntries``);
  every field is present, zero values too;
- integers are JSON numbers, 64-bit ones included (protobuf's own JSON mapping
  writes those as strings); times are the proto's ``*_us`` integers (microseconds
  since the epoch, UTC); enums are their names; bytes are hex.

Rejected: protobuf's JSON mapping as is (camelCase keys, 64-bit numbers as strings:
``txrepl status --json`` already wrote numbers, and ``jq '.level > 5'`` on a string
is a silent wrong answer), and a bare top-level array (``errors list`` wrote one).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

__all__ = ["dump", "message_dict"]

_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def message_dict(msg: Message) -> dict[str, Any]:
    """``msg`` as a dict in the style above."""
    out: dict[str, Any] = MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    _fix(msg, out)
    return out


def _fix(msg: Message, out: dict[str, Any]) -> None:
    for field in msg.DESCRIPTOR.fields:
        if field.name not in out:
            continue
        value = getattr(msg, field.name)
        repeated = field.is_repeated
        if field.type in _INT64:
            out[field.name] = [int(v) for v in value] if repeated else int(value)
        elif field.type == FieldDescriptor.TYPE_BYTES:
            out[field.name] = [bytes(v).hex() for v in value] if repeated else bytes(value).hex()
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if repeated:
                for sub, d in zip(value, out[field.name], strict=True):
                    _fix(sub, d)
            else:
                _fix(value, out[field.name])


def dump(document: dict[str, Any] | Message, out: TextIO | None = None) -> None:
    """Print ``document`` (a dict or a proto message) as the command's JSON output."""
    data = message_dict(document) if isinstance(document, Message) else document
    print(json.dumps(data, indent=2), file=out or sys.stdout)

"""Canonical JSON for everything the controller group writes: commands, results and
snapshots.

Why JSON and not a struct layout: metadata changes are rare and small next to the data
path (a topic of 1,000 partitions is a few tens of KB), so the speed of a binary layout
buys nothing, while JSON can be read in a log dump or a snapshot file when something
goes wrong, and grows new optional fields without a new layout. Determinism comes from
the canonical form: keys sorted, no spaces, ASCII only, integers only (a float or NaN
would not round-trip exactly, so the reader refuses them), no duplicate keys. Equal
values therefore encode to equal bytes on every replica and every Python version.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class CodecError(ValueError):
    """Bytes that are not canonical controller JSON; the message says what is wrong."""


def dumps(value: object) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def loads(data: bytes) -> Any:
    try:
        return json.loads(
            data.decode("ascii"),
            object_pairs_hook=_no_duplicates,
            parse_float=_no_float,
            parse_constant=_no_float,
        )
    except CodecError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CodecError(f"not canonical JSON: {exc}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise CodecError("a key appears twice in one object")
    return out


def _no_float(text: str) -> Any:
    raise CodecError(f"{text} is not an integer; only integers are allowed")


def to_json(value: Any) -> Any:
    """Plain JSON values for a dataclass, enum, mapping, tuple or scalar."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, str):
        return str(value)  # a StrEnum member as its plain value
    assert value is None or isinstance(value, int), value
    return value


def from_json(tp: Any, value: Any, where: str) -> Any:
    """``value`` (plain JSON) as type ``tp``: a dataclass, ``int``, ``bool``, ``str``, a
    ``StrEnum``, ``X | None``, ``tuple[X, ...]`` or ``Mapping[str | int, X]`` (an int
    key is written as its decimal text). Raises
    ``TypeError`` naming ``where`` for anything else, so that nothing outside these
    shapes (an extra field, a bool for an int, an int past 64 bits) is ever applied."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints, names, required = _fields(tp)
        if not isinstance(value, dict) or not required <= value.keys() <= names:
            optional = sorted(names - required)
            also = f" and may have {', '.join(optional)}" if optional else ""
            raise TypeError(
                f"{where} needs the fields {', '.join(sorted(required))}{also}, and no other"
            )
        # A field with a default that is missing takes it: an entry written before the
        # field existed reads as it was applied then (every writer writes every field).
        return tp(**{n: from_json(hints[n], value[n], f"{where}.{n}") for n in value})
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value, where)
    if origin is tuple:
        item, _ = typing.get_args(tp)
        if not isinstance(value, list):
            raise TypeError(f"{where} must be a list")
        return tuple(from_json(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        key, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise TypeError(f"{where} must be an object")
        return {
            _key(key, k, where): from_json(item, v, f"{where}.{k}")
            for k, v in sorted(value.items())
        }
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where} must be an integer")
        if not INT64_MIN <= value <= INT64_MAX:
            raise TypeError(f"{where} must fit in 64 bits")
        return value
    if isinstance(tp, type) and issubclass(tp, str):
        if not isinstance(value, str):
            raise TypeError(f"{where} must be a string")
        try:
            return tp(value)  # a StrEnum refuses a value it does not have
        except ValueError:
            raise TypeError(f"{where}: {value!r} is not one of its values") from None
    raise AssertionError(f"no JSON reading for {tp!r} at {where}")


def _key(tp: Any, text: str, where: str) -> Any:
    """An object key read as ``tp``: ``str`` as is, ``int`` from canonical decimal."""
    if tp is str:
        return text
    assert tp is int, tp
    if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit()) or str(int(text)) != text:
        raise TypeError(f"{where}: key {text!r} is not an integer in canonical form")
    return int(text)


@functools.cache
def _fields(tp: type) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    """A dataclass's resolved field types, its field names and those without a default:
    resolving string annotations costs far more than reading a value, and a snapshot
    reads thousands of partitions."""
    fields = dataclasses.fields(tp)
    required = frozenset(
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return typing.get_type_hints(tp), frozenset(f.name for f in fields), required

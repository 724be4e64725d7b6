"""The headers a retried or dead-lettered record carries, and the names of the topics it
goes to: the one place both are defined (docs/clients.md, "Retries and dead letters").

Why headers: the retry and dead-letter topics hold the original key and value as they
were (never decoded or re-encoded), and everything the retrying consumer and
``raftmq dlq`` need to know about a record's history rides beside them, readable without
the payload. Names follow the house's header style (lowercase words joined by ``-``, as
``tag`` and ``deliver-at`` in docs/format.md); numbers and times are decimal ASCII, times
in ms since the epoch (as ``deliver-at``); text is UTF-8.

A record sent on carries the original record's other headers first, then these (any
earlier copies of them replaced), so a record's history is always exactly one set. A
retried record's due time is delayed delivery's own ``deliver-at`` header: the retrying
consumer sends it with ``deliver_at`` and checks it again before handling it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from raftmq.format import delay
from raftmq.limits import TOPIC_NAME_CHARS

ORIGINAL_TOPIC = "original-topic"
"""The topic the record was first consumed from (UTF-8)."""
ORIGINAL_PARTITION = "original-partition"
ORIGINAL_OFFSET = "original-offset"
ATTEMPTS = "attempts"
"""How many times the handler failed on the record so far (1 after the first failure)."""
FIRST_FAILURE_AT = "first-failure-at"
"""When the handler first failed on it (ms since the epoch)."""
LAST_ERROR = "last-error"
"""The last failure: the exception's type and message, ``Type: message``, at most
MAX_ERROR_CHARS characters."""
NAMES = (
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ATTEMPTS,
    FIRST_FAILURE_AT,
    LAST_ERROR,
)
MAX_ERROR_CHARS = 1024
"""Where ``last-error`` is cut: a traceback-sized message would make every retried record
that much larger."""
RETRY_SUFFIX = ".retry"
DEAD_LETTER_SUFFIX = ".dlq"
REPLAY_GROUP_SUFFIX = ".dlq-replay"
GROUP_ID_CHARS = 255

Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """A retried or dead-lettered record's history, as its headers hold it."""

    original_topic: str
    original_partition: int
    original_offset: int
    attempts: int
    first_failure_ms: int
    last_error: str

    def __post_init__(self) -> None:
        assert self.attempts >= 1, self.attempts
        assert self.original_partition >= 0 and self.original_offset >= 0, self


def retry_topic(topic: str, group_id: str) -> str:
    """Where ``group_id``'s failed records of ``topic`` wait for their next attempt. One
    per topic and group: two groups consuming one topic retry their own failures only."""
    return _named(topic, group_id, RETRY_SUFFIX)


def dead_letter_topic(topic: str, group_id: str) -> str:
    """Where ``group_id``'s records of ``topic`` go once they failed every attempt."""
    return _named(topic, group_id, DEAD_LETTER_SUFFIX)


def replay_group(group_id: str) -> str:
    """The consumer group whose committed offsets say how far ``raftmq dlq replay`` has
    sent ``group_id``'s dead letters back: a dead letter is replayed once."""
    name = f"{group_id}{REPLAY_GROUP_SUFFIX}"
    if len(name) > GROUP_ID_CHARS:
        raise ValueError(
            f"group {group_id[:60]}...'s replay group would be {len(name)} characters, over "
            f"the {GROUP_ID_CHARS} a group id may have"
        )
    return name


def _named(topic: str, group_id: str, suffix: str) -> str:
    name = f"{topic}.{group_id}{suffix}"
    if len(name) > TOPIC_NAME_CHARS:
        raise ValueError(
            f"the topic {name[:60]}... for the retries of topic {topic} in group {group_id} "
            f"would be {len(name)} characters, over the {TOPIC_NAME_CHARS} a topic name may "
            "have; use a shorter group id"
        )
    return name


def error_text(exc: BaseException) -> str:
    """What ``last-error`` says of ``exc``."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def encode(info: RetryInfo) -> list[tuple[str, bytes | None]]:
    """The headers that say ``info``."""
    return [
        (ORIGINAL_TOPIC, info.original_topic.encode()),
        (ORIGINAL_PARTITION, str(info.original_partition).encode()),
        (ORIGINAL_OFFSET, str(info.original_offset).encode()),
        (ATTEMPTS, str(info.attempts).encode()),
        (FIRST_FAILURE_AT, str(info.first_failure_ms).encode()),
        (LAST_ERROR, info.last_error.encode()),
    ]


SENT_ANEW = frozenset({*NAMES, delay.DELIVER_AT, *delay.INTERNAL_HEADERS})
"""What :func:`strip` drops: this module's headers and delayed delivery's, which a
delayed send sets itself (and refuses from the caller)."""


def strip(headers: Iterable[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """``headers`` without its history and delivery time: the record's own, as first
    produced."""
    return [(name, value) for name, value in headers if name not in SENT_ANEW]


def due_ms(headers: Headers) -> int | None:
    """When a retried record's next attempt is due: its ``deliver-at`` (ms since the
    epoch; the retrying consumer sends it with ``deliver_at``, and hands it to the handler
    no earlier). None when it has none; ValueError when it does not read."""
    found = {name: value for name, value in headers if name == delay.DELIVER_AT}
    return None if not found else _number(found, delay.DELIVER_AT)


def decode(headers: Headers) -> RetryInfo | None:
    """The history ``headers`` carry; None when they carry none (a record consumed for
    the first time). Raises ValueError, naming the header, when they carry some that
    does not read (written by something else than a retrying consumer)."""
    found = {name: value for name, value in headers if name in NAMES}
    if not found:
        return None
    missing = [n for n in NAMES if n not in found]
    if missing:
        raise ValueError(f"the record's retry headers lack {', '.join(missing)}")
    info = RetryInfo(
        _text(found, ORIGINAL_TOPIC),
        _number(found, ORIGINAL_PARTITION),
        _number(found, ORIGINAL_OFFSET),
        _number(found, ATTEMPTS, least=1),
        _number(found, FIRST_FAILURE_AT),
        _text(found, LAST_ERROR),
    )
    if not info.original_topic:
        raise ValueError(f"the record's {ORIGINAL_TOPIC} header is empty")
    return info


def _text(found: dict[str, bytes | None], name: str) -> str:
    value = found[name]
    if value is None:
        raise ValueError(f"the record's {name} header is null")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ValueError(f"the record's {name} header is not UTF-8 text") from None


def _number(found: dict[str, bytes | None], name: str, *, least: int = 0) -> int:
    text = _text(found, name)
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise ValueError(
            f"the record's {name} header is {text[:40]!r}, not a whole number of at least {least}"
        )
    return int(text)

"""The options of the ``raftmq`` Spark source, parsed once and checked with errors a person
can act on. Pure Python (no pyspark import), so the parsing is tested without a JVM.

The names follow Spark's Kafka source, so a Kafka pipeline ports by changing the format
name and the broker list: ``bootstrap`` (or ``kafka.bootstrap.servers``), ``subscribe`` /
``subscribePattern`` / ``assign``, ``startingOffsets`` / ``endingOffsets`` (``earliest``,
``latest`` or JSON ``{"topic": {"0": 42}}`` with -2 for earliest and -1 for latest),
``startingTimestamp``, ``maxOffsetsPerTrigger``, ``minPartitions``, ``failOnDataLoss``,
``includeHeaders``, ``kafka.isolation.level`` (or ``isolationLevel``); plus
``readFromReplicas``, ``fetchMaxBytes`` and ``tagFilter`` (a tag expression,
docs/tags.md: only the records whose tags match it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from raftmq.client.connections import SecuritySettings
from raftmq.client.sasl import client_security
from raftmq.format import tag_filter

EARLIEST = -2
"""In offset JSON, as in Kafka: the partition's first offset still held."""
LATEST = -1
"""In offset JSON, as in Kafka: the partition's high watermark (its committed end)."""

DEFAULT_FETCH_BYTES = 8 << 20
MAX_FETCH_BYTES = 64 << 20  # the broker's Fetch.max_bytes limit (broker.proto)

KNOWN = {
    "bootstrap": "broker addresses host:port, comma-separated",
    "kafka.bootstrap.servers": "the same as bootstrap (the Kafka source's name)",
    "subscribe": "topics, comma-separated",
    "subscribepattern": "a regular expression topics must match in full",
    "assign": 'JSON {"topic": [0, 1]}: exactly these partitions',
    "startingoffsets": 'earliest, latest or JSON {"topic": {"0": 42}} (-2 earliest, -1 latest)',
    "endingoffsets": 'batch only: latest or JSON {"topic": {"0": 42}} (-1 latest)',
    "startingtimestamp": "ms since the epoch: start at the first record at or after it",
    "maxoffsetspertrigger": "streaming: at most this many records per micro-batch",
    "minpartitions": "split partitions into offset ranges to make at least this many tasks",
    "failondataloss": "true (default) or false: fail when retention deleted offsets to read",
    "readfromreplicas": "true or false (default): spread reads over follower replicas",
    "includeheaders": "true or false (default): add the headers column",
    "fetchmaxbytes": f"bytes per Fetch, at most {MAX_FETCH_BYTES} (default {DEFAULT_FETCH_BYTES})",
    "isolationlevel": "read_uncommitted (default) or read_committed: only committed "
    "transactions' records, up to each partition's last stable offset",
    "kafka.isolation.level": "the same as isolationLevel (the Kafka consumer's name)",
    "tagfilter": "a tag expression (docs/tags.md), e.g. paid && (eu || us): only records "
    "whose tags match it; the brokers send only the batches that may hold one",
    "ssl_cafile": "TLS: the CA file that signed the brokers' certificates (docs/security.md)",
    "ssl_certfile": "TLS: the client certificate, for brokers that require one",
    "ssl_keyfile": "TLS: the key of ssl_certfile",
    "sasl_mechanism": "authentication: SCRAM-SHA-256 or OAUTHBEARER (docs/security.md)",
    "sasl_username": "SCRAM-SHA-256: the user",
    "sasl_password": "SCRAM-SHA-256: the password",
    "sasl_oauth_token": "OAUTHBEARER: the bearer token",
}
SASL_OPTIONS = ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_oauth_token")

OffsetSpec = str | dict[str, dict[int, int]]
"""``"earliest"``, ``"latest"``, or topic -> partition -> offset (EARLIEST/LATEST allowed)."""


class SourceError(ValueError):
    """Anything the raftmq source refuses or cannot do, in a sentence that says what to fix.
    Spark shows it as the cause of the query's failure."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    bootstrap: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    starting_offsets: OffsetSpec | None = None  # None: earliest for batch, latest for streams
    ending_offsets: OffsetSpec | None = None
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    read_from_replicas: bool = False
    include_headers: bool = False
    fetch_max_bytes: int = DEFAULT_FETCH_BYTES
    read_committed: bool = False
    """Read up to the last stable offset and drop aborted transactions' records."""
    tag_filter: str = ""
    """A tag expression (checked by parsing it here); empty: every record."""
    tls: tuple[str | None, str | None, str | None] = (None, None, None)
    """ssl_cafile, ssl_certfile, ssl_keyfile (all None: plaintext)."""
    sasl: tuple[tuple[str, str], ...] = ()
    """The sasl_ options given (none: the calls carry no credentials)."""

    def client_tls(self) -> SecuritySettings:
        """The TLS and authentication keyword settings of this query's clients."""
        ca, cert, key = self.tls
        settings = SecuritySettings(ssl_cafile=ca, ssl_certfile=cert, ssl_keyfile=key)
        settings.update(dict(self.sasl))  # type: ignore[typeddict-item]
        return settings

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is one this query reads (assign is checked per partition)."""
        if self.subscribe:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return any(t == topic for t, _ in self.assign)


def parse_options(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check every option; raise SourceError naming the option, the value and what is valid."""
    opts = {k.lower(): v for k, v in raw.items()}
    unknown = sorted(k for k in opts if k not in KNOWN and k != "path")
    if unknown:
        listing = "; ".join(f"{k}: {v}" for k, v in KNOWN.items())
        raise SourceError(
            f"unknown raftmq option(s) {', '.join(unknown)}. Known options: {listing}"
        )
    if "path" in opts:
        raise SourceError("the raftmq source takes no path: name topics with subscribe")
    bootstrap = _bootstrap(opts)
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k, "").strip()]
    if len(chosen) != 1:
        raise SourceError(
            "give exactly one of subscribe (topics, comma-separated), subscribePattern (a "
            f"regular expression) or assign (JSON); got {', '.join(chosen) or 'none'}"
        )
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign: tuple[tuple[str, int], ...] = ()
    if "subscribe" in chosen:
        names = (t.strip() for t in opts["subscribe"].split(","))
        subscribe = tuple(dict.fromkeys(t for t in names if t))
    elif "subscribepattern" in chosen:
        pattern = opts["subscribepattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SourceError(
                f"subscribePattern {pattern!r} is not a regular expression: {exc}"
            ) from None
    else:
        assign = _assign(opts["assign"])
    if streaming and "endingoffsets" in opts:
        raise SourceError("endingOffsets is for batch queries; a stream reads on as data comes")
    if not streaming and "maxoffsetspertrigger" in opts:
        raise SourceError("maxOffsetsPerTrigger is for streaming queries (readStream)")
    starting = _offsets("startingOffsets", opts.get("startingoffsets"), ending=False)
    ending = _offsets("endingOffsets", opts.get("endingoffsets"), ending=True)
    if starting == "latest" and not streaming:
        raise SourceError("startingOffsets=latest makes an empty batch query; use earliest or JSON")
    if ending == "earliest":
        raise SourceError("endingOffsets=earliest makes an empty query; use latest or JSON")
    timestamp = _int("startingTimestamp", opts.get("startingtimestamp"), minimum=0)
    if timestamp is not None and starting is not None:
        raise SourceError("give startingOffsets or startingTimestamp, not both")
    tls = (opts.get("ssl_cafile"), opts.get("ssl_certfile"), opts.get("ssl_keyfile"))
    if (tls[1] is None) != (tls[2] is None):
        raise SourceError("ssl_certfile and ssl_keyfile go together: give both or neither")
    sasl = tuple((k, opts[k]) for k in SASL_OPTIONS if k in opts)
    try:
        client_security(*tls, **dict(sasl))
    except ValueError as exc:
        raise SourceError(str(exc)) from None
    return ReadOptions(
        tls=tls,
        sasl=sasl,
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp_ms=timestamp,
        max_offsets_per_trigger=_int(
            "maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger"), minimum=1
        ),
        min_partitions=_int("minPartitions", opts.get("minpartitions"), minimum=1),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), True),
        read_from_replicas=_bool("readFromReplicas", opts.get("readfromreplicas"), False),
        include_headers=_bool("includeHeaders", opts.get("includeheaders"), False),
        fetch_max_bytes=_int(
            "fetchMaxBytes", opts.get("fetchmaxbytes"), minimum=1, maximum=MAX_FETCH_BYTES
        )
        or DEFAULT_FETCH_BYTES,
        read_committed=_isolation(opts),
        tag_filter=_tag_filter(opts.get("tagfilter")),
    )


def _tag_filter(raw: str | None) -> str:
    if raw is None or not raw.strip():
        return ""
    try:
        tag_filter.parse(raw)
    except tag_filter.TagFilterError as exc:
        raise SourceError(f"tagFilter: {exc}") from None
    return raw


def _isolation(opts: dict[str, str]) -> bool:
    given = {k: opts[k].strip() for k in ("isolationlevel", "kafka.isolation.level") if k in opts}
    if len(set(given.values())) > 1:
        raise SourceError("isolationLevel and kafka.isolation.level disagree; give one of them")
    value = next(iter(given.values()), "read_uncommitted")
    if value not in ("read_uncommitted", "read_committed"):
        raise SourceError(
            f"isolationLevel must be read_uncommitted or read_committed, not {value!r}"
        )
    return value == "read_committed"


def wants_headers(raw: Mapping[str, str]) -> bool:
    """includeHeaders alone: the schema depends on it before the rest is parsed."""
    value = next((v for k, v in raw.items() if k.lower() == "includeheaders"), None)
    return _bool("includeHeaders", value, False)


_ADDRESS = re.compile(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}")


def _bootstrap(opts: dict[str, str]) -> tuple[str, ...]:
    raw = opts.get("bootstrap") or opts.get("kafka.bootstrap.servers") or ""
    addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not addresses:
        raise SourceError(
            "option bootstrap is required: broker addresses host:port, comma-separated "
            "(e.g. 127.0.0.1:9091; `raftmq status` lists them)"
        )
    bad = [a for a in addresses if not _ADDRESS.fullmatch(a)]
    if bad:
        raise SourceError(f"bootstrap address {bad[0]!r} is not host:port")
    return addresses


def _assign(raw: str) -> tuple[tuple[str, int], ...]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SourceError(f'assign must be JSON like {{"topic": [0, 1]}}: {exc}') from None
    ok = isinstance(parsed, dict) and all(
        isinstance(v, list) and all(isinstance(p, int) and p >= 0 for p in v)
        for v in parsed.values()
    )
    if not ok or not parsed:
        raise SourceError(f'assign must be JSON like {{"topic": [0, 1]}}, got {raw!r}')
    return tuple((t, p) for t, parts in parsed.items() for p in sorted(set(parts)))


def _offsets(name: str, raw: str | None, *, ending: bool) -> OffsetSpec | None:
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    example = f'{name} is earliest, latest or JSON like {{"topic": {{"0": 42, "1": -2}}}}'
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise SourceError(f"{example}; got {raw!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise SourceError(f"{example}; got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise SourceError(f"{example}; topic {topic!r} maps to {parts!r}")
        out[topic] = {}
        for key, offset in parts.items():
            if not (isinstance(key, str) and key.isdigit()) or not isinstance(offset, int):
                raise SourceError(f"{example}; {topic!r}: {key!r}: {offset!r} is not that")
            if offset < EARLIEST or (ending and offset == EARLIEST):
                raise SourceError(
                    f"{name} gives {offset} for {topic}/{key}: use an offset >= 0, -1 (latest)"
                    + ("" if ending else " or -2 (earliest)")
                )
            out[topic][int(key)] = offset
    return out


def _int(name: str, raw: str | None, *, minimum: int, maximum: int | None = None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise SourceError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise SourceError(f"{name} must be at least {minimum}{upper}, got {value}")
    return value


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise SourceError(f"{name} must be true or false, got {raw!r}")
    return value == "true"

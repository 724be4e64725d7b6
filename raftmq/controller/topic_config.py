"""Per-topic settings: their names (Kafka's), types, bounds and defaults, checked in one
place for topic creation and ``alter``.

A topic stores only the keys an operator set (its overrides, as canonical strings), as
Kafka does; :func:`resolve` fills in the defaults. The defaults and bounds of the log's
own settings are :class:`~raftmq.log.config.LogConfig`'s, so a config this module accepts
is one a log opens with, and :attr:`TopicConfig.log_config` hands it over. Why strings on
the wire: they are what an operator types (``--config retention.ms=3600000``), and one
canonical text per value keeps equal configs byte-equal in snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from raftmq.format.delay import DEFAULT_MAX_DELAY_MS, MAX_DELIVERY_DELAY_MS
from raftmq.log.config import FlushPolicy, LogConfig

MAX_CONFIG_VALUE_CHARS = 64

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
SEGMENT_BYTES = "segment.bytes"
SEGMENT_MS = "segment.ms"
MAX_MESSAGE_BYTES = "max.message.bytes"
FLUSH_POLICY = "flush.policy"
FLUSH_INTERVAL_MS = "flush.interval.ms"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
DELIVERY_MAX_DELAY_MS = "delivery.max.delay.ms"

LOG_FIELDS = {
    RETENTION_MS: "retention_ms",
    RETENTION_BYTES: "retention_bytes",
    SEGMENT_BYTES: "segment_bytes",
    SEGMENT_MS: "segment_ms",
    MAX_MESSAGE_BYTES: "max_message_bytes",
    FLUSH_POLICY: "flush_policy",
    FLUSH_INTERVAL_MS: "flush_interval_ms",
}
"""Topic keys that are log settings, and the LogConfig field each one sets."""

KEYS = (*LOG_FIELDS, MIN_INSYNC_REPLICAS, DELIVERY_MAX_DELAY_MS)
"""Every key a topic accepts; anything else is refused."""


class ConfigError(ValueError):
    """A key or value a topic cannot take; the message names it and says what is allowed."""


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's settings with every default filled in."""

    log_config: LogConfig
    """The settings a replica opens this topic's partition logs with."""
    min_insync_replicas: int = 1
    delivery_max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    """The longest delay a delayed message to this topic may have
    (docs/delayed-delivery.md); further ahead is refused with DELAY_TOO_LONG."""


def canonical(overrides: Mapping[str, str], replication_factor: int) -> dict[str, str]:
    """The overrides checked and in canonical text (``"0010"`` becomes ``"10"``).

    Raises :class:`ConfigError` for an unknown key, a value of the wrong type or out of
    bounds, or a combination the log refuses; ``min.insync.replicas`` must not exceed
    ``replication_factor``, or no write could ever be acknowledged."""
    out: dict[str, str] = {}
    for key in sorted(overrides):
        value = overrides[key]
        if key not in KEYS:
            raise ConfigError(f"{key!r} is not a topic setting; the settings are {', '.join(KEYS)}")
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_CONFIG_VALUE_CHARS:
            raise ConfigError(f"{key} needs a value of 1 to {MAX_CONFIG_VALUE_CHARS} characters")
        if key == FLUSH_POLICY:
            if value not in {p.value for p in FlushPolicy}:
                choices = ", ".join(p.value for p in FlushPolicy)
                raise ConfigError(f"{key} must be one of {choices}, got {value!r}")
            out[key] = value
            continue
        # int() accepts "1_000" and " 7"; a config value is plain decimal digits only
        digits = value[1:] if value.startswith("-") else value
        if not digits.isascii() or not digits.isdigit():
            raise ConfigError(f"{key} must be a whole number, got {value!r}")
        out[key] = str(int(value))
    resolve(out, replication_factor)
    return out


def resolve(overrides: Mapping[str, str], replication_factor: int) -> TopicConfig:
    """The full settings for canonical ``overrides``; raises :class:`ConfigError` if
    they do not hold together."""
    log_values: dict[str, object] = {}
    for key, field in LOG_FIELDS.items():
        if key in overrides:
            value = overrides[key]
            log_values[field] = FlushPolicy(value) if key == FLUSH_POLICY else int(value)
    try:
        log_config = dataclasses.replace(LogConfig(), **log_values)  # type: ignore[arg-type]
    except ValueError as exc:
        # LogConfig names its fields (segment_bytes); the operator typed segment.bytes
        message = str(exc)
        for key, field in LOG_FIELDS.items():
            message = message.replace(field, key)
        raise ConfigError(message) from None
    min_insync = int(overrides.get(MIN_INSYNC_REPLICAS, "1"))
    if not 1 <= min_insync <= replication_factor:
        raise ConfigError(
            f"{MIN_INSYNC_REPLICAS} must be from 1 to the replication factor "
            f"({replication_factor}), got {min_insync}"
        )
    max_delay_ms = int(overrides.get(DELIVERY_MAX_DELAY_MS, str(DEFAULT_MAX_DELAY_MS)))
    if not 0 <= max_delay_ms <= MAX_DELIVERY_DELAY_MS:
        raise ConfigError(
            f"{DELIVERY_MAX_DELAY_MS} must be from 0 (no delayed messages) to "
            f"{MAX_DELIVERY_DELAY_MS} (10 years), got {max_delay_ms}"
        )
    return TopicConfig(log_config, min_insync, max_delay_ms)

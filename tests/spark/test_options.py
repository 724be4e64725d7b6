"""The Spark source's option parsing and offset arithmetic, without Spark or brokers."""

from __future__ import annotations

import itertools

import pytest

from raftmq.spark.options import EARLIEST, LATEST, SourceError, parse_options
from raftmq.spark.planning import OffsetRange, apportion, from_json, split_ranges, to_json

BASE = {"bootstrap": "127.0.0.1:9091", "subscribe": "a,b"}


def test_defaults_and_kafka_names():
    opts = parse_options(
        {"kafka.bootstrap.servers": "h1:1,h2:2", "subscribe": "a, b ,a", "failOnDataLoss": "FALSE"},
        streaming=True,
    )
    assert opts.bootstrap == ("h1:1", "h2:2")
    assert opts.subscribe == ("a", "b")
    assert opts.fail_on_data_loss is False
    assert opts.starting_offsets is None and not opts.include_headers


def test_offset_json_and_assign():
    opts = parse_options(
        {
            "bootstrap": "h:1",
            "assign": '{"a": [1, 0]}',
            "startingOffsets": '{"a": {"0": -2, "1": 7}}',
            "endingOffsets": '{"a": {"0": -1}}',
        },
        streaming=False,
    )
    assert opts.assign == (("a", 0), ("a", 1))
    assert opts.starting_offsets == {"a": {0: EARLIEST, 1: 7}}
    assert opts.ending_offsets == {"a": {0: LATEST}}
    assert opts.wants("a") and not opts.wants("b")


@pytest.mark.parametrize(
    ("extra", "streaming", "message"),
    [
        ({"bootstrap": ""}, False, "bootstrap is required"),
        ({"bootstrap": "nohost"}, False, "not host:port"),
        ({"subscribePattern": "x"}, False, "exactly one of subscribe"),
        ({"startingOffset": "earliest"}, False, "unknown raftmq option"),
        ({"startingOffsets": "soonest"}, False, "earliest, latest or JSON"),
        ({"startingOffsets": '{"a": {"x": 1}}'}, False, "is not that"),
        ({"startingOffsets": '{"a": {"0": -3}}'}, False, "use an offset >= 0"),
        ({"endingOffsets": '{"a": {"0": -2}}'}, False, "use an offset >= 0"),
        ({"startingOffsets": "latest"}, False, "empty batch query"),
        ({"endingOffsets": "latest"}, True, "endingOffsets is for batch"),
        ({"maxOffsetsPerTrigger": "10"}, False, "for streaming queries"),
        ({"maxOffsetsPerTrigger": "0"}, True, "at least 1"),
        ({"minPartitions": "many"}, False, "whole number"),
        ({"failOnDataLoss": "yes"}, False, "true or false"),
        ({"fetchMaxBytes": str(65 << 20)}, False, "at most"),
        ({"startingTimestamp": "5", "startingOffsets": "earliest"}, False, "not both"),
    ],
)
def test_bad_options_are_named(extra, streaming, message):
    with pytest.raises(SourceError, match=message):
        parse_options({**BASE, **extra}, streaming=streaming)


def test_split_ranges_makes_at_least_min_partitions_in_order():
    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 10, 13), OffsetRange("t", 2, 5, 5)]
    out = split_ranges([r for r in ranges if r.size], 7)
    assert len(out) >= 7
    for p in (0, 1):
        pieces = [r for r in out if r.partition == p]
        assert pieces[0].start == ranges[p].start and pieces[-1].end == ranges[p].end
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        assert all(r.size > 0 for r in pieces)
    assert split_ranges(ranges, None) == ranges


def test_apportion_respects_the_limit_and_moves():
    begin = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    upto = {("t", 0): 1000, ("t", 1): 110, ("t", 2): 5}
    capped = apportion(begin, upto, 101)
    assert sum(capped[k] - begin[k] for k in begin) == 101
    assert all(begin[k] <= capped[k] <= upto[k] for k in begin)
    one = apportion(begin, upto, 1)
    assert sum(one[k] - begin[k] for k in begin) == 1
    assert apportion(begin, upto, 10_000) == upto


def test_offsets_json_round_trip_uses_string_keys():
    offsets = {("a", 0): 5, ("a", 10): 7, ("b", 1): 0}
    assert to_json(offsets) == {"a": {"0": 5, "10": 7}, "b": {"1": 0}}
    assert from_json(to_json(offsets)) == offsets


def test_readers_pickle_without_their_channels():
    """Spark pickles readers to its workers: only options travel, channels are reopened."""
    import pickle

    from raftmq.spark.source import RaftmqStreamReader

    reader = RaftmqStreamReader(parse_options(BASE, streaming=True))
    assert reader.planner.client is not None  # opened (lazily; nothing is dialled yet)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options and copy.planner._client is None
    reader.stop()


def test_tls_options_reach_the_clients():
    """ssl_cafile, ssl_certfile and ssl_keyfile (Kafka's names) become the clients' TLS
    settings; a certificate without its key is refused in a sentence."""
    base = {"bootstrap": "h:1", "subscribe": "t"}
    plain = parse_options(base, streaming=False)
    assert plain.client_tls() == {"ssl_cafile": None, "ssl_certfile": None, "ssl_keyfile": None}
    tls = {"ssl_cafile": "ca.pem", "ssl_certfile": "c.pem", "ssl_keyfile": "k.pem"}
    opts = parse_options({**base, **tls}, streaming=True)
    assert opts.client_tls() == tls
    with pytest.raises(SourceError, match="ssl_certfile and ssl_keyfile go together"):
        parse_options({**base, "ssl_certfile": "c.pem"}, streaming=False)


def test_sasl_options_become_the_clients_credentials() -> None:
    """sasl_mechanism and its credentials (Kafka's names) reach every client; settings
    that do not go together are refused with the client's own sentence."""
    base = {"bootstrap": "b:1", "subscribe": "t"}
    scram = {"sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u", "sasl_password": "p"}
    settings = parse_options({**base, **scram}, streaming=False).client_tls()
    assert {k: settings.get(k) for k in scram} == scram
    with pytest.raises(SourceError, match="needs sasl_oauth_token"):
        parse_options({**base, "sasl_mechanism": "OAUTHBEARER"}, streaming=False)

"""Placement runs when a CreateTopic or AddPartitions entry is applied, so the entry names
the version of the rules it is applied with: a voter replaying an entry written before the
rules changed places as the voters that applied it first did (raftmq/controller/
commands.py, PLACEMENT_RULES)."""

from __future__ import annotations

from collections import Counter

from raftmq.controller import codec
from raftmq.controller.commands import (
    PLACEMENT_RULES,
    AddPartitions,
    CreateTopic,
    Refused,
    TopicCreated,
    encode,
)
from raftmq.controller.errors import RefusalCode as Code
from tests.controller.machine import Driver

RACKS = {
    8: "rack0",
    6: "rack1",
    5: "rack2",
    3: "rack3",
    2: "rack0",
    4: "rack1",
    7: "rack2",
    1: "rack3",
}
"""8 brokers in 4 racks of 2: the greedy pass alone gives one broker 3 replicas of 8
partitions of 2, and another 1 (tests/controller/test_placement.py)."""


def _cluster() -> Driver:
    d = Driver()
    for broker_id, rack in RACKS.items():
        d.register(broker_id, rack)
    return d


def _spread(replicas: tuple[tuple[int, ...], ...]) -> int:
    counts = Counter(b for r in replicas for b in r)
    return max(counts.get(b, 0) for b in RACKS) - min(counts.get(b, 0) for b in RACKS)


def test_an_entry_without_the_field_is_applied_with_the_first_rules() -> None:
    data = encode(CreateTopic("t", 8, 2))
    old = codec.loads(data)
    del old["args"]["placement"]  # as written before the field existed
    result = _cluster().raw(codec.dumps(old))
    assert isinstance(result, TopicCreated)
    assert _spread(result.replicas) == 2  # the greedy pass alone, as it was applied then


def test_a_new_entry_is_applied_with_the_current_rules() -> None:
    assert PLACEMENT_RULES == 2
    result = _cluster()(CreateTopic("t", 8, 2, placement=PLACEMENT_RULES))
    assert isinstance(result, TopicCreated)
    assert _spread(result.replicas) <= 1


def test_rules_this_version_does_not_know_are_refused() -> None:
    d = _cluster()
    result = d(CreateTopic("t", 8, 2, placement=PLACEMENT_RULES + 1))
    assert isinstance(result, Refused) and result.code == Code.MALFORMED_COMMAND.value
    assert isinstance(d(CreateTopic("t", 1, 2, placement=PLACEMENT_RULES)), TopicCreated)
    result = d(AddPartitions("t", 2, placement=0))
    assert isinstance(result, Refused) and result.code == Code.MALFORMED_COMMAND.value


def test_the_codec_fills_a_missing_defaulted_field_and_refuses_the_rest() -> None:
    data = codec.loads(encode(AddPartitions("t", 3, placement=2)))["args"]
    del data["placement"]
    assert codec.from_json(AddPartitions, data, "cmd") == AddPartitions("t", 3, placement=1)
    for broken in ({"name": "t"}, {"name": "t", "count": 3, "extra": 1}):
        try:
            codec.from_json(AddPartitions, broken, "cmd")
        except TypeError as exc:
            assert "needs the fields count, name and may have placement, and no other" in str(exc)
        else:
            raise AssertionError(f"{broken} was read")

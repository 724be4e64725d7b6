"""Client quotas in the controller's metadata: AlterClientQuotas applied or refused whole,
entities deleted with their last value, snapshots carrying them, and Kafka's order of
precedence for which entity's quota applies to a caller."""

from __future__ import annotations

from raftmq.controller import commands as c
from raftmq.controller.errors import RefusalCode
from raftmq.controller.model import ClientQuota
from raftmq.controller.quotas import DEFAULT, MAX_CLIENT_QUOTAS, index, resolve
from raftmq.controller.state_machine import MetadataStateMachine, decode_snapshot

P, F, R = "producer_byte_rate", "consumer_byte_rate", "request_percentage"


def _alter(machine: MetadataStateMachine, *alterations: c.QuotaAlteration) -> c.Result:
    return c.decode_result(
        machine.apply(machine.version + 1, c.encode(c.AlterClientQuotas(alterations)))
    )


def test_set_merge_remove_and_delete_an_entity() -> None:
    m = MetadataStateMachine("q")
    assert _alter(m, c.QuotaAlteration("alice", "", {P: 1000})).ok
    assert _alter(
        m, c.QuotaAlteration("alice", "", {F: 2000}), c.QuotaAlteration("", "app", {R: 5})
    )
    assert m.state.client_quotas == (
        ClientQuota("", "app", {R: 5}),
        ClientQuota("alice", "", {F: 2000, P: 1000}),
    )
    assert _alter(m, c.QuotaAlteration("alice", "", removals=(P,))).ok
    assert _alter(m, c.QuotaAlteration("", "app", removals=(R, P))).ok  # P was never set
    assert m.state.client_quotas == (ClientQuota("alice", "", {F: 2000}),)
    restored = decode_snapshot(m.snapshot())
    assert restored.client_quotas == m.state.client_quotas


def test_bad_alterations_are_refused_whole() -> None:
    m = MetadataStateMachine("q")
    cases = [
        c.QuotaAlteration("", "", {P: 1}),  # names nothing
        c.QuotaAlteration("alice", "", {"producer.byte.rate": 1}),  # not Kafka's key
        c.QuotaAlteration("alice", "", {P: 0}),
        c.QuotaAlteration("alice", "", {R: 101}),
        c.QuotaAlteration("alice", "", {P: 5}, (P,)),
        c.QuotaAlteration("", "bad\nid", {P: 5}),
        c.QuotaAlteration("x" * 256, "", {P: 5}),
    ]
    for bad in cases:
        result = _alter(m, c.QuotaAlteration("bob", "", {P: 1}), bad)
        assert isinstance(result, c.Refused) and result.code == RefusalCode.INVALID_CLIENT_QUOTA
        assert m.state.client_quotas == ()  # the good one before it did not apply either


def test_the_count_is_bounded() -> None:
    m = MetadataStateMachine("q")
    many = tuple(c.QuotaAlteration(f"u{i}", "", {P: 1}) for i in range(1000))
    for start in range(0, MAX_CLIENT_QUOTAS, 1000):
        batch = tuple(c.QuotaAlteration(f"u{start + i}", "", {P: 1}) for i in range(1000))
        assert _alter(m, *batch).ok
    result = _alter(m, c.QuotaAlteration("one-more", "", {P: 1}))
    assert isinstance(result, c.Refused) and result.code == RefusalCode.TOO_MANY_CLIENT_QUOTAS
    assert _alter(m, c.QuotaAlteration("u0", "", {P: 7})).ok  # changing one still works
    assert _alter(m, *many[:1]).ok


def test_kafka_order_of_precedence() -> None:
    entities = [
        ("alice", "app"),
        ("alice", DEFAULT),
        ("alice", ""),
        (DEFAULT, "app"),
        (DEFAULT, DEFAULT),
        (DEFAULT, ""),
        ("", "app"),
        ("", DEFAULT),
    ]
    quotas = {e: {P: rank} for rank, e in enumerate(entities)}
    for rank, entity in enumerate(entities):
        # With every entity from this rank down configured, this one wins.
        found = resolve(dict(list(quotas.items())[rank:]), P, "alice", "app")
        assert found is not None and found[0] == rank, entity
    # The share names the caller's own parts where the entity names a part at all.
    shares = [resolve(dict([item]), P, "alice", "app") for item in quotas.items()]
    assert [s[1] for s in shares if s] == [
        ("alice", "app"),
        ("alice", "app"),
        ("alice", ""),
        ("alice", "app"),
        ("alice", "app"),
        ("alice", ""),
        ("", "app"),
        ("", "app"),
    ]


def test_each_quota_type_resolves_on_its_own() -> None:
    quotas = index(
        (
            ClientQuota("alice", "app", {P: 1}),
            ClientQuota("alice", "", {F: 2}),
            ClientQuota("", DEFAULT, {R: 3}),
        )
    )
    assert resolve(quotas, P, "alice", "app") == (1, ("alice", "app"))
    assert resolve(quotas, F, "alice", "app") == (2, ("alice", ""))
    assert resolve(quotas, R, "alice", "app") == (3, ("", "app"))
    assert resolve(quotas, P, "bob", "other") is None
    assert resolve(quotas, R, "bob", "other") == (3, ("", "other"))

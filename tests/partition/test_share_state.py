"""The pure share-partition state machine (raftmq/partition/share_state.py): what each
operation does, and, over random runs of a leader's decisions, the properties share
groups promise: no record acquired by two members at once, delivery counts never going
back, an accepted record never delivered again, and replay from the encoded entries
rebuilding the same state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.format import entry, share_ops
from raftmq.format.records import Record, build_batch
from raftmq.format.share_ops import AckType, Op, ShareOp
from raftmq.partition.share_state import (
    INVALID_RECORD_STATE,
    LOCK_RENEWAL_LIMIT,
    RecordState,
    ShareStates,
    pick_new,
    redeliverable,
)

G = "g"


def op(kind: Op, now_ms: int, **kw: object) -> ShareOp:
    return ShareOp(
        kind,
        G,
        1,
        now_ms,
        delivery_count_limit=3,
        lock_duration_ms=1000,
        max_lock_hold_ms=3000,
        **kw,
    )  # type: ignore[arg-type]


def acquire(
    states: ShareStates, member: str, now: int, *ranges: tuple[int, int]
) -> list[tuple[int, int, int]]:
    return states.apply(
        op(Op.ACQUIRE, now, member_id=member, deadline_ms=now + 1000, ranges=ranges)
    ).acquired


def ack(states: ShareStates, member: str, now: int, first: int, last: int, kind: AckType) -> str:
    return (
        states.apply(op(Op.ACK, now, member_id=member, acks=((first, last, kind),))).acks[0].error
    )


def started(start: int = 0) -> ShareStates:
    states = ShareStates()
    states.apply(op(Op.INIT, 0, start=start))
    return states


def test_acquire_ack_and_the_start_offset() -> None:
    s = started(10)
    assert acquire(s, "a", 0, (10, 14)) == [(10, 14, 1)]
    st_ = s.get(G, 1)
    assert st_ is not None and (st_.start, st_.end, st_.in_flight()) == (10, 15, 5)
    assert ack(s, "a", 1, 10, 11, AckType.ACCEPT) == ""
    assert (st_.start, st_.in_flight()) == (12, 3)
    # Another member's records, a range partly not held: nothing changes.
    assert ack(s, "b", 2, 12, 12, AckType.ACCEPT) == INVALID_RECORD_STATE
    assert ack(s, "a", 2, 13, 16, AckType.ACCEPT) == INVALID_RECORD_STATE
    assert st_.records[13].state == RecordState.ACQUIRED
    assert ack(s, "a", 2, 10, 10, AckType.ACCEPT) == INVALID_RECORD_STATE  # done already
    assert ack(s, "a", 3, 12, 12, AckType.RELEASE) == ""
    assert acquire(s, "b", 4, (12, 12), (15, 15)) == [(12, 12, 2), (15, 15, 1)]


def test_locks_expire_with_the_entry_clock_and_the_limit_archives() -> None:
    s = started()
    for n in range(1, 4):
        now = n * 2000
        assert acquire(s, "a", now, (0, 0)) == [(0, 0, n)]
        assert ack(s, "a", now + 1000, 0, 0, AckType.ACCEPT) == INVALID_RECORD_STATE  # expired
    st_ = s.get(G, 1)
    assert st_ is not None
    s.apply(op(Op.RELEASE_MEMBER, 9000, member_id="x"))  # any entry judges expiry
    assert st_.in_flight() == 0 and st_.archived_total == 1 and st_.start == 1
    assert acquire(s, "a", 9000, (0, 0)) == []


def test_an_acknowledgement_names_its_delivery() -> None:
    """A member's lock on delivery 1 expired and it took the record again (delivery 2, a
    prefetch): its ACCEPT of delivery 1 must not settle delivery 2, which it has not
    processed yet; an ACCEPT that names delivery 2 does."""
    s = started()
    assert acquire(s, "a", 0, (0, 1)) == [(0, 1, 1)]
    assert acquire(s, "a", 1500, (0, 1)) == [(0, 1, 2)]  # the locks expired at 1000

    def accept(count: int) -> str:
        acks = ((0, 1, AckType.ACCEPT, count),)
        return s.apply(op(Op.ACK, 1600, member_id="a", acks=acks)).acks[0].error

    assert accept(1) == INVALID_RECORD_STATE
    st_ = s.get(G, 1)
    assert st_ is not None and st_.records[0].state == RecordState.ACQUIRED
    assert accept(2) == ""
    assert st_.in_flight() == 0
    payload = share_ops.encode(op(Op.ACK, 1, member_id="a", acks=((0, 1, AckType.RELEASE, 7),)))
    assert share_ops.decode(payload).acks == (share_ops.Ack(0, 1, AckType.RELEASE, 7),)


def test_renew_extends_until_the_hold_limit() -> None:
    s = started()
    acquire(s, "a", 0, (0, 1))
    out = s.apply(op(Op.ACK, 900, member_id="a", acks=((0, 1, AckType.RENEW),))).acks[0]
    assert out.error == "" and out.deadline_ms == 1900
    assert ack(s, "a", 1800, 0, 1, AckType.RENEW) == ""
    assert ack(s, "a", 2500, 0, 1, AckType.RENEW) == LOCK_RENEWAL_LIMIT  # 2500 + 1000 > 3000
    assert ack(s, "a", 2600, 0, 1, AckType.ACCEPT) == ""


def test_reject_archives_and_waits_for_the_dead_letter_writer() -> None:
    s = started()
    acquire(s, "a", 0, (0, 2))
    out = s.apply(
        ShareOp(Op.ACK, G, 1, 1, dead_letter=True, member_id="a", acks=((0, 1, AckType.REJECT),))
    )
    assert out.acks[0].error == ""
    st_ = s.get(G, 1)
    assert st_ is not None and st_.waiting_dead_letter() == [0, 1] and st_.start == 0
    s.apply(op(Op.DEAD_LETTERED, 2, ranges=((0, 1),)))
    assert st_.waiting_dead_letter() == [] and st_.start == 2 and st_.dead_lettered_total == 2


def test_older_groups_entries_change_nothing_and_a_newer_group_starts_fresh() -> None:
    s = started()
    acquire(s, "a", 0, (0, 4))
    assert not s.apply(
        ShareOp(Op.ACK, G, 0, 1, member_id="a", acks=((0, 0, AckType.ACCEPT),))
    ).applied
    s.apply(ShareOp(Op.INIT, G, 5, 1, start=3))
    fresh = s.get(G, 5)
    assert s.get(G, 1) is None and fresh is not None and (fresh.start, fresh.in_flight()) == (3, 0)
    s.apply(ShareOp(Op.DELETE, G, 5, 2))
    assert len(s) == 0


def test_pick_new_skips_control_and_aborted_entries_and_stops_at_the_bound() -> None:
    data = b""
    offsets = 0
    parts = []
    for i in range(4):
        batch = build_batch(
            [Record(None, b"v", 1)] * 3,
            producer_id=7 if i == 1 else -1,
            producer_epoch=0 if i == 1 else -1,
            base_sequence=0 if i == 1 else -1,
        )
        h = entry.parse_header(batch)
        attrs = entry.TRANSACTIONAL if i == 1 else 0
        batch = entry.encode(
            bytes(entry.payload_of(batch, h)),
            record_count=3,
            base_offset=offsets,
            attributes=attrs,
            producer_id=h.producer_id,
            producer_epoch=h.producer_epoch,
            base_sequence=h.base_sequence,
        )
        parts.append(batch)
        offsets += 3
    parts.insert(2, share_ops.encode_entry(op(Op.DELETE, 0)))
    data = b"".join(parts)
    headers = list(entry.iter_headers(data))
    ranges, used = pick_new(headers, 1, 12, [(7, 3, 6)], 5)
    assert ranges == [(1, 2), (6, 8)] and [h.base_offset for h in used] == [0, 6]
    ranges, _ = pick_new(headers, 0, 10, [], 100)
    assert ranges == [(0, 2), (3, 5), (6, 8), (9, 9)]


# --- properties over random runs -----------------------------------------------------------

Action = tuple[str, int, int, int, int]
ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["fetch", "ack", "tick", "leave", "dlq"]),
        st.integers(0, 3),  # member
        st.integers(0, 30),  # offset / count
        st.integers(0, 5),  # span
        st.integers(1, 4),  # ack type
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ACTIONS, st.booleans())
def test_a_leader_run_keeps_the_promises(actions: list[Action], dead_letter: bool) -> None:
    hw = 40
    s = ShareStates()
    log_ops: list[ShareOp] = []

    def do(o: ShareOp) -> object:
        log_ops.append(o)
        return s.apply(o)

    def mk(kind: Op, now: int, **kw: object) -> ShareOp:
        return ShareOp(
            kind,
            G,
            1,
            now,
            delivery_count_limit=3,
            dead_letter=dead_letter,
            lock_duration_ms=100,
            max_lock_hold_ms=300,
            **kw,
        )  # type: ignore[arg-type]

    do(mk(Op.INIT, 0, start=0))
    now = 0
    holds: dict[int, tuple[str, int]] = {}
    counts: dict[int, int] = {}
    accepted: set[int] = set()
    for kind, m, n, span, t in actions:
        member = f"m{m}"
        now += 10
        st_ = s.get(G, 1)
        assert st_ is not None
        if kind == "fetch":
            again = redeliverable(st_, now, (), n + 1)
            new = [(o, o) for o in range(st_.end, min(hw, st_.end + n + 1 - len(again)))]
            ranges = [(o, o) for o in again] + new
            out = do(
                mk(Op.ACQUIRE, now, member_id=member, deadline_ms=now + 100, ranges=tuple(ranges))
            )
            for first, last, count in out.acquired:  # type: ignore[attr-defined]
                for o in range(first, last + 1):
                    assert o not in accepted
                    held = holds.get(o)
                    assert held is None or held[1] <= now, (o, held)
                    assert count > counts.get(o, 0)
                    counts[o] = count
                    holds[o] = (member, now + 100)
        elif kind == "ack":
            res = do(mk(Op.ACK, now, member_id=member, acks=((n, n + span, AckType(t)),)))
            if res.acks[0].error == "":  # type: ignore[attr-defined]
                for o in range(n, n + span + 1):
                    assert holds[o][0] == member and holds[o][1] > now
                    if t == AckType.RENEW:
                        holds[o] = (member, res.acks[0].deadline_ms)  # type: ignore[attr-defined]
                    else:
                        del holds[o]
                        if t == AckType.ACCEPT:
                            accepted.add(o)
        elif kind == "tick":
            now += n * 10
        elif kind == "leave":
            do(mk(Op.RELEASE_MEMBER, now, member_id=member))
            holds = {o: h for o, h in holds.items() if h[0] != member}
        else:
            waiting = st_.waiting_dead_letter()
            if waiting:
                do(mk(Op.DEAD_LETTERED, now, ranges=((waiting[0], waiting[-1]),)))
        st_ = s.get(G, 1)
        assert st_ is not None and st_.start <= st_.end
        assert all(st_.start <= o < st_.end for o in st_.records)
        assert all(r.delivery_count <= 3 for r in st_.records.values())
    # Replay of the encoded entries rebuilds the same state, and so does the checkpoint.
    replayed = ShareStates()
    for o in log_ops:
        replayed.apply(share_ops.decode(share_ops.encode(o)))
    assert replayed.to_json() == s.to_json()
    assert ShareStates.from_json(s.to_json()).to_json() == s.to_json()

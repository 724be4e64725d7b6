"""One test per Raft rule, each built so that a naive implementation fails it."""

from __future__ import annotations

import pytest

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.errors import CorruptEntryError
from raftmq.raft import (
    Config,
    HardState,
    Membership,
    MemoryStorage,
    Message,
    MsgType,
    NotLeaderError,
    ProposalDroppedError,
    RaftCore,
    Role,
)
from raftmq.raft.core import starts_rejoining
from raftmq.raft.log_view import split
from raftmq.raft.membership import ConfigHistory
from raftmq.raft.messages import CAMPAIGN_TRANSFER
from raftmq.raft.progress import ProgressState
from tests.raft.harness import (
    Net,
    Peer,
    cluster,
    data_entry,
    flush,
    make,
    persist,
    preload,
    restart,
    stamped,
)


def app(
    src: int, dst: int, term: int, prev: int, prev_term: int, ents: list[bytes], commit: int = 0
):
    return Message(
        MsgType.APP,
        src,
        dst,
        term,
        log_term=prev_term,
        index=prev,
        entries=b"".join(ents),
        commit=commit,
    )


def terms_of(p) -> list[int]:
    lg = p.core.log
    return [e.term for e in lg.entries(lg.first_index, 1 << 30)]


# --------------------------------------------------------------------- log matching
def test_delayed_append_never_truncates_matching_entries():
    f = make(2, {1, 2, 3})
    preload(f.storage, [])
    f.core.step(app(1, 2, 1, 0, 0, [stamped(i, 1) for i in range(1, 6)]))
    flush(f)
    # A duplicate of an older, shorter AppendEntries arrives late.
    f.core.step(app(1, 2, 1, 1, 1, [stamped(2, 1)]))
    msgs = flush(f)
    assert f.core.log.last_index == 5, "a matching stale append cut the log"
    assert msgs[-1].type == MsgType.APP_RESP and not msgs[-1].reject and msgs[-1].index == 2


def test_conflicting_append_truncates_from_the_conflict_only():
    st = MemoryStorage()
    preload(st, [1, 1, 1, 2, 2])
    f = make(2, {1, 2, 3}, storage=st, hs=HardState(2, 0, 3))
    f.core.step(app(1, 2, 3, 3, 1, [stamped(4, 3)], commit=3))
    flush(f)
    assert terms_of(f) == [1, 1, 1, 3]
    assert f.storage.last_index == 4 and f.storage.term_at(4) == 3


def test_a_commit_rides_on_the_next_append_or_heartbeat_not_messages_of_its_own():
    """One request in flight: a commit broadcast of its own would cost every follower a
    round and an ack per commit, competing with the next request's append."""
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1].core
    ld.propose(data_entry(b"a"))
    net.delivered.clear()
    net.pump()
    assert ld.commit == ld.log.last_index
    appends = [m for m in net.delivered if m.type == MsgType.APP]
    assert len(appends) == 2 and all(m.entries for m in appends), "no commit-only append"
    assert net.peers[2].core.commit < ld.commit
    ld.propose(data_entry(b"b"))  # the next append carries the commit of the one before
    net.pump()
    assert net.peers[2].core.commit == ld.commit - 1
    net.tick(1)  # and with nothing more to send, the heartbeat does
    assert all(p.core.commit == ld.commit for p in net.peers.values())


def test_follower_commit_limited_to_entries_this_message_proved():
    st = MemoryStorage()
    preload(st, [1, 1, 1, 1])  # stale tail beyond what the leader sends
    f = make(2, {1, 2, 3}, storage=st, hs=HardState(1, 0, 0))
    f.core.step(app(1, 2, 2, 1, 1, [], commit=4))
    flush(f)
    assert f.core.commit == 1, "committed entries this append did not vouch for"


def test_append_rejection_hints_skip_a_whole_term():
    # Follower holds a long tail of term 2 the new leader never had.
    st = MemoryStorage()
    preload(st, [1, 1] + [2] * 20)
    f = make(2, {1, 2, 3}, storage=st, hs=HardState(2, 0, 2))
    f.core.step(app(1, 2, 3, 22, 3, []))
    resp = flush(f)[-1]
    assert resp.reject and resp.index == 22
    assert resp.log_term == 2 and resp.reject_hint == 22
    # The leader, whose log has term 1 up to 10, jumps straight to index 10.
    lst = MemoryStorage()
    preload(lst, [1] * 10 + [3])
    ld = make(1, {1, 2, 3}, storage=lst, hs=HardState(3, 1, 0))
    ld.core.step(Message(MsgType.APP, 1, 1, 0)) if False else None
    idx, term = ld.core.log.find_conflict_by_term(resp.reject_hint, resp.log_term)
    assert (idx, term) == (10, 1)


# --------------------------------------------------------------------- elections
def test_restarted_node_does_not_vote_twice_in_a_term():
    p = make(1, {1, 2, 3}, pre_vote=False, check_quorum=False)
    p.core.step(Message(MsgType.VOTE, 2, 1, 5))
    out = flush(p)
    assert out[-1].type == MsgType.VOTE_RESP and not out[-1].reject
    p = restart(p, 1, {1, 2, 3}, pre_vote=False, check_quorum=False)
    p.core.step(Message(MsgType.VOTE, 3, 1, 5))
    out = flush(p)
    assert out[-1].type == MsgType.VOTE_RESP and out[-1].reject, "voted twice in term 5"


def test_vote_is_sent_only_after_it_is_persisted():
    p = make(1, {1, 2, 3}, pre_vote=False)
    p.core.step(Message(MsgType.VOTE, 2, 1, 5))
    rd = p.core.ready()
    assert rd.hard_state == HardState(5, 2, 0)
    assert not rd.send_now and rd.messages[0].type == MsgType.VOTE_RESP


def test_candidate_requests_go_out_after_persisting_term_and_vote():
    p = make(1, {1, 2, 3}, pre_vote=False)
    p.core.campaign()
    rd = p.core.ready()
    assert rd.hard_state is not None and rd.hard_state.vote == 1 and rd.hard_state.term == 1
    assert not rd.send_now and {m.type for m in rd.messages} == {MsgType.VOTE}


def test_election_restriction_refuses_less_complete_log():
    st = MemoryStorage()
    preload(st, [1, 2])
    p = make(1, {1, 2, 3}, storage=st, hs=HardState(2, 0, 0), pre_vote=False)
    p.core.step(Message(MsgType.VOTE, 2, 1, 3, log_term=1, index=5))
    assert flush(p)[-1].reject
    p.core.step(Message(MsgType.VOTE, 3, 1, 3, log_term=2, index=2))
    assert not flush(p)[-1].reject


def test_pre_vote_does_not_bump_terms():
    net = cluster(3)
    net.elect(1)
    term = net.peers[1].core.term
    # Node 3 is cut off and keeps timing out.
    net.drop = lambda m: m.src == 3 or m.dst == 3
    net.tick(100)
    assert net.peers[3].core.term == term, "a partitioned pre-candidate raised its term"
    net.drop = lambda m: False
    net.tick(5)
    assert net.peers[1].core.role == Role.LEADER and net.peers[1].core.term == term


def test_without_pre_vote_a_rejoining_node_would_disrupt():
    """Counter-check that the previous test can fail: with pre-vote off, terms inflate."""
    net = cluster(3, pre_vote=False, check_quorum=False)
    net.elect(1)
    term = net.peers[1].core.term
    net.drop = lambda m: m.src == 3 or m.dst == 3
    net.tick(100)
    assert net.peers[3].core.term > term


def test_pre_vote_grant_carries_the_future_term_and_keeps_ours():
    p = make(1, {1, 2, 3})
    p.core.step(Message(MsgType.PRE_VOTE, 2, 1, 4, log_term=0, index=0))
    out = flush(p)
    assert out[-1].type == MsgType.PRE_VOTE_RESP and not out[-1].reject and out[-1].term == 4
    assert p.core.term == 0 and p.core.vote == 0


def test_check_quorum_leader_steps_down_when_cut_off():
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.src == 1 or m.dst == 1
    net.tick(2 * 10 + 1, only={1})
    assert net.peers[1].core.role == Role.FOLLOWER


def test_leader_stickiness_ignores_votes_while_leader_is_alive():
    net = cluster(3)
    net.elect(1)
    f = net.peers[2]
    term = f.core.term
    f.core.step(Message(MsgType.VOTE, 3, 2, term + 1, log_term=9, index=99))
    assert f.core.term == term and not [m for m in flush(f) if m.type == MsgType.VOTE_RESP]
    f.core.step(Message(MsgType.PRE_VOTE, 3, 2, term + 1, log_term=9, index=99))
    assert not [m for m in flush(f) if m.type == MsgType.PRE_VOTE_RESP]
    # A transfer campaign overrides the lease.
    f.core.step(
        Message(MsgType.VOTE, 3, 2, term + 1, log_term=9, index=99, context=CAMPAIGN_TRANSFER)
    )
    assert f.core.term == term + 1


def test_stale_leader_steps_down_on_newer_term_reply():
    net = cluster(3)
    net.elect(1)
    old = net.peers[1].core.term
    net.drop = lambda m: m.src == 1 or m.dst == 1
    net.tick(30, only={2, 3})  # their lease on leader 1 expires; one of them wins
    assert any(net.peers[i].core.role == Role.LEADER for i in (2, 3))
    assert net.peers[1].core.role == Role.LEADER  # it has not ticked: it does not know
    net.drop = lambda m: False
    net.peers[1].core.propose(data_entry())
    net.pump()
    assert net.peers[1].core.role == Role.FOLLOWER and net.peers[1].core.term > old


# --------------------------------------------------------------------- commit rules
def test_new_leader_does_not_commit_old_term_entries_by_counting():
    """Figure 8: an entry of term 2 replicated to a majority is not committed by a term-4
    leader until an entry of term 4 is."""
    st = MemoryStorage()
    preload(st, [1, 2])
    ld = make(1, {1, 2, 3}, storage=st, hs=HardState(3, 1, 1), pre_vote=False)
    ld.core.campaign()  # term 4
    flush(ld)
    ld.core.step(Message(MsgType.VOTE_RESP, 2, 1, 4))
    flush(ld)
    assert ld.core.role == Role.LEADER
    # Follower 2 acknowledges index 2 (the old-term entry) but not the no-op at 3.
    ld.core.step(Message(MsgType.APP_RESP, 2, 1, 4, index=2))
    flush(ld)
    assert ld.core.commit == 1, "committed an old-term entry by counting replicas"
    ld.core.step(Message(MsgType.APP_RESP, 2, 1, 4, index=3))
    flush(ld)
    assert ld.core.commit == 3


def test_leader_counts_its_own_entry_only_once_durable():
    p = make(1, {1})
    p.core.campaign()
    rd = p.core.ready()
    assert p.core.commit == 0
    assert rd.entries and not rd.committed_entries
    p.storage.append(rd.entries)
    p.storage.sync()
    p.core.advance(rd)
    assert p.core.commit == 1  # the local append was acknowledged by advance


def test_leader_messages_may_overtake_the_write_but_acks_may_not():
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1]
    ld.core.propose(data_entry())
    rd = ld.core.ready()
    assert rd.entries and [m.type for m in rd.send_now] == [MsgType.APP, MsgType.APP]
    assert not rd.messages
    persist(ld, rd)
    f = net.peers[2]
    for m in rd.send_now:
        if m.dst == 2:
            f.core.step(m)
    rd2 = f.core.ready()
    assert rd2.entries and not rd2.send_now and rd2.messages[0].type == MsgType.APP_RESP


def test_heartbeat_never_commits_past_known_match():
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.dst == 3
    for _ in range(3):
        net.peers[1].core.propose(data_entry())
    net.pump()
    net.drop = lambda m: False
    ld = net.peers[1].core
    ld.tick()
    rd = ld.ready()
    beats = [m for m in rd.send_now if m.type == MsgType.HEARTBEAT and m.dst == 3]
    assert beats and beats[0].commit <= ld.progress[3].match < ld.commit
    persist(net.peers[1], rd)


# --------------------------------------------------------------------- proposals
def test_proposals_are_stamped_with_index_term_and_offsets():
    p = make(1, {1})
    p.core.campaign()
    flush(p)
    p.core.propose(data_entry(b"a", 3) + data_entry(b"b", 2))
    flush(p)
    hs = [entry.parse_header(d) for d in p.applied]
    assert [(h.index, h.term, h.type) for h in hs] == [
        (1, 1, EntryType.NOOP),
        (2, 1, EntryType.DATA),
        (3, 1, EntryType.DATA),
    ]
    assert [(h.base_offset, h.record_count) for h in hs] == [(0, 0), (0, 3), (3, 2)]
    for d in p.applied:
        list(entry.iter_headers(d))  # CRCs were recomputed
    assert p.storage.next_offset == 5


def test_followers_refuse_proposals_and_name_the_leader():
    net = cluster(3)
    net.elect(1)
    with pytest.raises(NotLeaderError) as e:
        net.peers[2].core.propose(data_entry())
    assert e.value.leader == 1


def test_stamped_proposal_is_refused():
    p = make(1, {1})
    p.core.campaign()
    flush(p)
    with pytest.raises(Exception, match="a producer leaves both 0"):
        p.core.propose(stamped(9, 9))


# --------------------------------------------------------------------- flow control
def test_appends_are_bounded_in_bytes_and_pipelined_within_the_window():
    net = cluster(2, max_append_bytes=500, max_inflight_msgs=3, max_inflight_bytes=2000)
    net.elect(1)
    ld = net.peers[1].core
    for _ in range(30):
        ld.propose(data_entry(b"p" * 150))
    rd = ld.ready()
    apps = [m for m in rd.send_now if m.type == MsgType.APP]
    assert len(apps) == 3, "window of 3 in-flight appends"
    assert all(len(m.entries) <= 500 for m in apps)
    assert all(len(split(m.entries)) >= 1 for m in apps)
    assert ld.progress[2].state == ProgressState.REPLICATE
    # The heartbeat still goes out while the window is full.
    persist(net.peers[1], rd)
    ld.tick()
    rd2 = ld.ready()
    assert [m.type for m in rd2.send_now] == [MsgType.HEARTBEAT]
    persist(net.peers[1], rd2)
    net.queue += rd.send_now + rd2.send_now
    net.pump()
    assert net.peers[2].core.log.last_index == ld.log.last_index


def test_lost_appends_recover_through_probe():
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.type == MsgType.APP and m.dst == 3
    for _ in range(5):
        net.peers[1].core.propose(data_entry())
    net.pump()
    net.drop = lambda m: False
    net.tick(3)
    assert net.peers[3].core.log.last_index == net.peers[1].core.log.last_index


# --------------------------------------------------------------------- transfer
def test_leadership_transfer():
    net = cluster(3)
    net.elect(1)
    t = net.peers[1].core.term
    net.peers[1].core.transfer_leadership(2)
    with pytest.raises(ProposalDroppedError):
        net.peers[1].core.propose(data_entry())
    net.pump()
    assert net.peers[2].core.role == Role.LEADER and net.peers[2].core.term == t + 1
    assert net.peers[1].core.role == Role.FOLLOWER


def test_transfer_to_lagging_follower_waits_for_catch_up():
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.dst == 3
    net.peers[1].core.propose(data_entry())
    net.pump()
    net.drop = lambda m: False
    net.peers[1].core.transfer_leadership(3)
    net.pump()
    assert net.peers[3].core.role == Role.LEADER
    assert net.peers[3].core.log.last_index >= 2


# --------------------------------------------------------------------- read index
def test_read_index_needs_a_quorum_heartbeat_round():
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1]
    net.drop = lambda m: m.type == MsgType.HEARTBEAT_RESP
    ld.core.read_index(b"r1")
    net.pump()
    assert not any(rd.read_states for rd in ld.readies), "served a read without a quorum"
    net.drop = lambda m: False
    net.tick(1)
    states = [s for rd in ld.readies for s in rd.read_states]
    assert [(s.index, s.context) for s in states] == [(ld.core.commit, b"r1")]


def test_read_index_waits_for_the_leaders_first_commit():
    net = cluster(3)
    net.drop = lambda m: m.type == MsgType.APP_RESP
    net.elect(1)
    ld = net.peers[1]
    assert ld.core.commit == 0
    ld.core.read_index(b"r")
    net.tick(1)
    assert not any(rd.read_states for rd in ld.readies)
    net.drop = lambda m: False
    net.tick(1)
    states = [s for rd in ld.readies for s in rd.read_states]
    assert states and states[0].index >= 1


def test_read_index_from_a_follower():
    net = cluster(3)
    net.elect(1)
    net.peers[1].core.propose(data_entry())
    net.pump()
    f = net.peers[2]
    f.core.read_index(b"fr")
    net.pump()
    net.tick(1)
    states = [s for rd in f.readies for s in rd.read_states]
    assert states and states[0].index == net.peers[1].core.commit and states[0].context == b"fr"


# --------------------------------------------------------------------- snapshots
def _leader_compacted_past_node_3() -> tuple[Net, Peer]:
    """Node 1 leads with 10 entries, node 3 cut off, and has snapshotted through 7."""
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.dst == 3 or m.src == 3
    for _ in range(10):
        net.peers[1].core.propose(data_entry())
    net.pump()
    ld = net.peers[1]
    ld.storage.truncate_prefix(8)  # the application snapshotted through index 7
    ld.storage.sync()
    return net, ld


def test_lagging_follower_receives_a_snapshot():
    net, ld = _leader_compacted_past_node_3()
    net.drop = lambda m: False
    net.tick(2)
    f = net.peers[3]
    snaps = [rd.snapshot for rd in f.readies if rd.snapshot is not None]
    assert snaps and snaps[0].index == 7 and snaps[0].membership.voters == {1, 2, 3}
    assert snaps[0].next_offset == ld.storage.offset_at(8)
    # report_snapshot is the transport's job; in this harness the message arrived.
    ld.core.report_snapshot(3, ok=True)
    net.tick(3)
    assert f.storage.start_index == 8 and f.core.log.last_index == ld.core.log.last_index
    assert f.core.applied == ld.core.applied


def test_a_rejection_hint_below_the_leaders_log_start_gets_a_snapshot():
    """A follower's hint can point below what the leader still holds: the term search
    stops at the compacted index (no term lookup there) and the follower is sent the
    snapshot, instead of failing the leader's step."""
    _, ld = _leader_compacted_past_node_3()
    assert ld.core.log.find_conflict_by_term(3, ld.core.term) == (3, 0)
    pr = ld.core.progress[3]
    pr.become_probe()
    rejected = pr.next - 1
    ld.core.step(
        Message(
            MsgType.APP_RESP,
            3,
            1,
            ld.core.term,
            index=rejected,
            reject=True,
            reject_hint=3,
            log_term=ld.core.term,
        )
    )
    sent = [m for m in flush(ld) if m.dst == 3]
    assert [m.type for m in sent] == [MsgType.SNAP]
    assert sent[0].snapshot is not None and sent[0].snapshot.index == 7


def test_snapshot_matching_our_log_only_fast_forwards_commit():
    net = cluster(3)
    net.elect(1)
    for _ in range(3):
        net.peers[1].core.propose(data_entry())
    net.pump()
    f = net.peers[2]
    snap = net.peers[1].core.snapshot_meta()
    f.core.step(Message(MsgType.SNAP, 1, 2, f.core.term, snapshot=snap))
    assert f.core.log.pending_snapshot is None


# --------------------------------------------------------------------- membership
def test_learner_never_campaigns_and_its_vote_does_not_count():
    p = make(3, {1, 2}, learners={3})
    for _ in range(100):
        p.core.tick()
    assert p.core.role == Role.FOLLOWER and p.core.term == 0
    c = make(1, {1, 2}, learners={3}, pre_vote=False)
    c.core.campaign()
    flush(c)
    c.core.step(Message(MsgType.VOTE_RESP, 3, 1, 1))
    flush(c)
    assert c.core.role == Role.CANDIDATE, "a learner's vote elected a leader"
    c.core.step(Message(MsgType.VOTE_RESP, 2, 1, 1))
    flush(c)
    assert c.core.role == Role.LEADER


def test_add_learner_catch_up_promote_then_remove():
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1].core
    for _ in range(5):
        ld.propose(data_entry())
    net.pump()
    net.peers[4] = make(4, set())  # a new node knows nothing yet
    ld.propose_membership(Membership(frozenset({1, 2, 3}), frozenset({4})))
    net.pump()
    assert net.peers[4].core.log.last_index == ld.log.last_index
    assert ld.progress[4].is_learner
    ld.propose_membership(Membership(frozenset({1, 2, 3, 4})))
    with pytest.raises(ProposalDroppedError):
        ld.propose_membership(Membership(frozenset({1, 2, 3})))  # one at a time
    net.pump()
    assert ld.membership.voters == {1, 2, 3, 4} and net.peers[4].core.promotable()
    with pytest.raises(ProposalDroppedError):
        ld.propose_membership(Membership(frozenset({1, 2})))  # two voters at once
    ld.propose_membership(Membership(frozenset({2, 3, 4})))  # the leader removes itself
    net.pump()
    assert ld.role == Role.FOLLOWER and not ld.promotable()
    net.tick(40, only={2, 3, 4})
    leaders = [i for i in (2, 3, 4) if net.peers[i].core.role == Role.LEADER]
    assert len(leaders) == 1
    net.peers[leaders[0]].core.propose(data_entry(b"after"))
    net.pump()
    net.tick(1, only={2, 3, 4})  # the heartbeat tells the followers the commit
    assert all(net.peers[i].applied[-1].endswith(b"after") for i in (2, 3, 4))


def test_unknown_membership_payload_round_trips():
    m = Membership(frozenset({3, 1, 7}), frozenset({9}))
    assert Membership.decode(m.encode()) == m


# --------------------------------------------------------------------- restart
def test_restart_replays_committed_config_and_keeps_log():
    net = cluster(3)
    net.elect(1)
    for _ in range(4):
        net.peers[1].core.propose(data_entry())
    net.pump()
    net.tick(1)  # the heartbeat tells the followers the commit
    before = terms_of(net.peers[2])
    p = restart(net.peers[2], 2, {1, 2, 3})
    assert terms_of(p) == before and p.core.commit == net.peers[1].core.commit
    assert p.core.term == net.peers[1].core.term


def test_unsynced_writes_are_lost_on_crash():
    st = MemoryStorage()
    st.append(stamped(1, 1))
    st.sync()
    st.append(stamped(2, 1))
    st.truncate_suffix(1)
    st.crash()
    assert st.last_index == 1
    st.append(stamped(2, 1))
    st.crash()
    assert st.last_index == 1


def test_net_helper_is_fifo():
    net = Net({})
    net.pump()


def test_node_whose_removal_is_uncommitted_may_still_campaign():
    """Its removal is in its log but the committed configuration still needs it."""
    net = cluster(2)
    net.elect(1)
    ld = net.peers[1].core
    net.drop = lambda m: m.dst == 2  # the removal never reaches node 2
    ld.propose_membership(Membership(frozenset({2})))
    net.pump()
    assert ld.membership.voters == {2} and ld.role == Role.LEADER
    # Node 1 crashes; on restart it still holds the uncommitted removal.
    p1 = restart(net.peers[1], 1, {1, 2})
    assert p1.core.membership.voters == {2} and p1.core.promotable()
    net.peers[1] = p1
    net.drop = lambda m: False
    net.tick(60)
    roles = {i: p.core.role for i, p in net.peers.items()}
    assert Role.LEADER in roles.values(), roles
    # Eventually node 2 alone leads, and node 1 is out.
    net.tick(60)
    assert net.peers[2].core.role == Role.LEADER and net.peers[2].core.membership.voters == {2}


def test_corrupted_append_is_ignored():
    f = make(2, {1, 2, 3})
    bad = bytearray(stamped(1, 1))
    bad[-1] ^= 0xFF
    f.core.step(app(1, 2, 1, 0, 0, [bytes(bad)]))
    assert f.core.log.last_index == 0
    assert not [m for m in flush(f) if m.type == MsgType.APP_RESP]


def test_write_to_storage_restarts_a_conflicting_log_at_the_snapshot():
    from raftmq.raft import Ready, SnapshotMeta, write_to_storage

    st = MemoryStorage()
    preload(st, [1, 1, 1, 1, 1, 1])
    meta = SnapshotMeta(4, 2, 40, Membership(frozenset({1})))
    write_to_storage(st, Ready(snapshot=meta))
    assert (st.start_index, st.last_index, st.term_at(4), st.next_offset) == (5, 4, 2, 40)
    st.append(stamped(5, 2, offset=40))
    assert st.last_index == 5


def test_unsent_acks_for_truncated_entries_are_dropped():
    """Found by the simulator (seed 101487 of an earlier scheduler): acks made while a
    Ready was outstanding, then a newer leader truncated those entries before the next
    Ready. Sent after the truncation was durable, they would be lies to the old leader."""
    f = make(2, {1, 2, 3})
    f.core.step(app(1, 2, 1, 0, 0, [stamped(i, 1) for i in range(1, 4)]))
    f.core.step(app(3, 2, 2, 0, 0, [stamped(1, 2)]))
    rd = f.core.ready()
    assert rd.first_index == 1 and rd.last_index == 1 and rd.last_term == 2
    acks = [(m.dst, m.index) for m in rd.messages if m.type == MsgType.APP_RESP]
    assert acks == [(3, 1)], acks


def test_unsent_vote_grant_of_an_older_term_is_dropped():
    p = make(1, {1, 2, 3}, pre_vote=False, check_quorum=False)
    p.core.step(Message(MsgType.VOTE, 2, 1, 5))
    p.core.step(Message(MsgType.VOTE, 3, 1, 6))
    rd = p.core.ready()
    assert rd.hard_state == HardState(6, 3, 0)
    assert [(m.dst, m.term) for m in rd.messages] == [(3, 6)]


def test_unreachable_follower_falls_back_to_probing():
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1].core
    ld.propose(data_entry())
    net.pump()
    assert ld.progress[2].state == ProgressState.REPLICATE
    ld.report_unreachable(2)
    assert ld.progress[2].state == ProgressState.PROBE
    assert ld.progress[2].next == ld.progress[2].match + 1


def test_failed_snapshot_transfer_is_retried():
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.dst == 3 or m.src == 3
    for _ in range(5):
        net.peers[1].core.propose(data_entry())
    net.pump()
    ld = net.peers[1]
    ld.storage.truncate_prefix(5)
    ld.storage.sync()
    net.tick(2)  # heartbeats are dropped: node 3 is not recently active, no snapshot yet
    net.drop = lambda m: m.type == MsgType.SNAP
    net.tick(2)
    assert ld.core.progress[3].state == ProgressState.SNAPSHOT
    ld.core.report_snapshot(3, ok=False)
    assert ld.core.progress[3].state == ProgressState.PROBE
    net.drop = lambda m: False
    net.tick(3)
    ld.core.report_snapshot(3, ok=True)
    net.tick(3)
    assert net.peers[3].core.log.last_index == ld.core.log.last_index


def test_ready_must_be_advanced_before_the_next():
    p = make(1, {1})
    p.core.campaign()
    p.core.ready()
    assert not p.core.has_ready()
    with pytest.raises(AssertionError):
        p.core.ready()


def test_applying_alone_needs_no_fsync():
    net = cluster(3)
    net.elect(1)
    f = net.peers[2]
    net.peers[1].core.propose(data_entry())
    net.pump()
    net.tick(1)  # the heartbeat carries the new commit index
    commit_only = [rd for rd in f.readies if rd.committed_entries and not rd.entries]
    assert commit_only and commit_only[-1].hard_state is not None
    assert not commit_only[-1].must_sync(), "a commit-only hard state needs no fsync"


def test_vote_survives_learning_the_leader_of_the_same_term():
    """Becoming a follower within a term must not clear the vote of that term."""
    p = make(1, {1, 2, 3, 4}, pre_vote=False, check_quorum=False)
    p.core.step(Message(MsgType.VOTE, 2, 1, 5))
    flush(p)
    p.core.step(Message(MsgType.HEARTBEAT, 3, 1, 5))
    flush(p)
    assert p.core.vote == 2 and p.core.lead == 3
    p.core.step(Message(MsgType.VOTE, 4, 1, 5))
    assert flush(p)[-1].reject


def test_pre_vote_applies_the_election_restriction():
    st = MemoryStorage()
    preload(st, [1, 2, 2])
    p = make(1, {1, 2, 3}, storage=st, hs=HardState(2, 0, 0))
    p.core.step(Message(MsgType.PRE_VOTE, 2, 1, 3, log_term=2, index=2))
    assert flush(p)[-1].reject
    assert p.core.term == 2


def test_restart_from_a_configuration_history_reads_only_what_follows_it():
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1].core
    new = Membership(frozenset({1, 2, 3}), frozenset({4}))
    conf_index = ld.propose_membership(new)
    for _ in range(5):
        ld.propose(data_entry())
    net.pump()
    net.tick(1)  # the heartbeat tells the followers the commit
    p = net.peers[2]
    history = p.core.config_history()
    assert history is not None and history.through == p.core.commit
    assert history.changes == ((0, Membership(frozenset({1, 2, 3}))), (conf_index, new))
    for _ in range(3):
        ld.propose(data_entry())
    net.pump()
    p.storage.crash()
    reads: list[int] = []
    original = p.storage.read_entries

    def spy(lo, max_bytes, hi=None):
        reads.append(lo)
        return original(lo, max_bytes, hi)

    p.storage.read_entries = spy  # type: ignore[method-assign]
    core = RaftCore(
        Config(id=2),
        p.storage,
        hard_state=p.hs,
        membership=Membership(frozenset({1, 2, 3})),
        history=history,
    )
    assert core.membership == new
    assert reads and min(reads) == history.through + 1
    # A history that names another configuration at the log's start is a driver's bug.
    with pytest.raises(AssertionError, match="disagrees"):
        RaftCore(Config(id=2), p.storage, hard_state=p.hs, membership=new, history=history)


def test_a_configuration_history_survives_its_encoding_and_refuses_damage():
    a = Membership(frozenset({1, 2, 3}))
    b = Membership(frozenset({1, 2, 3}), frozenset({4}))
    h = ConfigHistory(40, ((7, a), (12, b)))
    raw = h.encode()
    assert ConfigHistory.decode(raw) == h
    assert h.as_of(6) is None and h.as_of(7) == a and h.as_of(11) == a and h.as_of(40) == b
    # Clamped to a shorter log, dropping what it no longer holds; nothing past a later start.
    assert h.for_log(7, 11, a) == ConfigHistory(11, ((7, a),))
    assert h.for_log(9, 100, a) == h
    assert h.for_log(40, 100, b) is None
    with pytest.raises(ValueError, match="disagree"):
        h.for_log(7, 100, b)
    for bad in (raw[:-1], raw + b"\0", raw[:4], ConfigHistory(11, ((7, a),)).encode()[:12]):
        with pytest.raises(ValueError):
            ConfigHistory.decode(bad)
    backwards = bytearray(raw)
    backwards[12:20] = (13).to_bytes(8, "big")  # first change after the second
    with pytest.raises(ValueError, match="ascending"):
        ConfigHistory.decode(bytes(backwards))


def test_the_saved_history_stops_before_entries_storage_does_not_hold_yet():
    """A follower that accepted entries replacing a conflicting suffix of its storage must
    not save a history (the driver's commit hint) past them: a crash before they reach
    storage would leave the old entries there, under a commit index that covers them."""
    st = MemoryStorage()
    preload(st, [1, 1, 1, 1, 1])
    f = make(2, {1, 2, 3}, storage=st)
    f.core.step(app(1, 2, 2, 2, 1, [stamped(i, 2) for i in (3, 4, 5, 6)], commit=6))
    assert f.core.commit == 6 and f.storage.last_index == 5  # index 3-5 still the old ones
    history = f.core.config_history()
    assert history is not None and history.through == 2
    flush(f)
    history = f.core.config_history()
    assert history is not None and history.through == 6


def test_proposals_between_readies_share_one_append_per_follower():
    """A leader sends what was proposed since its last Ready in one AppendEntries per
    follower, not one per proposal: under load that divides messages and acks."""
    net = cluster(3)
    net.elect(1)
    ld = net.peers[1]
    for _ in range(5):
        ld.core.propose(data_entry())
    rd = ld.core.ready()
    apps = [m for m in rd.send_now + rd.messages if m.type == MsgType.APP]
    assert sorted(m.dst for m in apps) == [2, 3]
    assert all(len(split(m.entries)) == 5 for m in apps)
    persist(ld, rd)
    net.queue += apps
    net.pump()
    assert ld.core.commit == ld.core.log.last_index


def test_without_apply_entries_a_ready_reports_the_commit_but_reads_no_entries():
    """Partitions: the log is the state, so reading committed entries back is wasted."""
    net = cluster(3, apply_entries=False)
    net.elect(1)
    for _ in range(3):
        net.peers[1].core.propose(data_entry())
    net.pump()
    net.tick(1)  # the heartbeat tells the followers the commit
    for p in net.peers.values():
        last = p.core.log.last_index
        assert p.core.log.applied == p.core.commit == last == 4  # no-op + three
        reported = [rd.applied_to for rd in p.readies if rd.applied_to]
        assert reported and reported[-1] == last and reported == sorted(reported)
        assert not any(rd.committed_entries for rd in p.readies)
        assert p.applied == []


# --------------------------------------------------------------------- disk loss
def _lose_disk(net: Net, node: int) -> None:
    """``node`` restarts with an empty log and no hard state, having promised before."""
    voters = set(net.peers)
    net.peers[node] = make(node, voters, rejoining=True)


def test_starts_rejoining_only_after_a_promise_or_below_a_known_commit():
    assert not starts_rejoining(HardState(), 0, 0, promised=False)  # a new replica
    assert starts_rejoining(HardState(), 0, 0, promised=True)  # its hard state is gone
    assert starts_rejoining(HardState(3, 1, 9), 5, 9, promised=True)  # lost a suffix
    assert not starts_rejoining(HardState(3, 1, 5), 5, 5, promised=True)
    assert starts_rejoining(HardState(3, 1, 5, rejoining=True), 5, 5, promised=True)


def _replicated(entries: int) -> Net:
    """Three members, 1 leading, all holding its no-op and ``entries`` entries."""
    net = cluster(3)
    net.elect(1)
    for _ in range(entries):
        net.peers[1].core.propose(data_entry())
    net.pump()
    return net


def test_wiped_follower_is_caught_up_from_its_real_end():
    """The leader's record for it (match) is above its real end: a rejection there must
    reset the record, not be dropped as stale, or both sides spin forever."""
    net = _replicated(6)
    leader = net.peers[1].core
    assert leader.progress[3].match == leader.log.last_index == 7
    _lose_disk(net, 3)
    leader.propose(data_entry())
    net.pump()
    net.tick(3)
    assert net.peers[3].core.log.last_index == leader.log.last_index
    assert not net.peers[3].core.rejoining
    assert net.peers[3].hs.rejoining is False and net.peers[3].hs.term == leader.term
    assert len(net.delivered) < 200  # no append/reject ping-pong


def test_wiped_follower_acks_count_only_for_entries_it_holds():
    net = _replicated(4)
    leader = net.peers[1].core
    commit = leader.commit
    _lose_disk(net, 3)
    net.drop = lambda m: m.dst == 2 or m.src == 2  # only the wiped follower answers
    leader.propose(data_entry())
    net.pump()
    net.tick(3)
    # Its earlier acks went with its disk; the new entry has one real copy besides ours
    # only once the wiped follower holds everything again.
    pr = leader.progress[3]
    assert pr.match <= net.peers[3].core.log.last_index
    assert leader.commit >= commit
    for index in range(1, leader.commit + 1):
        assert net.peers[3].core.log.term(index) == leader.log.term(index)


def test_rejoining_replica_neither_votes_nor_campaigns_until_whole():
    p = make(1, {1, 2, 3}, rejoining=True)
    p.core.step(Message(MsgType.PRE_VOTE, 2, 1, 5, index=0, log_term=0))
    p.core.step(Message(MsgType.VOTE, 3, 1, 5, index=0, log_term=0))
    out = flush(p)
    assert [m.type for m in out] == [MsgType.PRE_VOTE_RESP, MsgType.VOTE_RESP]
    assert all(m.reject for m in out)
    assert p.hs.vote == 0 and p.hs.rejoining
    for _ in range(100):
        p.core.tick()
    assert p.core.role == Role.FOLLOWER and not flush(p)
    # An append reaching the leader's rejoin point makes it whole again.
    p.core.step(app(2, 1, 5, 0, 0, [stamped(1, 5), stamped(2, 5)]))
    out = flush(p)
    assert out[0].rejoining and not out[0].reject and out[0].index == 2
    assert p.core.rejoining  # no rejoin point in that append: still not whole
    m = app(2, 1, 5, 2, 5, [stamped(3, 5)])
    m.rejoin_to, m.incarnation = 3, p.core.incarnation + 1  # for an earlier life of ours
    p.core.step(m)
    flush(p)
    assert p.core.rejoining
    m = app(2, 1, 5, 2, 5, [stamped(3, 5)])
    m.rejoin_to, m.incarnation = 3, p.core.incarnation
    p.core.step(m)
    flush(p)
    assert not p.core.rejoining and not p.hs.rejoining
    p.core.step(Message(MsgType.VOTE, 3, 1, 6, index=3, log_term=5, context=CAMPAIGN_TRANSFER))
    assert not flush(p)[-1].reject


def test_rejoining_follower_ignores_heartbeat_commit():
    """The leader caps a heartbeat's commit at what it recorded for us, which may be our
    lost log: committing our own, possibly different, entries up to it would be wrong."""
    st = MemoryStorage()
    preload(st, [1, 1, 1])
    p = make(1, {1, 2, 3}, storage=st, hs=HardState(0, 0, 0), rejoining=True)
    p.core.step(Message(MsgType.HEARTBEAT, 2, 1, 4, commit=3))
    out = flush(p)
    assert p.core.commit == 0 and out[0].rejoining


def test_append_carries_the_rejoin_point():
    net = _replicated(3)
    _lose_disk(net, 2)
    net.tick(2)
    apps = [m for m in net.delivered if m.type == MsgType.APP and m.dst == 2]
    assert apps and max(m.rejoin_to for m in apps) == 4  # everything it was counted for
    assert not net.peers[2].core.rejoining


# --------------------------------------------------------------------- corrupt reads
def test_leader_that_cannot_read_an_entry_reports_it_and_hands_leadership_away():
    """A corrupt entry a follower needs must not stop the leader (it stopped the whole
    driver): the core reports it for repair and transfers to a follower that holds all."""
    net = cluster(3)
    net.elect(1)
    net.drop = lambda m: m.dst == 3  # node 3 falls behind
    for _ in range(3):
        net.peers[1].core.propose(data_entry())
    net.pump()
    leader = net.peers[1].core
    storage = net.peers[1].storage
    real = storage.read_entries

    def rotten(lo: int, max_bytes: int, hi: int | None = None) -> bytes:
        if lo <= 3 < (hi or lo + 1_000):
            raise CorruptEntryError("corrupt entry in segment s at byte 0: CRC mismatch")
        return real(lo, max_bytes, hi)

    storage.read_entries = rotten  # type: ignore[method-assign]
    net.drop = lambda m: False
    net.tick(3)
    assert leader.damage is not None and "CRC mismatch" in leader.damage
    assert leader.role != Role.LEADER and net.peers[2].core.role == Role.LEADER


def test_a_delayed_election_lets_the_preferred_replica_win_the_first_one():
    """A new group's non-preferred replicas hold their first election back
    (raftmq.broker.leadership): the preferred one's timer fires first and it wins."""
    net = cluster(3)
    for node in (2, 3):
        net.peers[node].core.delay_election(100)
    net.tick(3 * 10)  # past every undelayed timeout
    assert net.peers[1].core.role == Role.LEADER
    assert {p.core.lead for p in net.peers.values()} == {1}


def test_a_delayed_election_still_comes_when_nobody_else_campaigns():
    net = cluster(3)
    net.drop = lambda m: m.src == 1 or m.dst == 1  # the preferred replica is away
    for node in (2, 3):
        net.peers[node].core.delay_election(20)
    net.tick(2 * 10 - 1, only={2, 3})
    assert all(net.peers[n].core.role == Role.FOLLOWER for n in (2, 3))
    net.tick(20 + 2 * 10, only={2, 3})
    assert {net.peers[n].core.role for n in (2, 3)} == {Role.LEADER, Role.FOLLOWER}


def test_a_delay_asked_again_is_renewed_not_added_to():
    f = cluster(3).peers[2].core
    f.delay_election(100)
    f.delay_election(100)
    assert f.election_elapsed == -100
    f.election_elapsed = -30  # 70 ticks later
    f.delay_election(100)
    assert f.election_elapsed == -100
    f.delay_election(20)  # never shortened
    assert f.election_elapsed == -100


def test_an_ended_delay_lets_the_timer_run_from_now():
    f = cluster(3).peers[2].core
    f.delay_election(100)
    f.end_election_delay()
    assert f.election_elapsed == 0
    f.election_elapsed = 4
    f.end_election_delay()  # not delayed: the timer is left as it is
    assert f.election_elapsed == 4


def test_an_election_is_not_delayed_once_a_leader_is_known():
    net = cluster(3)
    net.elect(1)
    f = net.peers[2].core
    elapsed = f.election_elapsed
    f.delay_election(100)
    assert f.election_elapsed == elapsed


def test_a_candidate_asks_a_voter_that_opened_late_again():
    """The first request went to a node that did not run the group yet (loss); when
    that node announces its open, the candidate asks it again and wins at once."""
    net = cluster(3)
    net.drop = lambda m: m.dst in (2, 3)
    net.peers[1].core.campaign()
    net.pump()
    assert net.peers[1].core.role == Role.PRE_CANDIDATE
    net.drop = lambda m: False
    net.peers[1].core.ask_again(2)
    net.pump()
    assert net.peers[1].core.role == Role.LEADER


def test_asking_again_is_for_unanswered_voters_only():
    net = cluster(3)
    net.drop = lambda m: m.dst == 3
    net.peers[1].core.campaign()
    net.pump()
    leader = net.peers[1].core
    assert leader.role == Role.LEADER
    leader.ask_again(3)  # a leader asks nobody
    assert not [m for m in flush(net.peers[1]) if m.type in (MsgType.VOTE, MsgType.PRE_VOTE)]

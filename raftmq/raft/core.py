"""The Raft state machine of one member of one partition: pure, deterministic, no I/O.

Inputs are :meth:`RaftCore.step` (a message from a peer), :meth:`RaftCore.tick` (time),
and the local requests (propose, transfer, read index, membership). Outputs accumulate
until the driver takes them as a :class:`~raftmq.raft.ready.Ready`; see that module for
the persistence order. Every rule here names the property it protects.
"""

from __future__ import annotations

import random

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.raft import quorum
from raftmq.raft.config import Config
from raftmq.raft.errors import NotLeaderError, ProposalDroppedError
from raftmq.raft.hardstate import HardState
from raftmq.raft.log_view import CompactedError, Ent, RaftLog, join, split
from raftmq.raft.membership import ConfigHistory, Membership
from raftmq.raft.messages import CAMPAIGN_TRANSFER, Message, MsgType, SnapshotMeta
from raftmq.raft.progress import Inflights, Progress, ProgressState
from raftmq.raft.quorum import VoteResult
from raftmq.raft.read_only import ReadIndexQueue
from raftmq.raft.ready import ReadState, Ready, Role, SoftState
from raftmq.raft.storage import Storage

NONE = 0

_SEND_NOW = frozenset({MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP, MsgType.TIMEOUT_NOW})
"""Leader messages that promise nothing about this node's durable state."""

_PROPOSABLE = frozenset(
    {EntryType.DATA, EntryType.TXN_MARKER, EntryType.METADATA, EntryType.SHARE_STATE}
)


def starts_rejoining(
    hard_state: HardState, last_index: int, known_commit: int, *, promised: bool
) -> bool:
    """Whether a replica restarting with this durable state may have lost entries or a
    vote it once acknowledged, so it must rejoin before it votes (docs/raft.md,
    "Rejoining after disk loss").

    ``promised``: the replica is known (from a record kept outside its data directory)
    to have saved a hard state before, i.e. to have voted or acknowledged. Then a zero
    term means the hard state was lost. Without that record a zero term is a new replica,
    which promised nothing and rejoins nothing. A log ending below a commit index the
    replica once recorded lost a committed suffix; and a rejoin a crash interrupted is
    still one.
    """
    return hard_state.rejoining or (promised and hard_state.term == 0) or known_commit > last_index


class RaftCore:
    def __init__(
        self,
        cfg: Config,
        storage: Storage,
        *,
        hard_state: HardState,
        membership: Membership,
        history: ConfigHistory | None = None,
        applied: int | None = None,
        rejoining: bool | None = None,
        incarnation: int = 0,
    ) -> None:
        """Restart from durable state.

        ``membership`` is the configuration at ``storage.start_index - 1`` (the bootstrap
        configuration, or the one saved with the last snapshot); CONFIG entries after it
        are replayed on top of it, which reads the whole log. A driver that saved
        :meth:`config_history` passes it as ``history`` (its end clamped to the log's last
        index and at or below the commit), and only the log after the history's end is
        read; the history must then name ``membership`` at the log's start.
        ``applied`` defaults to the snapshot point: the application is rebuilt by
        re-applying the log. ``rejoining`` (see :func:`starts_rejoining`) defaults to
        the hard state's flag. ``incarnation`` names this life of the replica (a number
        it has not used before, from the driver: a leader's word that a rejoin is complete
        must be about this life, not an earlier one); 0 draws one from the core's seed.
        """
        self.id = cfg.id
        self.cfg = cfg
        self._rng = random.Random(cfg.seed * 1_000_003 + cfg.id)
        start = storage.start_index
        self.log = RaftLog(
            storage,
            committed=hard_state.commit,
            applied=start - 1 if applied is None else applied,
        )
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.rejoining = hard_state.rejoining if rejoining is None else rejoining
        """May have lost acknowledged entries or votes: neither votes nor campaigns, and
        counts for nothing it does not hold, until a leader says it is whole again."""
        self.incarnation = incarnation or self._rng.getrandbits(62) + 1
        self._lead_start = 0
        self.damage: str | None = None
        """Set when a read of our own log for a follower found a corrupt entry; the driver
        takes it (and clears it) to start a repair."""
        self.lead = NONE
        self.role = Role.FOLLOWER
        self._history: list[tuple[int, Membership]] = [(start - 1, membership)]
        base = start - 1
        if history is not None:
            base = history.through
            assert start - 1 <= base <= min(storage.last_index, hard_state.commit), (
                f"configuration history through {base} is not in the committed log"
            )
            assert history.as_of(start - 1) == membership, "history disagrees at the start"
            self._history += [(i, m) for i, m in history.changes if i > start - 1]
        self._replay_configs(storage, base + 1)
        self.progress: dict[int, Progress] = {}
        self._votes: dict[int, bool] = {}
        self._msgs: list[Message] = []
        self._bcast_due = False  # entries appended as leader, not yet sent (see _append_entries)
        self._read_states: list[ReadState] = []
        self._reads = ReadIndexQueue()
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = cfg.election_tick
        self.lead_transferee = NONE
        self.pending_conf_index = 0
        self._prev_soft = SoftState(NONE, Role.FOLLOWER)
        self._prev_hard = hard_state
        self._ready_out = False
        self._snapshot_handed = False
        self._snapshot_data = b""
        self.become_follower(self.term, NONE)

    def _replay_configs(self, storage: Storage, lo: int) -> None:
        last = storage.last_index
        while lo <= last:
            ents = split(storage.read_entries(lo, 1 << 20, last + 1))
            for e in ents:
                if e.type == EntryType.CONFIG:
                    m = Membership.decode(e.data[entry.HEADER_SIZE :])
                    if e.index <= self.log.committed:
                        self._history.append((e.index, m))
                    else:
                        self.log.configs[e.index] = m
            lo = ents[-1].index + 1

    # ------------------------------------------------------------------ properties
    @property
    def commit(self) -> int:
        return self.log.committed

    @property
    def applied(self) -> int:
        return self.log.applied

    @property
    def membership(self) -> Membership:
        """The configuration in force here: the latest in the log, committed or not.

        Using a configuration as soon as it is appended (thesis §4.1) means the members of
        a new configuration never need a removed node to learn that it was committed.
        """
        configs = self.log.configs
        return configs[max(configs)] if configs else self._history[-1][1]

    def promotable(self) -> bool:
        """Only voters campaign, so learners and removed nodes never disrupt a term.

        A node whose removal is appended but not committed still counts: the committed
        configuration may need it to elect the leader that commits its removal.
        """
        return self.id in self.membership.voters or self.id in self._history[-1][1].voters

    def config_history(self) -> ConfigHistory | None:
        """The committed configurations from the log's start through the last committed
        index that storage already holds, for the driver to save next to its commit hint
        (see :class:`ConfigHistory`); None while a received snapshot awaits persistence.

        Why not through the commit index: entries accepted but not yet handed to storage
        may replace a conflicting suffix of it, and a restart must never count those old
        entries, which a crash would leave behind, as committed.
        """
        log = self.log
        if log.pending_snapshot is not None:
            return None
        through = min(log.committed, log.unstable_offset - 1)
        start = log.first_index - 1
        keep = 0
        for k, (i, _) in enumerate(self._history):
            if i <= start:
                keep = k
        changes = tuple((i, m) for i, m in self._history[keep:] if i <= through)
        return ConfigHistory(through, changes)

    def membership_at(self, index: int) -> Membership:
        """The committed configuration in force at ``index`` (for a snapshot's metadata)."""
        found = self._history[0][1]
        for i, m in self._history:
            if i > index:
                break
            found = m
        return found

    # ------------------------------------------------------------------ sending
    def _send(self, m: Message) -> None:
        assert m.dst != self.id
        if m.type not in (MsgType.PRE_VOTE, MsgType.PRE_VOTE_RESP):
            # Pre-vote messages speak of a future term; everything else is of ours.
            assert m.term == self.term or m.type == MsgType.APP_RESP, m
        self._msgs.append(m)

    # ------------------------------------------------------------------ roles
    def _reset(self, term: int) -> None:
        if term != self.term:
            assert term > self.term, "terms only grow"
            self.term = term
            self.vote = NONE  # a vote is of one term; never reset within it
            # An unsent grant for an older term is useless now, and its promise (our
            # durable vote in that term) is about to be overwritten by the new term.
            self._msgs = [
                m for m in self._msgs if not (m.type == MsgType.VOTE_RESP and not m.reject)
            ]
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self.cfg.election_tick + self._rng.randrange(
            self.cfg.election_tick
        )
        self.lead_transferee = NONE
        self._votes = {}
        self._reads.clear()
        self.progress = {}
        last = self.log.last_index
        for node in self.membership.members | {self.id}:
            self.progress[node] = self._new_progress(node, last + 1)
        self.pending_conf_index = 0
        self._bcast_due = False  # appends owed as the old leader go to no one now

    def _new_progress(self, node: int, next_index: int) -> Progress:
        inflights = Inflights(self.cfg.max_inflight_msgs, self.cfg.max_inflight_bytes)
        return Progress(next_index, inflights, is_learner=node in self.membership.learners)

    def become_follower(self, term: int, lead: int) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def _become_pre_candidate(self) -> None:
        assert self.role != Role.LEADER
        # Pre-vote changes neither term nor vote: a partitioned node that keeps failing
        # pre-votes cannot inflate the cluster's term when it rejoins.
        self._votes = {}
        self.lead = NONE
        self.role = Role.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        assert self.role != Role.LEADER
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def _become_leader(self) -> None:
        assert self.role == Role.CANDIDATE and self.vote == self.id
        assert self.log.pending_snapshot is None
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        assert not self.rejoining, "a rejoining replica never campaigns"
        self._lead_start = self.log.last_index + 1  # where our no-op goes
        me = self.progress[self.id]
        me.become_replicate()
        me.match = self.log.unstable_offset - 1  # only what is durable here counts
        me.next = self.log.last_index + 1
        # No config change until every entry of earlier terms is committed (which the
        # no-op below forces): this closes the single-server-change bug of two leaders
        # in successive terms each committing a change from the same base.
        self.pending_conf_index = self.log.last_index
        # Entries of earlier terms commit only indirectly, through one of ours (§5.4.2).
        self._append_entries([self._control(EntryType.NOOP, b"")])

    # ------------------------------------------------------------------ time
    def tick(self) -> None:
        if self.role == Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()
        self._check_invariants()

    def _check_invariants(self) -> None:
        """Cheap facts that must hold after every input; a violation is a bug, so crash."""
        log = self.log
        assert log.applied <= log.committed <= log.last_index, (
            log.applied,
            log.committed,
            log.last_index,
        )
        assert self.term >= self._prev_hard.term, "the term went back below a durable one"
        if self.term == self._prev_hard.term and self._prev_hard.vote != NONE:
            assert self.vote == self._prev_hard.vote, "a durable vote changed within its term"
        if self.role == Role.LEADER:
            assert self.lead == self.id and self.vote == self.id
            last = log.last_index
            for pr in self.progress.values():
                assert pr.match <= last and pr.next >= pr.match + 1, pr
            assert self.progress[self.id].match <= log.unstable_offset - 1
        elif self.role == Role.CANDIDATE:
            assert self.vote == self.id

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.promotable() and self.election_elapsed >= self.randomized_timeout:
            self.election_elapsed = 0
            self.campaign()

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                # A leader cut off from a majority steps down, so clients stop trusting
                # it and a read index is never served by a deposed leader for long.
                self.become_follower(self.term, NONE)
                return
            for node, pr in self.progress.items():
                pr.recent_active = node == self.id
            if self.lead_transferee != NONE:
                self.lead_transferee = NONE  # the transfer did not finish: resume
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat(self._last_read_ctx())

    def _quorum_active(self) -> bool:
        return quorum.has_quorum(
            self.membership.voters,
            lambda node: (
                node == self.id or (node in self.progress and self.progress[node].recent_active)
            ),
        )

    # ------------------------------------------------------------------ elections
    def campaign(self, *, transfer: bool = False) -> None:
        """Start an election now (what an election timeout does)."""
        if self.role == Role.LEADER or not self.promotable():
            return
        if self.log.pending_snapshot is not None:
            return  # not even our own log is known durable yet
        if self.rejoining:
            return  # our own vote would count entries we may have lost
        if not self.cfg.pre_vote or transfer:
            self._campaign_real(transfer=transfer)
            return
        self._become_pre_candidate()
        if self._poll(self.id, True) is VoteResult.WON:
            self._campaign_real(transfer=False)
            return
        self._request_votes(MsgType.PRE_VOTE, self.term + 1, b"")

    def _campaign_real(self, *, transfer: bool) -> None:
        """The election proper, with a bumped term (after a won pre-vote, or forced)."""
        self._become_candidate()
        if self._poll(self.id, True) is VoteResult.WON:
            self._become_leader()
            return
        self._request_votes(MsgType.VOTE, self.term, CAMPAIGN_TRANSFER if transfer else b"")

    def _request_votes(
        self, vote_type: MsgType, term: int, ctx: bytes, to: frozenset[int] | None = None
    ) -> None:
        for node in sorted(self.membership.voters if to is None else to):
            if node != self.id:
                self._send(
                    Message(
                        vote_type,
                        self.id,
                        node,
                        term,
                        log_term=self.log.last_term,
                        index=self.log.last_index,
                        context=ctx,
                    )
                )

    def ask_again(self, node: int) -> None:
        """Ask voter ``node`` again for the vote this (pre-)candidate asked it for, if it
        has not answered: it just opened its replica of the group, so its node dropped the
        first request (a group it did not run yet is loss to it). Without this the
        candidate waited for its next election timeout, while the other replicas' timers
        ran too (a topic's creation opens its replicas on every broker at once).

        Safe: a voter answers a repeated request of the same term as it answered the
        first (one vote per term), and a pre-vote changes nothing."""
        if node == self.id or node not in self.membership.voters or node in self._votes:
            return
        if self.role == Role.PRE_CANDIDATE:
            self._request_votes(MsgType.PRE_VOTE, self.term + 1, b"", frozenset({node}))
        elif self.role == Role.CANDIDATE:
            self._request_votes(MsgType.VOTE, self.term, b"", frozenset({node}))

    def delay_election(self, ticks: int) -> None:
        """Let this follower's election timer start no sooner than ``ticks`` from now,
        unless it knows a leader or is already in an election (asked again, the delay is
        renewed, not added to). For a replica that must give another one the first
        chance to lead (the broker's preferred replica: raftmq.broker.leadership): any
        message from a leader or candidate restarts the timer as usual, so this only
        delays an election nobody else started."""
        if self.role == Role.FOLLOWER and self.lead == NONE and ticks > 0:
            self.election_elapsed = min(self.election_elapsed, -ticks)

    def end_election_delay(self) -> None:
        """Undo :meth:`delay_election`: the timer runs from now as usual (a follower that
        knows no leader and was holding back)."""
        if self.role == Role.FOLLOWER and self.lead == NONE and self.election_elapsed < 0:
            self.election_elapsed = 0

    def _poll(self, node: int, granted: bool) -> VoteResult:
        if node in self.membership.voters:  # learners' answers never count
            self._votes.setdefault(node, granted)
        return quorum.vote_result(self.membership.voters, self._votes)

    # ------------------------------------------------------------------ step
    def step(self, m: Message) -> None:
        assert m.dst == self.id, m
        if m.term > self.term:
            if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
                in_lease = (
                    self.cfg.check_quorum
                    and self.lead != NONE
                    and self.election_elapsed < self.cfg.election_tick
                )
                if in_lease and m.context != CAMPAIGN_TRANSFER:
                    # Leader stickiness: we heard from a live leader within the minimum
                    # election timeout, so this candidate cannot be needed.
                    return
            if m.type == MsgType.PRE_VOTE:
                pass  # never change our term for a pre-vote
            elif m.type == MsgType.PRE_VOTE_RESP and not m.reject:
                pass  # the future term we asked about; adopted when we win
            elif m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
                self.become_follower(m.term, m.src)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if m.type in (MsgType.APP, MsgType.HEARTBEAT):
                # Tell a stale leader about our term so it steps down; without this a
                # leader partitioned away and back, with check-quorum, could linger.
                self._send(Message(MsgType.APP_RESP, self.id, m.src, self.term))
            elif m.type == MsgType.PRE_VOTE:
                self._send(Message(MsgType.PRE_VOTE_RESP, self.id, m.src, self.term, reject=True))
            return

        if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
            self._handle_vote_request(m)
        elif self.role == Role.LEADER:
            self._step_leader(m)
        elif self.role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)
        self._activate_committed_configs()
        self._check_invariants()

    def _handle_vote_request(self, m: Message) -> None:
        resp_type = MsgType.VOTE_RESP if m.type == MsgType.VOTE else MsgType.PRE_VOTE_RESP
        can_vote = (
            self.vote == m.src
            or (self.vote == NONE and self.lead == NONE)
            or (m.type == MsgType.PRE_VOTE and m.term > self.term)
        )
        if self.rejoining:
            can_vote = False  # we may have acknowledged what this candidate lacks
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # The grant carries the candidate's term: a pre-vote grant is about a term we
            # are not in, and the candidate must not drop it as stale.
            self._msgs.append(Message(resp_type, self.id, m.src, m.term))
            if m.type == MsgType.VOTE:
                self.election_elapsed = 0
                assert self.vote in (NONE, m.src), "one vote per term"
                self.vote = m.src  # sent only after the Ready that persists it
        else:
            self._msgs.append(Message(resp_type, self.id, m.src, self.term, reject=True))

    def _resp(self, t: MsgType, to: int, **fields: object) -> Message:
        """A response to the leader; a rejoining follower says so on each one."""
        if not self.rejoining:
            return Message(t, self.id, to, self.term, **fields)  # type: ignore[arg-type]
        return Message(
            t,
            self.id,
            to,
            self.term,
            rejoining=True,
            incarnation=self.incarnation,
            **fields,  # type: ignore[arg-type]
        )

    def _step_candidate(self, m: Message) -> None:
        my_resp = MsgType.PRE_VOTE_RESP if self.role == Role.PRE_CANDIDATE else MsgType.VOTE_RESP
        if m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
            self.become_follower(m.term, m.src)  # a leader of our term exists
            self._step_follower(m)
        elif m.type == my_resp:
            if self.role == Role.PRE_CANDIDATE and m.term != self.term + 1 and not m.reject:
                return
            result = self._poll(m.src, not m.reject)
            if result is VoteResult.WON:
                if self.role == Role.PRE_CANDIDATE:
                    self._campaign_real(transfer=False)
                else:
                    self._become_leader()
            elif result is VoteResult.LOST:
                self.become_follower(self.term, NONE)
        elif m.type == MsgType.TIMEOUT_NOW:
            pass  # already campaigning

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MsgType.APP:
            self.election_elapsed = 0
            self.lead = m.src
            self._handle_append(m)
        elif t == MsgType.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.src
            if not self.rejoining:
                # A heartbeat's commit is capped at what the leader recorded for us,
                # which for a rejoining replica may describe a log it no longer has.
                self.log.commit_to(min(m.commit, self.log.last_index))
            self._msgs.append(self._resp(MsgType.HEARTBEAT_RESP, m.src, context=m.context))
        elif t == MsgType.SNAP:
            self.election_elapsed = 0
            self.lead = m.src
            self._handle_snapshot(m)
        elif t == MsgType.TIMEOUT_NOW:
            # The leader picked us and our log is complete: skip pre-vote and lease.
            self.campaign(transfer=True)
        elif t == MsgType.READ_INDEX_RESP:
            self._read_states.append(ReadState(m.index, m.context))

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            # Everything up to our commit already matches; say so rather than reject.
            self._msgs.append(self._resp(MsgType.APP_RESP, m.src, index=self.log.committed))
            return
        try:
            # Trust boundary: the peer edge. The one CRC pass over a leader's entries on
            # this node (write_to_storage tells the log not to repeat it).
            ents = split(m.entries, verify=True)
        except (InvalidEntryError, CorruptEntryError):
            return  # corrupted in transit: the leader will retry
        assert all(e.index == m.index + 1 + i for i, e in enumerate(ents)), "contiguous"
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, ents)
        if self.log.truncated_from is not None:
            self._drop_acks_from(self.log.truncated_from)
            self.log.truncated_from = None
        if last_new is not None:
            self._msgs.append(self._resp(MsgType.APP_RESP, m.src, index=last_new))
            if self.rejoining and m.incarnation == self.incarnation and last_new >= m.rejoin_to > 0:
                # We now hold the leader's log through every index we could have
                # acknowledged to it, or that it counted us for: whole again.
                self.rejoining = False
            return
        hint_index, hint_term = self.log.find_conflict_by_term(
            min(m.index, self.log.last_index), m.log_term
        )
        self._msgs.append(
            self._resp(
                MsgType.APP_RESP,
                m.src,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                log_term=hint_term,
            )
        )

    def _drop_acks_from(self, index: int) -> None:
        """Forget unsent acks for entries we just discarded.

        They were made when we held those entries, but would only go out after the
        truncation is durable: an old leader could then count a replica that no longer
        exists and commit an entry a quorum does not hold.
        """
        self._msgs = [
            m
            for m in self._msgs
            if not (m.type == MsgType.APP_RESP and not m.reject and m.index >= index)
        ]

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        assert snap is not None
        if snap.index <= self.log.committed:
            pass
        elif self.log.match_term(snap.index, snap.term):
            self.log.commit_to(snap.index)  # we hold its prefix: just fast-forward
        else:
            self._drop_acks_from(self.log.committed + 1)
            self.log.restore(snap)
            self._history = [(snap.index, snap.membership)]
            self._snapshot_data = m.data
            self._snapshot_handed = False
            self._msgs.append(self._resp(MsgType.APP_RESP, m.src, index=snap.index))
            return
        self._msgs.append(self._resp(MsgType.APP_RESP, m.src, index=self.log.committed))

    # ------------------------------------------------------------------ leader
    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.src)
        t = m.type
        if t == MsgType.READ_INDEX:
            self._handle_read_index(m.src, m.context)
            return
        if pr is None:
            return
        if m.rejoining and m.incarnation != pr.rejoin_incarnation:
            # A new life of this follower after a disk loss. Its earlier lives' messages
            # came before this one's (a restart closes connections), so every index we
            # counted it for is known now: it must hold our log that far.
            pr.rejoin_incarnation = m.incarnation
            pr.rejoin_to = max(pr.rejoin_to, pr.match, self._lead_start)
        if t == MsgType.APP_RESP:
            pr.recent_active = True
            self._handle_append_resp(m, pr)
        elif t == MsgType.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state == ProgressState.REPLICATE and pr.inflights.full():
                pr.inflights.free_first_one()
            if pr.match < self.log.last_index or m.rejoining:
                # A rejoining follower leaves that state only through an append (which
                # may also show that it lost entries): send one even with nothing new.
                self._send_append(m.src)
            if m.context:
                self._ack_read(m.src, m.context)

    def _went_back(self, m: Message, pr: Progress) -> bool:
        """A rejection whose hint (the follower's real end, or below) is under what we
        recorded as matching: its log lost entries it acknowledged (a wiped, truncated or
        restored disk; docs/raft.md, "Rejoining after disk loss"). A live follower never
        answers so, since it matches us through ``match``; a reordered old rejection may,
        and acting on it merely re-sends some entries.

        Forget what we recorded (its old acks must not count toward a commit any more)
        and probe from its real end. What we counted it for stays in ``rejoin_to``: it
        must hold our log that far before it may vote again. True when handled here."""
        if not m.reject or m.reject_hint >= pr.match:
            return False
        pr.rejoin_to = max(pr.rejoin_to, pr.match)
        probe = m.reject_hint
        if m.log_term > 0:
            probe, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
        pr.forget(probe + 1)
        self._send_append(m.src)
        return True

    def _handle_append_resp(self, m: Message, pr: Progress) -> None:
        if self._went_back(m, pr):
            return
        if m.reject:
            probe = m.reject_hint
            if m.log_term > 0:
                probe, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decrease_to(m.index, probe):
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.src)
            return
        was_paused = pr.is_paused()
        if not (
            pr.maybe_update(m.index) or (pr.match == m.index and pr.state == ProgressState.PROBE)
        ):
            return
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state == ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        # A new commit is not broadcast: it rides on the next append or heartbeat (see
        # docs/raft.md, "How followers learn the commit"), not on messages of its own.
        self._maybe_commit()
        if was_paused or pr.next <= self.log.last_index:
            self._send_append(m.src, send_if_empty=False)
        if m.src == self.lead_transferee and pr.match == self.log.last_index:
            self._send(Message(MsgType.TIMEOUT_NOW, self.id, m.src, self.term))

    def _maybe_commit(self) -> bool:
        quorum_match = quorum.committed_index(
            self.membership.voters, lambda n: self.progress[n].match
        )
        # maybe_commit refuses an index of an older term: counting replicas of an old
        # entry can commit it after it was already superseded (Figure 8).
        committed = self.log.maybe_commit(quorum_match, self.term)
        if committed:
            self._activate_committed_configs()
            self._release_waiting_reads()
        return committed

    def _send_append(self, to: int, *, send_if_empty: bool = True) -> None:
        """Send to ``to`` as much as its state and window allow (pipelined in REPLICATE)."""
        pr = self.progress[to]
        sent = False
        while not pr.is_paused():
            prev = pr.next - 1
            try:
                prev_term = self.log.term(prev)
                ents = self.log.entries(pr.next, self.cfg.max_append_bytes)
            except CompactedError:
                self._send_snapshot(to, pr)
                return
            except CorruptEntryError as exc:
                self._found_damage(exc)
                return
            if not ents and (sent or not send_if_empty):
                return
            data = join(ents)
            self._send(
                Message(
                    MsgType.APP,
                    self.id,
                    to,
                    self.term,
                    log_term=prev_term,
                    index=prev,
                    entries=data,
                    commit=self.log.committed,
                    rejoin_to=self._rejoin_to(pr),
                    incarnation=pr.rejoin_incarnation,
                )
            )
            sent = True
            if ents:
                pr.sent_entries(ents[-1].index, len(data))
            elif pr.state == ProgressState.PROBE:
                pr.probe_sent = True
            if pr.state != ProgressState.REPLICATE or not ents:
                return

    def _found_damage(self, exc: CorruptEntryError) -> None:
        """Our stored copy of entries a follower needs failed its CRC. Report it (the
        driver repairs the range from a replica, raftmq/log/repair.py) and, as leader,
        hand leadership to a follower that holds everything, since we cannot serve the
        range until then. Sending to this follower resumes on its next answer."""
        self.damage = str(exc)
        if self.role == Role.LEADER and self.lead_transferee == NONE:
            last = self.log.last_index
            whole = [
                n
                for n in sorted(self.membership.voters)
                if n != self.id and n in self.progress and self.progress[n].match == last
            ]
            if whole:
                self.transfer_leadership(whole[0])

    def _rejoin_to(self, pr: Progress) -> int:
        """Through which index the rejoining life ``pr.rejoin_incarnation`` of a follower
        must hold our log to vote again (0 while we know of none): every index we counted
        it for (acks of its lives before the loss included), and our first index as
        leader, below which lie the entries committed in earlier terms (possibly counting
        its old acks too)."""
        if not pr.rejoin_incarnation:
            return 0
        return max(pr.rejoin_to, pr.match, self._lead_start)

    def _send_snapshot(self, to: int, pr: Progress) -> None:
        if not pr.recent_active:
            return  # do not start a big transfer to a peer that may be down
        snap = self.snapshot_meta()
        pr.become_snapshot(snap.index)
        self._send(Message(MsgType.SNAP, self.id, to, self.term, snapshot=snap))

    def snapshot_meta(self) -> SnapshotMeta:
        """Metadata of the snapshot point: the entry just before the log's start."""
        storage = self.log.storage
        index = storage.start_index - 1
        if storage.last_index >= storage.start_index:
            offset = entry.parse_header(storage.read_entries(storage.start_index, 1)).base_offset
        else:
            offset = storage.next_offset
        return SnapshotMeta(index, storage.term_at(index), offset, self.membership_at(index))

    def _bcast_append(self) -> None:
        for node in sorted(self.progress):
            if node != self.id:
                self._send_append(node)

    def _bcast_heartbeat(self, ctx: bytes = b"") -> None:
        for node in sorted(self.progress):
            if node != self.id:
                self._send(self.heartbeat_for(node, ctx))

    def heartbeat_for(self, to: int, ctx: bytes = b"") -> Message:
        """A leader's heartbeat to ``to``. Public for the driver, which probes a follower
        it believes dead at a low rate while the group is quiesced (see docs/driver.md)."""
        assert self.role == Role.LEADER and to != self.id
        # Never tell a follower to commit past what it is known to hold.
        commit = min(self.progress[to].match, self.log.committed)
        return Message(MsgType.HEARTBEAT, self.id, to, self.term, commit=commit, context=ctx)

    # ------------------------------------------------------------------ proposals
    def _control(self, etype: EntryType, payload: bytes) -> Ent:
        return Ent(0, 0, etype, 0, entry.encode(payload, type=etype))

    def _append_entries(self, ents: list[Ent]) -> int:
        assert self.role == Role.LEADER
        index = self.log.last_index
        offset = self.log.next_offset
        stamped = []
        for e in ents:
            index += 1
            rc = _record_count(e)
            data = entry.stamp(e.data, index=index, term=self.term, base_offset=offset)
            offset += rc
            stamped.append(Ent(index, self.term, e.type, offset, data))
        self.log.append(stamped)
        # Sent with the next Ready, not now: every proposal made before it then shares one
        # append per follower (and one ack back) instead of one each. Nothing leaves
        # earlier either way, since messages only go out through ready().
        self._bcast_due = True
        return index

    def propose(self, buf: bytes) -> int:
        """Append client entries (encoded, unstamped); returns the last index assigned.

        The index is not a promise: the entry is committed only if a later Ready's
        committed entries contain it (with this term).
        """
        if self.role != Role.LEADER:
            raise NotLeaderError(self.lead)
        if self.lead_transferee != NONE:
            raise ProposalDroppedError("leadership transfer in progress")
        # No CRC pass: proposals come from this process, and a producer's batch was checked
        # at the client edge (raftmq/partition/batch_check.py); stamping recomputes it.
        ents = split(buf, verify=False)
        if not ents:
            raise InvalidEntryError("the request holds no entries")
        for e in ents:
            if e.type not in _PROPOSABLE:
                raise InvalidEntryError(
                    f"an entry is of type {EntryType(e.type).name}, which only Raft itself writes"
                )
            if e.index or e.term:
                raise InvalidEntryError(
                    f"an entry has index {e.index} and term {e.term}; a producer leaves both 0 "
                    "(the leader assigns them)"
                )
        return self._append_entries(ents)

    def config_change_pending(self) -> bool:
        """A leader would refuse a configuration change now: one is still uncommitted."""
        return self.pending_conf_index > self.log.committed or bool(self.log.configs)

    def propose_membership(self, new: Membership) -> int:
        """Propose a single-server change; it takes effect on each node once appended."""
        if self.role != Role.LEADER:
            raise NotLeaderError(self.lead)
        if self.config_change_pending():
            # One change at a time, and not before this term's no-op commits: otherwise
            # two leaders could each commit a change from the same base (thesis §4.1 bug).
            raise ProposalDroppedError("a configuration change is still uncommitted")
        old = self.membership
        if not new.is_single_step_from(old):
            raise ProposalDroppedError("change one voter at a time")
        if not new.voters:
            raise ProposalDroppedError("a cluster needs a voter")
        for node in new.voters & old.learners:
            # A learner is promoted only once it holds everything committed, so that
            # adding it to the quorum cannot stall commits while it catches up.
            if self.progress[node].match < self.log.committed:
                raise ProposalDroppedError(f"learner {node} has not caught up")
        index = self._append_entries([self._control(EntryType.CONFIG, new.encode())])
        self.pending_conf_index = index
        last = self.log.last_index
        for node in new.members:
            if node not in self.progress:
                pr = self._new_progress(node, last)
                pr.recent_active = True  # give a new member one election timeout
                self.progress[node] = pr
                self._send_append(node)
            self.progress[node].is_learner = node in new.learners
        for node in [n for n in self.progress if n not in new.members and n != self.id]:
            del self.progress[node]
        # A smaller quorum may already hold more entries.
        if self._maybe_commit():
            self._bcast_append()
        return index

    def _activate_committed_configs(self) -> None:
        configs = self.log.configs
        while configs:
            index = min(configs)
            if index > self.log.committed:
                break
            m = configs.pop(index)
            self._history.append((index, m))
            if self.role == Role.LEADER and self.id not in m.voters:
                # A removed leader manages the new configuration until it commits, then
                # steps down; the new members hold the entry and elect among themselves.
                self.become_follower(self.term, NONE)

    # ------------------------------------------------------------------ transfer
    def transfer_leadership(self, to: int) -> None:
        if self.role != Role.LEADER:
            raise NotLeaderError(self.lead)
        if to == self.id or to not in self.membership.voters:
            raise ProposalDroppedError(f"cannot transfer leadership to {to}")
        self.lead_transferee = to
        self.election_elapsed = 0  # the transfer must finish within an election timeout
        pr = self.progress[to]
        if pr.match == self.log.last_index:
            self._send(Message(MsgType.TIMEOUT_NOW, self.id, to, self.term))
        else:
            self._send_append(to)

    # ------------------------------------------------------------------ read index
    def read_index(self, ctx: bytes) -> None:
        """Ask for a linearizable read point; it arrives as a ReadState in a later Ready.

        ``ctx`` must be unique among outstanding requests. If leadership changes the
        request is silently dropped; the caller retries on timeout.
        """
        assert ctx, "read contexts must be non-empty"
        if self.role == Role.LEADER:
            self._handle_read_index(self.id, ctx)
        elif self.lead != NONE:
            self._msgs.append(
                Message(MsgType.READ_INDEX, self.id, self.lead, self.term, context=ctx)
            )
        else:
            raise NotLeaderError(NONE)

    def _committed_in_term(self) -> bool:
        return self.log.term(self.log.committed) == self.term

    def _handle_read_index(self, src: int, ctx: bytes) -> None:
        if not self._committed_in_term():
            # Our commit index may lag the true one until our no-op commits.
            self._reads.waiting.append((src, ctx))
            return
        self._reads.add(src, ctx, self.log.committed)
        if self.id in self.membership.voters:
            self._ack_read(self.id, ctx)  # may already be a quorum of one
        if self._reads.last_context() == ctx:
            # Leadership is confirmed by a quorum answering a heartbeat sent after this.
            self._bcast_heartbeat(ctx)

    def _release_waiting_reads(self) -> None:
        if self._reads.waiting and self._committed_in_term():
            waiting, self._reads.waiting = self._reads.waiting, []
            for src, ctx in waiting:
                self._handle_read_index(src, ctx)

    def _last_read_ctx(self) -> bytes:
        return self._reads.last_context()

    def _ack_read(self, node: int, ctx: bytes) -> None:
        m = self.membership
        for src, c, index in self._reads.ack(node, ctx, m.voters, m.quorum()):
            self._respond_read(src, c, index)

    def _respond_read(self, src: int, ctx: bytes, index: int) -> None:
        if src == self.id:
            self._read_states.append(ReadState(index, ctx))
        else:
            self._msgs.append(
                Message(MsgType.READ_INDEX_RESP, self.id, src, self.term, index=index, context=ctx)
            )

    # ------------------------------------------------------------------ reports
    def report_unreachable(self, to: int) -> None:
        """The transport failed to deliver to ``to``: stop optimistic streaming."""
        pr = self.progress.get(to)
        if self.role == Role.LEADER and pr is not None and pr.state == ProgressState.REPLICATE:
            pr.become_probe()

    def report_snapshot(self, to: int, *, ok: bool) -> None:
        """The transport finished (or gave up) streaming a snapshot to ``to``."""
        pr = self.progress.get(to)
        if self.role != Role.LEADER or pr is None or pr.state != ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True  # wait for the follower's ack (or a heartbeat) to resume

    # ------------------------------------------------------------------ ready
    def _soft(self) -> SoftState:
        return SoftState(self.lead, self.role)

    def _hard(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed, self.rejoining)

    def has_ready(self) -> bool:
        if self._ready_out:
            return False
        return bool(
            self._msgs
            or self._bcast_due
            or self._read_states
            or self.log.unstable
            or (self.log.pending_snapshot is not None and not self._snapshot_handed)
            or self.log.committed > self.log.applied
            or self._hard() != self._prev_hard
            or self._soft() != self._prev_soft
        )

    def ready(self) -> Ready:
        assert not self._ready_out, "advance the previous Ready first"
        if self._bcast_due:
            self._bcast_due = False
            if self.role == Role.LEADER:
                self._bcast_append()
        rd = Ready()
        soft = self._soft()
        if soft != self._prev_soft:
            rd.soft_state = soft
            self._prev_soft = soft
        hard = self._hard()
        if hard != self._prev_hard:
            rd.hard_state = hard
        log = self.log
        snap = log.pending_snapshot
        if snap is not None and not self._snapshot_handed:
            rd.snapshot = snap
            rd.snapshot_data = self._snapshot_data
            rd.applied_to = snap.index
            self._snapshot_handed = True
        if log.unstable:
            rd.entries = join(log.unstable)
            rd.first_index = log.unstable_offset
            rd.last_index = log.unstable[-1].index
            rd.last_term = log.unstable[-1].term
        if snap is None and log.committed > log.applied:
            if self.cfg.apply_entries:
                ents = log.entries(log.applied + 1, self.cfg.max_apply_bytes, log.committed + 1)
                rd.committed_entries = join(ents)
                rd.applied_to = ents[-1].index
            else:
                rd.applied_to = log.committed
        # Leader messages may overtake the write unless this Ready changes term or vote.
        now_ok = hard.term == self._prev_hard.term and hard.vote == self._prev_hard.vote
        rd.sync = bool(rd.entries) or rd.snapshot is not None or not now_ok
        for m in self._msgs:
            (rd.send_now if now_ok and m.type in _SEND_NOW else rd.messages).append(m)
        self._msgs = []
        rd.read_states, self._read_states = self._read_states, []
        self._ready_out = True
        return rd

    def advance(self, rd: Ready) -> None:
        """Everything in ``rd`` is durable, sent and applied."""
        assert self._ready_out
        self._ready_out = False
        if rd.hard_state is not None:
            self._prev_hard = rd.hard_state
        if rd.snapshot is not None and self.log.pending_snapshot == rd.snapshot:
            self.log.pending_snapshot = None
            self._snapshot_data = b""
            self.log.applied = max(self.log.applied, rd.snapshot.index)
        if rd.entries:
            self.log.stable_to(rd.last_index, rd.last_term)
        if rd.snapshot is None and rd.applied_to:
            assert rd.applied_to > self.log.applied
            self.log.applied = rd.applied_to
        if self.role == Role.LEADER:
            # The local "append acknowledged": our own copy now counts toward commit.
            me = self.progress[self.id]
            me.maybe_update(self.log.unstable_offset - 1)
            self._maybe_commit()  # followers learn it later: see _handle_append_resp
        self._check_invariants()


def _record_count(e: Ent) -> int:
    return entry.parse_header(e.data).record_count

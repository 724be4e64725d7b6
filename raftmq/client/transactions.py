"""The transactional producer's side of a transaction (docs/transactions.md): its state,
its calls to the coordinator (transactions.proto, on the controller quorum's leader), and
which of its errors a user must tell apart.

A transaction goes: ``init`` once (InitTransactions: the producer id, a new epoch, every
older instance fenced), then per transaction ``begin`` (local), sends (each partition is
added with AddPartitionsToTxn before its first batch goes: the engine holds the batch
until then, and adds all partitions that wait at once), offsets
(AddOffsetsToTxn), and ``end`` (EndTxn commit or abort, which answers the epoch of the
next transaction: the coordinator moves it at every end, so the partitions fence any late
batch of the ended one).

Three kinds of error (ErrorCode comments in broker.proto):

- retriable ones (a controller failover, the previous transaction still ending) are
  retried here until ``deadline_s``;
- abortable ones (:class:`TransactionAbortableError`): a batch that failed, a partition or
  offsets the coordinator refused, the coordinator's own abort (timeout): the user
  aborts and begins again, and sends only go on after that;
- fatal ones (:class:`ProducerFencedError`): another instance took the transactional id;
  this producer must be closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import TypedDict

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from raftmq.client.connections import Connections
from raftmq.client.errors import ClientError
from raftmq.client.group_link import GroupLink, OffsetAndMetadata, by_topic
from raftmq.client.idempotence import Sequencer

Key = tuple[str, int]
_RETRY = frozenset({pb.ERROR_CODE_CONCURRENT_TRANSACTIONS})
_FATAL = frozenset(
    {
        pb.ERROR_CODE_PRODUCER_FENCED,
        pb.ERROR_CODE_INVALID_TRANSACTIONAL_ID,
        pb.ERROR_CODE_INVALID_TXN_TIMEOUT,
    }
)


class _Ids(TypedDict):
    transactional_id: str
    producer_id: int
    producer_epoch: int


class TransactionState(StrEnum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"


class TransactionAbortableError(ClientError):
    """The transaction cannot commit: call ``abort_transaction()``, then begin a new one
    and do its work again (what it wrote stays invisible to read_committed readers)."""


class ProducerFencedError(ClientError):
    """Another producer with the same transactional id called ``init_transactions`` (or
    this one's settings are refused for good): close this producer."""


class TransactionStateError(RuntimeError):
    """A call out of order, e.g. ``send`` before ``begin_transaction``: a bug in the
    caller, not a broker's refusal."""


def _as(kind: type[ClientError], err: ClientError, why: str = "") -> ClientError:
    return kind(f"{why}{err}", err.code, err.status, err.meta, err.code_name)


class TransactionManager:
    """Create and use it on the producer engine's event loop (its ``Connections``)."""

    def __init__(
        self,
        transactional_id: str,
        timeout_ms: int,
        links: Connections,
        sequencer: Sequencer,
        *,
        deadline_s: float,
        wake: Callable[[], None],
    ) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.sequencer = sequencer
        self.deadline_s = deadline_s
        self._link = GroupLink(links, deadline_s=deadline_s)
        self._wake = wake
        self.state = TransactionState.UNINITIALIZED
        self.error: ClientError | None = None
        """Why the transaction must be aborted (ABORTABLE_ERROR) or the producer closed."""
        self.added: set[Key] = set()
        self._waiting: set[Key] = set()
        """Partitions to ask for in the next AddPartitionsToTxn (one is scheduled)."""
        self._asking: set[Key] = set()
        """Partitions waiting for or in an AddPartitionsToTxn (not asked for again)."""
        self._generation = 0
        """Counts transactions: an answer to a call of an ended one is dropped."""
        self._adding: set[asyncio.Task[None]] = set()
        """The AddPartitionsToTxn calls in flight: each asks for what waited when it began
        (the partitions met in one turn of the engine), without waiting for the others."""
        self._begun = False
        """The coordinator may hold an open transaction of ours: a partition or offsets
        were asked to be added (even if the answer never came)."""

    # --- the calls ----------------------------------------------------------------------

    async def _call(self, rpc: str, request: object) -> object:
        return await self._link.call(
            rpc, request, service=tpb_grpc.TransactionsStub, also_retry=_RETRY
        )

    @property
    def _ids(self) -> _Ids:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.sequencer.producer_id,
            "producer_epoch": self.sequencer.producer_epoch,
        }

    async def init(self) -> None:
        """InitTransactions: fences older instances; aborts what they left open."""
        if self.state not in (TransactionState.UNINITIALIZED, TransactionState.READY):
            raise TransactionStateError(
                f"init_transactions() is called once, before the first transaction; this "
                f"producer is {self.state}"
            )
        try:
            answer = await self._call(
                "InitTransactions",
                tpb.InitTransactionsRequest(
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=self.timeout_ms,
                ),
            )
        except ClientError as err:
            if err.code in _FATAL:
                self._fatal(err)
                raise self.error or err from None
            raise
        assert isinstance(answer, tpb.InitTransactionsResponse)
        self.sequencer.start(answer.producer_id, answer.producer_epoch)
        self.state = TransactionState.READY

    def begin(self) -> None:
        self._raise_if_fatal()
        if self.state != TransactionState.READY:
            raise TransactionStateError(
                "begin_transaction() needs init_transactions() first and the previous "
                f"transaction committed or aborted; this producer is {self.state}"
            )
        self.added.clear()
        self._asking.clear()
        self._waiting.clear()
        self._begun = False
        self.error = None
        self._generation += 1
        self.state = TransactionState.IN_TRANSACTION

    def check_send(self) -> None:
        """Raise unless a send may join the open transaction."""
        self._raise_if_fatal()
        if self.state == TransactionState.ABORTABLE_ERROR and self.error is not None:
            raise _as(TransactionAbortableError, self.error, "the transaction must be aborted: ")
        if self.state != TransactionState.IN_TRANSACTION:
            raise TransactionStateError(
                f"send() of a transactional producer needs begin_transaction() first; this "
                f"producer is {self.state}"
            )

    def partition_ready(self, key: Key) -> bool:
        """May a batch of ``key`` be sent? Only once the partition is in the transaction:
        else it is asked for (with every other partition met in this turn of the engine)
        and the engine is woken when the answer came."""
        if key in self.added:
            return True
        if key in self._asking:
            return False
        if self.state in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING):
            if not self._waiting:
                asyncio.get_running_loop().call_soon(self._ask_waiting)
            self._waiting.add(key)
            self._asking.add(key)
        return False

    def add_early(self, keys: list[Key]) -> None:
        """Ask for the partitions whose first batch is still being filled: the answer is
        then often in before the batch is ready to go (see partition_ready)."""
        for key in keys:
            self.partition_ready(key)

    def _ask_waiting(self) -> None:
        keys, self._waiting = self._waiting, set()
        if not keys or self.state not in (
            TransactionState.IN_TRANSACTION,
            TransactionState.COMMITTING,
        ):
            self._asking -= keys
            return
        self._begun = True
        task = asyncio.get_running_loop().create_task(self._add(keys, self._generation))
        self._adding.add(task)
        task.add_done_callback(self._adding.discard)

    async def _add(self, keys: set[Key], generation: int) -> None:
        try:
            await self._call(
                "AddPartitionsToTxn",
                tpb.AddPartitionsToTxnRequest(**self._ids, partitions=by_topic(keys)),
            )
        except ClientError as err:
            if generation == self._generation:
                self.failed(err)
                self._wake()
            return
        finally:
            if generation == self._generation:
                self._asking -= keys
        if generation != self._generation:
            return  # the transaction ended meanwhile: the answer is not this one's
        self.added |= keys
        self._wake()

    async def add_offsets(
        self, offsets: Mapping[Key, int | OffsetAndMetadata], group: tuple[str, str, int]
    ) -> None:
        """AddOffsetsToTxn: the consumer positions to commit with the transaction."""
        self.check_send()
        group_id, member_id, member_epoch = group
        listed = []
        for (t, p), o in sorted(offsets.items()):
            o = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
            listed.append(gpb.OffsetToCommit(topic=t, partition=p, offset=o[0], metadata=o[1]))
        self._begun = True
        try:
            await self._call(
                "AddOffsetsToTxn",
                tpb.AddOffsetsToTxnRequest(
                    **self._ids,
                    group_id=group_id,
                    member_id=member_id,
                    member_epoch=member_epoch,
                    offsets=listed,
                ),
            )
        except ClientError as err:
            self.failed(err)
            raise self.error or err from None

    async def end(
        self,
        *,
        commit: bool,
        flush: Callable[[], Awaitable[None]],
        fail_queued: Callable[[BaseException], None],
    ) -> None:
        """Commit (after every batch is stored) or abort (queued batches failed, those on
        their way awaited) the transaction, and move to the next epoch."""
        self._raise_if_fatal()
        if commit:
            if self.state == TransactionState.ABORTABLE_ERROR and self.error is not None:
                raise _as(TransactionAbortableError, self.error, "cannot commit: ")
            if self.state not in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING):
                raise TransactionStateError(
                    f"commit_transaction() needs an open transaction; this producer is {self.state}"
                )
            self.state = TransactionState.COMMITTING
            await flush()
            if self._adding:  # their answers must not land on the next transaction
                await asyncio.gather(*self._adding, return_exceptions=True)
            self._raise_if_fatal()
            if self.error is not None:
                # A batch or a call failed while flushing: the transaction cannot commit.
                raise _as(TransactionAbortableError, self.error, "cannot commit: ")
        else:
            if self.state not in (
                TransactionState.IN_TRANSACTION,
                TransactionState.COMMITTING,
                TransactionState.ABORTING,
                TransactionState.ABORTABLE_ERROR,
            ):
                raise TransactionStateError(
                    f"abort_transaction() needs an open transaction; this producer is {self.state}"
                )
            self.state = TransactionState.ABORTING
            adding = list(self._adding)
            for task in adding:
                task.cancel()
            await asyncio.gather(*adding, return_exceptions=True)
            self._waiting.clear()
            self._asking.clear()
            fail_queued(
                TransactionAbortableError(
                    "the transaction was aborted before this record was sent",
                    pb.ERROR_CODE_UNSPECIFIED,
                    None,
                    {},
                )
            )
            await flush()
        if self._begun:
            try:
                answer = await self._call("EndTxn", tpb.EndTxnRequest(**self._ids, commit=commit))
            except ClientError as err:
                if err.code in _FATAL:
                    self._fatal(err)
                    raise self.error or err from None
                if commit and not _outcome_unknown(err):
                    self.failed(err)
                    raise self.error or err from None
                # The commit may have been done: raised as it came, never as abortable (an
                # application that aborted and redid it would write its outputs twice);
                # the same commit_transaction() again learns the outcome.
                raise
            assert isinstance(answer, tpb.EndTxnResponse)
            self.sequencer.start(answer.producer_id, answer.producer_epoch)
        self.added.clear()
        self._begun = False
        self.error = None
        self.state = TransactionState.READY

    # --- errors ---------------------------------------------------------------------------

    def batch_error(self, topic: str, partition: int, count: int, err: ClientError) -> ClientError:
        """The error a transactional batch fails with for good: fatal when fenced, else
        abortable (its transaction cannot commit without it)."""
        what = f"{count} records for {topic}/{partition} were not stored: {err}"
        if err.code == pb.ERROR_CODE_PRODUCER_FENCED:
            return ProducerFencedError(
                f"{what}; a newer instance of transactional id {self.transactional_id!r} "
                "took over: close this producer",
                err.code,
                err.status,
                err.meta,
                err.code_name,
            )
        return TransactionAbortableError(
            f"{what}; abort the transaction and begin again",
            err.code,
            err.status,
            err.meta,
            err.code_name,
        )

    def failed(self, err: BaseException) -> None:
        """A batch or call of the open transaction failed for good: it can only abort now
        (or, fenced, the producer must close)."""
        if self.state in (TransactionState.ABORTING, TransactionState.FATAL_ERROR):
            return
        if not isinstance(err, ClientError):
            err = ClientError(str(err), pb.ERROR_CODE_UNSPECIFIED, grpc.StatusCode.INTERNAL, {})
        if err.code in _FATAL:
            self._fatal(err)
            return
        if self.state in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING):
            self.error = _as(TransactionAbortableError, err)
            self.state = TransactionState.ABORTABLE_ERROR

    def _fatal(self, err: ClientError) -> None:
        if err.code == pb.ERROR_CODE_PRODUCER_FENCED and not isinstance(err, ProducerFencedError):
            err = _as(ProducerFencedError, err, "this producer must close: ")
        self.error = err
        self.state = TransactionState.FATAL_ERROR

    def _raise_if_fatal(self) -> None:
        if self.state == TransactionState.FATAL_ERROR and self.error is not None:
            raise self.error


def _outcome_unknown(err: ClientError) -> bool:
    """An EndTxn that may or may not have been done: no answer (unreachable, timed out),
    an explicit OUTCOME_UNKNOWN, or a refusal worth asking again."""
    return (
        err.retriable
        or err.unreachable
        or err.timed_out
        or err.code == pb.ERROR_CODE_OUTCOME_UNKNOWN
    )

"""raftmq's Python clients: what an application imports.

    from raftmq.client import Producer, Consumer

``Producer``/``AsyncProducer`` batch, compress and retry idempotently; ``Consumer``/
``AsyncConsumer`` fetch, join groups and commit; ``ShareConsumer``/``AsyncShareConsumer``
consume together in a share group, acknowledging each record (docs/share-groups.md);
``RetryingConsumer``/``AsyncRetryingConsumer`` hand records to a handler, retrying
failures through a retry topic and then a dead-letter topic; ``AdminClient`` creates
and describes topics and groups; ``LowLevelClient`` is the request-at-a-time client
underneath them. This
package talks to brokers only through ``raftmq.api`` and reads records only through
``raftmq.format``: importing it loads no server code (``tests/test_layers.py`` checks).
"""

from raftmq.client.admin import AdminClient
from raftmq.client.consumer import (
    AsyncConsumer,
    CommitFailedError,
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRecord,
    NoOffsetError,
    OffsetAndMetadata,
    TopicPartition,
)
from raftmq.client.errors import ClientError, ErrorCode
from raftmq.client.lowlevel import LowLevelClient
from raftmq.client.producer import (
    AsyncProducer,
    Producer,
    ProducerClosedError,
    RecordMetadata,
)
from raftmq.client.retrying import AsyncRetryingConsumer, RetryingConsumer, RetryPolicy
from raftmq.client.share_acks import AcknowledgementResult, AcknowledgeType
from raftmq.client.share_consumer import AsyncShareConsumer, ShareConsumer
from raftmq.client.transactions import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)

__all__ = [
    "AcknowledgeType",
    "AcknowledgementResult",
    "AdminClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncRetryingConsumer",
    "AsyncShareConsumer",
    "ClientError",
    "CommitFailedError",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "ErrorCode",
    "LowLevelClient",
    "NoOffsetError",
    "OffsetAndMetadata",
    "Producer",
    "ProducerClosedError",
    "ProducerFencedError",
    "RecordMetadata",
    "RetryPolicy",
    "RetryingConsumer",
    "ShareConsumer",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionStateError",
]

"""A Kafka consumer whose fetch memory is bounded by ``buffer.memory`` (KIP-81).

>>> from kmem.consumer import Consumer, TopicPartition
>>> with Consumer("localhost:9092", buffer_memory=64 << 20, fetch_max_bytes=16 << 20) as consumer:
...     consumer.assign([TopicPartition("events", 0)])
...     for record in consumer.poll(1000):
...         print(record.offset, record.value)
"""
from kmem.consumer.consumer import Consumer, ConsumerRebalanceListener
from kmem.consumer.errors import (CommitFailedError, KafkaConnectionError, KafkaError, OffsetOutOfRangeError,
                                  RebalanceInProgressError)
from kmem.consumer.fetcher import ConsumerRecord, TopicPartition

__all__ = ["Consumer", "ConsumerRebalanceListener", "ConsumerRecord", "TopicPartition", "KafkaError",
           "KafkaConnectionError", "CommitFailedError", "RebalanceInProgressError", "OffsetOutOfRangeError"]

"""A consumer process for the group tests: ``python group_consumer.py CLIENT BOOTSTRAP GROUP TOPIC
[INSTANCE_ID]`` (a ``group.instance.id`` makes it a static member); for ``confluent-kafka-consumer-protocol``
and ``kmem-consumer-protocol`` (KIP-848) the last argument is the server assignor instead, for
``confluent-kafka-classic`` the ``partition.assignment.strategy``.

Consumes with kafka-python, aiokafka, confluent-kafka or kmem's consumer, commits after every non-empty poll,
and prints JSON lines: ``{"assigned": [partitions]}`` when its assignment changes, ``{"records": [[partition,
offset, value], ...]}`` once they are committed. SIGTERM closes the consumer cleanly (it leaves the group);
SIGKILL is a crash."""
import asyncio
import json
import signal
import sys

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 500
stopping = False


def _stop(*_):
    global stopping
    stopping = True


def say(**message):
    print(json.dumps(message), flush=True)


class Reporter:
    def __init__(self):
        self.assigned = None

    def update(self, assigned, records):
        assigned = sorted(assigned)
        if assigned != self.assigned:
            self.assigned = assigned
            say(assigned=assigned)
        if records:
            say(records=records)


def run_kafka_python(bootstrap, group, topic, instance_id=None):
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_MS, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_instance_id=instance_id)
    consumer.partitions_for_topic(topic)    # before the first join: see broker_helpers.kafka_python_knows_partitions
    reporter = Reporter()
    while not stopping:
        batches = consumer.poll(200)
        records = [[tp.partition, r.offset, r.value.decode()] for tp, rs in batches.items() for r in rs]
        if records:
            consumer.commit()
        reporter.update({tp.partition for tp in consumer.assignment()}, records)
    consumer.close()


def run_aiokafka(bootstrap, group, topic, instance_id=None):
    from aiokafka import AIOKafkaConsumer

    async def main():
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                    session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    group_instance_id=instance_id)
        await consumer.start()
        reporter = Reporter()
        try:
            while not stopping:
                batches = await consumer.getmany(timeout_ms=200)
                records = [[tp.partition, r.offset, r.value.decode()] for tp, rs in batches.items() for r in rs]
                if records:
                    await consumer.commit()
                reporter.update({tp.partition for tp in consumer.assignment()}, records)
        finally:
            await consumer.stop()
    asyncio.run(main())


def run_confluent(bootstrap, group, topic, instance_id=None):
    consume_confluent({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": SESSION_TIMEOUT_MS,
                       "heartbeat.interval.ms": HEARTBEAT_MS}, topic, instance_id)


def run_confluent_classic(bootstrap, group, topic, strategy):
    """The classic protocol with ``strategy`` (``partition.assignment.strategy``), as a group upgraded to KIP-848's
    protocol keeps its members that have not moved yet."""
    consume_confluent({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "classic",
                       "partition.assignment.strategy": strategy, "session.timeout.ms": SESSION_TIMEOUT_MS,
                       "heartbeat.interval.ms": HEARTBEAT_MS}, topic)


def run_confluent_consumer_protocol(bootstrap, group, topic, assignor):
    """KIP-848's protocol: the broker assigns, with ``assignor`` (``group.remote.assignor``)."""
    consume_confluent({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                       "group.remote.assignor": assignor}, topic)


def run_kmem_consumer_protocol(bootstrap, group, topic, assignor):
    """kmem's consumer on KIP-848's protocol; a commit refused (the member was fenced) reports nothing."""
    from kmem.consumer import CommitFailedError, Consumer
    consumer = Consumer(bootstrap, group_id=group, group_protocol="consumer", group_remote_assignor=assignor,
                        auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.subscribe([topic])
    reporter = Reporter()
    while not stopping:
        records = [[r.partition, r.offset, r.value.decode()] for r in consumer.poll(200)]
        if records:
            try:
                consumer.commit()
            except CommitFailedError:
                records = []
        reporter.update({tp.partition for tp in consumer.assignment()}, records)
    consumer.close()


def consume_confluent(settings, topic, instance_id=None):
    """A commit that a rebalance fails (the member's epoch or generation moved on) is retried with the next poll's,
    as an application does: its records count as committed then if their partition is still the member's (else
    their new owner reads them again)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException
    retriable = {KafkaError.STALE_MEMBER_EPOCH, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                 KafkaError.UNKNOWN_MEMBER_ID}
    settings = {**settings, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if instance_id:
        settings["group.instance.id"] = instance_id
    consumer = Consumer(settings)
    consumer.subscribe([topic])
    reporter = Reporter()
    uncommitted = []
    while not stopping:
        messages = [m for m in consumer.consume(100, 0.2) if m.error() is None]
        uncommitted += [[m.partition(), m.offset(), m.value().decode()] for m in messages]
        assigned = {tp.partition for tp in consumer.assignment()}
        records = []
        if uncommitted:
            try:
                consumer.commit(asynchronous=False)
                records = [r for r in uncommitted if r[0] in assigned]
                uncommitted = []
            except KafkaException as e:
                if e.args[0].code() not in retriable:
                    raise
        reporter.update(assigned, records)
    consumer.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    client, bootstrap, group, topic = sys.argv[1:5]
    {"kafka-python": run_kafka_python, "aiokafka": run_aiokafka, "confluent-kafka": run_confluent,
     "confluent-kafka-classic": run_confluent_classic,
     "confluent-kafka-consumer-protocol": run_confluent_consumer_protocol,
     "kmem-consumer-protocol": run_kmem_consumer_protocol}[client](bootstrap, group, topic, *sys.argv[5:])

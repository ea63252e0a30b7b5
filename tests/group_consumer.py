"""A consumer process for the group tests: ``python group_consumer.py CLIENT BOOTSTRAP GROUP TOPIC
[INSTANCE_ID]`` (a ``group.instance.id`` makes it a static member); for ``confluent-kafka-consumer-protocol``
(KIP-848) the last argument is the server assignor instead.

Consumes with kafka-python, aiokafka or confluent-kafka, commits after every non-empty poll, and prints
JSON lines: ``{"assigned": [partitions]}`` when its assignment changes, ``{"records": [[partition, offset,
value], ...]}`` once they are committed. SIGTERM closes the consumer cleanly (it leaves the group);
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


def run_confluent_consumer_protocol(bootstrap, group, topic, assignor):
    """KIP-848's protocol: the broker assigns, with ``assignor`` (``group.remote.assignor``)."""
    consume_confluent({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                       "group.remote.assignor": assignor}, topic)


def consume_confluent(settings, topic, instance_id=None):
    from confluent_kafka import Consumer, KafkaError, KafkaException
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
                # what the commit covered: the positions of the partitions still assigned
                records, uncommitted = [r for r in uncommitted if r[0] in assigned], []
            except KafkaException as e:
                # KIP-848: a commit racing the heartbeat that moved the member's epoch is STALE_MEMBER_EPOCH (Kafka
                # answers it the same); the next poll's commit covers these records
                if e.args[0].code() != KafkaError.STALE_MEMBER_EPOCH:
                    raise
        reporter.update(assigned, records)
    consumer.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    client, bootstrap, group, topic = sys.argv[1:5]
    {"kafka-python": run_kafka_python, "aiokafka": run_aiokafka, "confluent-kafka": run_confluent,
     "confluent-kafka-consumer-protocol": run_confluent_consumer_protocol}[client](bootstrap, group, topic, *sys.argv[5:])

"""Peak RSS growth of a Kafka consumer reading a backlog while the application is slow, measured in a
fresh process: ``python consumer_memory.py CLIENT BOOTSTRAP TOPIC PARTITIONS TOTAL DELAY_MS BUFFER_MEMORY``
prints one JSON line. CLIENT: kmem (assigned partitions), kmem-consumer-protocol (subscribed, in a KIP-848
group), confluent-kafka, kafka-python or aiokafka (peers on default settings).

The peak is the kernel's high-water mark (VmHWM), reset once setup is done, so imports and connection
setup are not counted; a warm-up read of a few records first compiles kmem's codecs.
"""
import json
import os
import subprocess
import sys
import time


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _kmem(bootstrap, topic, partitions, buffer_memory):
    from kmem.consumer import Consumer

    fetch_max = min(buffer_memory, 50 << 20)
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", buffer_memory=buffer_memory,
                        fetch_max_bytes=fetch_max)
    consumer.assign([(topic, p) for p in range(partitions)])
    return lambda: consumer.poll(100), consumer.close


def _kmem_consumer_protocol(bootstrap, topic, partitions, buffer_memory):
    """kmem's consumer in a group of its own on KIP-848's protocol (its heartbeats ride the priority channel)."""
    from kmem.consumer import Consumer

    consumer = Consumer(bootstrap, group_id=f"memory-{topic}", group_protocol="consumer", auto_offset_reset="earliest",
                        buffer_memory=buffer_memory, fetch_max_bytes=min(buffer_memory, 50 << 20))
    consumer.subscribe([topic])
    return lambda: consumer.poll(100), consumer.close


def _confluent(bootstrap, topic, partitions, buffer_memory):
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "memory",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(partitions)])

    def poll():
        return [m for m in consumer.consume(500, 0.01) if m.error() is None]
    return poll, consumer.close


def _kafka_python(bootstrap, topic, partitions, buffer_memory):
    import kafka

    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, api_version=(2, 3), auto_offset_reset="earliest",
                                   enable_auto_commit=False)
    consumer.assign([kafka.TopicPartition(topic, p) for p in range(partitions)])

    def poll():
        return [r for rs in consumer.poll(100, max_records=500).values() for r in rs]
    return poll, consumer.close


def _aiokafka(bootstrap, topic, partitions, buffer_memory):
    import asyncio

    import aiokafka

    async def start():
        started = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                            enable_auto_commit=False)
        await started.start()
        started.assign([aiokafka.TopicPartition(topic, p) for p in range(partitions)])
        return started

    loop = asyncio.new_event_loop()
    consumer = loop.run_until_complete(start())

    def poll():
        batches = loop.run_until_complete(consumer.getmany(timeout_ms=100, max_records=500))
        return [r for rs in batches.values() for r in rs]
    return poll, lambda: loop.run_until_complete(consumer.stop())


CLIENTS = {"kmem": _kmem, "kmem-consumer-protocol": _kmem_consumer_protocol, "confluent-kafka": _confluent,
           "kafka-python": _kafka_python, "aiokafka": _aiokafka}


def measure(client, bootstrap, topic, partitions, total, delay_ms, buffer_memory):
    warm_poll, warm_close = CLIENTS[client](bootstrap, topic + "-warmup", 1, buffer_memory)
    deadline = time.monotonic() + 30
    while not warm_poll() and time.monotonic() < deadline:
        pass
    warm_close()
    poll, close = CLIENTS[client](bootstrap, topic, partitions, buffer_memory)
    baseline = _status("VmRSS")
    _reset_peak()
    started = time.monotonic()
    count = 0
    deadline = started + 120
    while count < total and time.monotonic() < deadline:
        records = poll()
        count += len(records)
        if records:
            time.sleep(delay_ms / 1000.0)       # the application works on the batch
    elapsed = time.monotonic() - started
    peak = _status("VmHWM")
    close()
    return {"client": client, "records": count, "seconds": round(elapsed, 2), "baseline_rss": baseline,
            "peak_rss": peak, "growth": peak - baseline}


def run(client, bootstrap, topic, partitions, total, delay_ms, buffer_memory):
    """Measure ``client`` in a fresh interpreter; returns the result dict."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), client, bootstrap, topic, str(partitions),
                          str(total), str(delay_ms), str(buffer_memory)],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    name, server, topic_name, n_partitions, n_total, delay, memory = sys.argv[1:8]
    print(json.dumps(measure(name, server, topic_name, int(n_partitions), int(n_total), float(delay), int(memory))))

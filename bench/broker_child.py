"""A process of its own for bench_broker.py, so that its RSS is its own and it shares no GIL with clients.

    python broker_child.py serve LOG_DIR SETTINGS_JSON [--eager] [--fill-mib N] [--groups N]
        a Broker on 127.0.0.1:0 (``--fill-mib``: first N MiB of 1 KiB records in topic "old", 16 a batch;
        ``--eager``: Fetch v0-3 converted in one chunk, i.e. the whole response in memory at once;
        ``--groups``: N groups, each with an offset committed to topic "idle", as OffsetCommit makes them); prints
        ``READY <port> <log end offset of "old">``, then on each stdin line one JSON line: VmRSS and VmHWM (peak) in bytes.
    python broker_child.py pids N [--dict]
        N distinct idempotent producers appended to one partition through the broker's storage layer
        (the Produce handler's path), or N producer entries in a dict (Kafka's in-heap map); prints JSON
        with RssAnon before and after.
"""
import gc
import json
import os
import sys
import tempfile
import time


def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def commit_groups(broker, count):
    from kmem.protocol import ApiKey, RequestHeader, messages

    broker.logs.create_topic("idle")
    R = messages.OffsetCommitRequest
    header = RequestHeader(ApiKey.OFFSET_COMMIT, 8, 1, "bench")
    for i in range(count):
        request = R(group_id=f"group-{i}", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                    retention_time_ms=-1, topics=[R.OffsetCommitRequestTopic(name="idle", partitions=[
                        R.OffsetCommitRequestPartition(partition_index=0, committed_offset=i, committed_leader_epoch=-1,
                                                       committed_metadata="")])])
        assert broker.coordinator.offset_commit(header, request).topics[0].partitions[0].error_code == 0


def serve(log_dir, settings, eager, fill_mib, groups):
    from kmem.broker import Broker
    from kmem.records import build_records

    broker = Broker(log_dir, **settings).start()
    gc.freeze()             # as `kmem broker` does once started
    if eager:
        broker.handlers.lazy_chunk_size = (1 << 31) - 1
    if fill_mib:
        broker.logs.create_topic("old")
        partition = broker.logs.get_partition("old", 0)
        batch = build_records([os.urandom(1024) for _ in range(16)], magic=2)
        for _ in range(fill_mib * (1 << 20) // len(batch)):
            assert partition.append(batch).error_code == 0
    if groups:
        commit_groups(broker, groups)
    end = broker.logs.get_partition("old", 0).log_end_offset if fill_mib else 0
    print("READY", broker.server.address[1], end, flush=True)
    for _ in sys.stdin:
        print(json.dumps(status()), flush=True)
    broker.close()


def pids(count, as_dict):
    from kmem.broker.log.producer_state import BatchMetadata, ProducerState

    before = status()["RssAnon"]
    started = time.perf_counter()
    now = int(time.time() * 1000)
    if as_dict:
        entries = {pid: ProducerState(pid, 0, [BatchMetadata(0, 0, pid, 0, now)]) for pid in range(count)}
        assert len(entries) == count
    else:
        from kmem.broker import BrokerConfig, LogManager
        from kmem.records import build_records

        with tempfile.TemporaryDirectory() as log_dir:
            logs = LogManager(log_dir, BrokerConfig.from_properties(node_id=0))
            logs.create_topic("pids")
            partition = logs.get_partition("pids", 0)
            for pid in range(count):
                batch = build_records([{"value": b"x", "timestamp": now}], producer_id=pid, producer_epoch=0,
                                      base_sequence=0)
                assert partition.append(batch).error_code == 0
            after = status()["RssAnon"]
            logs.close()
            print(json.dumps({"ids": count, "rss_anon_growth": after - before,
                              "seconds": time.perf_counter() - started}))
            return
    print(json.dumps({"ids": count, "rss_anon_growth": status()["RssAnon"] - before,
                      "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "serve":
        fill = int(sys.argv[sys.argv.index("--fill-mib") + 1]) if "--fill-mib" in sys.argv else 0
        groups = int(sys.argv[sys.argv.index("--groups") + 1]) if "--groups" in sys.argv else 0
        serve(sys.argv[2], json.loads(sys.argv[3]), "--eager" in sys.argv, fill, groups)
    else:
        pids(int(sys.argv[2]), "--dict" in sys.argv)

"""``kmem dump-log`` (kmem.admin.dump_log), Kafka's ``kafka-dump-log.sh``: on the log directory of a kmem broker
that confluent-kafka wrote to (plain, compressed, keyed, with headers, idempotent, transactional commits and
aborts, a consumer group's commits), its lines must carry what the clients produced; on segments built with
kmem.records (v0/v1 message sets) and on damaged files (a truncated tail, a bad CRC, garbage, a corrupt index
or producer snapshot) it reports as Kafka's tool does, in lines, never a traceback. Its batch and record fields are
compared with what Apache's kafka-clients reads from the same segments (tests/java/KafkaRecordsProbe.java, skipped
without a JDK), its decoders' JSON with the strings of Kafka's own DumpLogSegmentsTest."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker_helpers import TIMEOUT, wait_for
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
from kmem.broker.group.offsets import (GroupRecord, MemberRecord, group_metadata_key, group_metadata_value,
                                       offset_commit_key)
from kmem.cli import main
from kmem.ledger import ProducerEntry, write_snapshot
from kmem.pytest_plugin import start_broker
from kmem.records import ControlRecordType, build_control_batch, build_records

CODECS = ("none", "gzip", "lz4", "zstd", "snappy")
SEGMENT = "00000000000000000000"
PADDING = "x" * 200        # librdkafka sends a batch uncompressed when compressing does not make it smaller
FIELD = re.compile(r"(\w+): (\[[^\]]*\]|\S+)")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The log directory of a kmem broker the clients wrote to (an index entry per batch), once it closed."""
    log_dir = tmp_path_factory.mktemp("dump-log") / "logs"
    broker = start_broker(log_dir, {"log.index.interval.bytes": 1, "transaction.state.log.num.partitions": 1})
    try:
        for topic in ("plain", "idempotent", "txn"):
            broker.logs.create_topic(topic, 1)
        write_with_clients(broker.bootstrap_servers)
    finally:
        broker.close()      # its indexes trimmed and its producer snapshots taken, as Kafka's at shutdown
    return log_dir


def write_with_clients(bootstrap):
    """Each codec's batches of keyed records with headers to plain, an idempotent producer's batches, a committed
    and an aborted transaction, a group's commit (its clients are gone when this returns)."""
    for codec in CODECS:
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
                             "enable.idempotence": False})
        for i in range(3):
            producer.produce("plain", f"{codec}-{i}{PADDING}".encode(), key=f"key-{i}".encode(),
                             headers=[("codec", codec.encode()), ("n", str(i).encode())])
        assert producer.flush(TIMEOUT) == 0
    idempotent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for i in range(4):
        idempotent.produce("idempotent", f"idem-{i}".encode())
        assert idempotent.flush(TIMEOUT) == 0
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx"})
    transactional.init_transactions(TIMEOUT)
    for outcome, values in (("commit", [b"kept-0", b"kept-1"]), ("abort", [b"dropped"])):
        transactional.begin_transaction()
        for value in values:
            transactional.produce("txn", value)
        assert transactional.flush(TIMEOUT) == 0
        (transactional.commit_transaction if outcome == "commit" else transactional.abort_transaction)(TIMEOUT)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readers", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["plain"])
    read = []
    wait_for(lambda: read.extend(m for m in consumer.consume(20, 0.2) if not m.error()) or len(read) >= 15,
             "the group to read plain")
    consumer.commit(offsets=[TopicPartition("plain", 0, 15)], asynchronous=False)
    consumer.close()


def dump(capsys, *args):
    """``kmem dump-log ARGS`` in this process: (exit code, stdout lines, stderr lines)."""
    try:
        code = main(["dump-log", *map(str, args)])
    except SystemExit as exc:       # argparse's refusals and --help
        code = exc.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def fields(line):
    return dict(FIELD.findall(line))


def batches_and_records(lines):
    """``[(batch fields, [record line, ...])]`` of a segment's dump."""
    found = []
    for line in lines:
        if line.startswith(("baseOffset:", "offset:")):
            found.append((fields(line), []))
        elif line.startswith("|"):
            found[-1][1].append(line)
    return found


def payload_of(line):
    return line.split(" payload: ", 1)[1] if " payload: " in line else None


def segment(log_dir, partition_dir, suffix=".log"):
    return log_dir / partition_dir / f"{SEGMENT}{suffix}"


def test_batches_and_records_carry_what_the_clients_produced(written, capsys):
    path = segment(written, "plain-0")
    code, out, err = dump(capsys, "--files", path, "--print-data-log")
    assert code == 0, err
    assert out[:2] == [f"Dumping {path}", "Log starting offset: 0"]
    found = batches_and_records(out)
    assert {batch["compresscodec"] for batch, _ in found} == set(CODECS)
    offsets = []
    for batch, records in found:
        assert batch["isvalid"] == "true" and batch["magic"] == "2" and batch["isControl"] == "false"
        assert int(batch["count"]) == len(records)
        assert int(batch["lastOffset"]) - int(batch["baseOffset"]) + 1 == len(records)
        for line in records:
            record = fields(line)
            offsets.append(int(record["offset"]))
            codec = batch["compresscodec"]
            i = int(record["key"].split("-")[1])
            assert record["key"] == f"key-{i}" and payload_of(line) == f"{codec}-{i}{PADDING}"
            assert record["headerKeys"] == "[codec,n]"
            assert record["keySize"] == str(len(f"key-{i}"))
            assert record["valueSize"] == str(len(f"{codec}-{i}{PADDING}"))
            assert int(record["CreateTime"]) > 0 and record["sequence"] == "-1"
    assert offsets == list(range(15))
    assert not any(line.startswith("Found") for line in out) and err == []


def test_idempotent_batches_carry_their_producer_and_sequences(written, capsys):
    code, out, _ = dump(capsys, "--files", segment(written, "idempotent-0"), "--deep-iteration")
    assert code == 0
    found = batches_and_records(out)
    assert len(found) == 4
    producer_ids = {batch["producerId"] for batch, _ in found}
    assert len(producer_ids) == 1 and int(producer_ids.pop()) >= 0
    for sequence, (batch, records) in enumerate(found):
        assert (batch["baseSequence"], batch["lastSequence"]) == (str(sequence), str(sequence))
        assert [fields(line)["sequence"] for line in records] == [str(sequence)]
        assert "payload" not in records[0]      # --deep-iteration alone prints no data


def test_transactions_markers_txnindex_and_producer_snapshot(written, capsys):
    log_dir = written
    code, out, _ = dump(capsys, "--files", segment(log_dir, "txn-0"), "--print-data-log")
    assert code == 0
    found = batches_and_records(out)
    data = [(batch, records) for batch, records in found if batch["isControl"] == "false"]
    markers = [(batch, records) for batch, records in found if batch["isControl"] == "true"]
    assert [payload_of(line) for _, records in data for line in records] == ["kept-0", "kept-1", "dropped"]
    assert all(batch["isTransactional"] == "true" for batch, _ in found)
    producer_id = data[0][0]["producerId"]
    assert {batch["producerId"] for batch, _ in found} == {producer_id}
    assert [fields(records[0])["endTxnMarker"] for _, records in markers] == ["COMMIT", "ABORT"]
    assert all(" payload:" not in records[0] and "coordinatorEpoch: " in records[0] for _, records in markers)
    aborted_offset, abort_offset = int(data[-1][0]["baseOffset"]), int(markers[1][0]["baseOffset"])

    code, out, _ = dump(capsys, "--files", segment(log_dir, "txn-0", ".txnindex"))
    assert code == 0
    assert out[1:] == [f"version: 0 producerId: {producer_id} firstOffset: {aborted_offset} "
                       f"lastOffset: {abort_offset} lastStableOffset: {abort_offset + 1}"]

    snapshots = sorted(p for p in os.listdir(log_dir / "txn-0") if p.endswith(".snapshot"))
    code, out, _ = dump(capsys, "--files", log_dir / "txn-0" / snapshots[-1])
    assert code == 0
    entry = fields(out[1])
    assert entry["producerId"] == producer_id and entry["currentTxnFirstOffset"] == "OptionalLong.empty"
    assert entry["lastOffset"] == str(aborted_offset) and entry["lastSequence"] == "2"


def test_offsets_decoder_shows_the_groups_commit_and_members(written, capsys):
    code, out, err = dump(capsys, "--files", segment(written, "__consumer_offsets-0"), "--offsets-decoder")
    assert code == 0, err
    commits, groups = [], []
    for line in out:
        if " key: " in line:
            key = json.loads(line.split(" key: ", 1)[1].split(" payload: ")[0])
            payload = payload_of(line)
            (commits if key["data"].get("topic") else groups).append((key, payload))
    assert commits and groups
    key, payload = commits[-1]
    assert key == {"type": "1", "data": {"group": "readers", "topic": "plain", "partition": 0}}
    value = json.loads(payload)
    assert value["version"] == "3" and value["data"]["offset"] == 15 and value["data"]["leaderEpoch"] >= -1
    assert list(value["data"]) == ["offset", "leaderEpoch", "metadata", "commitTimestamp"]
    generations = [json.loads(payload)["data"] for _, payload in groups if payload != "<DELETE>"]
    assert [group["generation"] for group in generations] == [1, 2]     # the member joined, then left
    assert generations[-1]["members"] == [] and generations[-1]["protocol"] is None
    member = generations[0]["members"][0]
    assert generations[0]["protocolType"] == "consumer" and member["subscription"]["topics"] == ["plain"]
    assert member["assignment"]["assignedPartitions"] == [{"topic": "plain", "partitions": [0]}]


def test_transaction_log_decoder_shows_each_state(written, capsys):
    code, out, _ = dump(capsys, "--files", segment(written, "__transaction_state-0"),
                        "--transaction-log-decoder")
    assert code == 0
    lines = [line for line in out if "key: transaction_metadata::transactionalId=tx" in line]
    states = [re.search(r"state=(\w+)", line).group(1) for line in lines]
    assert states[0] == "Empty" and "CompleteCommit" in states and states[-1] == "CompleteAbort"
    assert re.fullmatch(r"producerId:\d+,producerEpoch:0,state=Ongoing,partitions=\[txn-0\],"
                        r"txnLastUpdateTimestamp=\d+,txnTimeoutMs=60000", payload_of(lines[states.index("Ongoing")]))


def test_indexes_match_their_segment_and_a_mismatch_is_reported(written, capsys, tmp_path):
    source = written / "plain-0"
    code, out, err = dump(capsys, "--files", f"{source / SEGMENT}.index,{source / SEGMENT}.timeindex")
    assert code == 0 and err == []
    batches = {(int(batch["lastOffset"]), int(batch["position"]))
               for batch, _ in batches_and_records(dump(capsys, "--files", source / f"{SEGMENT}.log")[1])}
    index = [(int(entry["offset"]), int(entry["position"])) for entry in map(fields, out) if "position" in entry]
    assert len(index) >= len(batches) - 1 and set(index) <= batches
    times = [(int(entry["timestamp"]), int(entry["offset"])) for entry in map(fields, out) if "timestamp" in entry]
    assert times and {offset for _, offset in times} <= {offset for offset, _ in batches}

    copy = tmp_path / "plain-0"
    shutil.copytree(source, copy)
    with open(copy / f"{SEGMENT}.index", "r+b") as f:      # the second entry points at the first batch
        f.seek(12)
        f.write(struct.pack(">i", 0))
    with open(copy / f"{SEGMENT}.timeindex", "r+b") as f:   # the first entry's timestamp is off by one
        f.write(struct.pack(">q", times[0][0] - 1))
    first_batch_offset = min(batches, key=lambda batch: batch[1])[0]
    code, out, err = dump(capsys, "--files", f"{copy / SEGMENT}.index,{copy / SEGMENT}.timeindex",
                          "--verify-index-only")
    assert code == 0
    assert out == [f"Dumping {copy / SEGMENT}.index", f"Dumping {copy / SEGMENT}.timeindex"]
    assert err == [f"Mismatches in :{copy / SEGMENT}.index", f"  Index offset: {index[1][0]}, log offset: "
                   f"{first_batch_offset}", f"Found timestamp mismatch in :{copy / SEGMENT}.timeindex",
                   f"  Index timestamp: {times[0][0] - 1}, log timestamp: {times[0][0]}"]
    code, out, _ = dump(capsys, "--files", f"{copy / SEGMENT}.index", "--index-sanity-check")
    assert code == 1 and "passed sanity check" not in "\n".join(out)
    code, out, _ = dump(capsys, "--files", f"{source / SEGMENT}.index", "--index-sanity-check")
    assert code == 0 and out[1] == f"{source / SEGMENT}.index passed sanity check."


def old_format_segment(path):
    """v0, v1 and compressed v1 entries (inner offsets relative, as KIP-31 writes them) and a gap in offsets."""
    data = bytes(build_records([{"value": b"zero", "key": b"k"}], magic=0, base_offset=0))
    data += bytes(build_records([{"value": b"one", "timestamp": 1000}], magic=1, base_offset=1))
    data += bytes(build_records([{"value": b"two", "timestamp": 2000}, {"value": b"three", "timestamp": 2001}],
                                magic=1, compression="gzip", base_offset=2))
    data += bytes(build_records([{"value": b"nine", "timestamp": 3000}], magic=1, base_offset=9))
    path.write_bytes(data)


def test_old_message_formats(capsys, tmp_path):
    path = tmp_path / f"{SEGMENT}.log"
    old_format_segment(path)
    code, out, err = dump(capsys, "--files", path, "--print-data-log")
    assert code == 0
    found = batches_and_records(out)
    assert [(b["offset"], b["magic"], b["compresscodec"]) for b, _ in found] == [
        ("0", "0", "none"), ("1", "1", "none"), ("3", "1", "gzip"), ("9", "1", "none")]
    assert "NoTimestampType: -1" in out[2] and "CreateTime: 2001" in out[6]
    records = [fields(line) for _, lines in found for line in lines]
    assert [(r["offset"], r["isValid"]) for r in records] == [("0", "true"), ("1", "true"), ("2", "true"),
                                                               ("3", "true"), ("9", "true")]
    assert [payload_of(line) for _, lines in found for line in lines] == ["zero", "one", "two", "three", "nine"]
    assert records[0]["key"] == "k" and records[3]["CreateTime"] == "2001"
    assert records[0]["crc"] == found[0][0]["crc"] + "}"        # Kafka's format, brace included
    assert err == [f"Non-consecutive offsets in {path}", "  3 is followed by 9"]


def test_damaged_segments_are_reported_as_kafkas_tool_does(written, capsys, tmp_path):
    source = segment(written, "plain-0")
    data = source.read_bytes()
    whole = batches_and_records(dump(capsys, "--files", source)[1])
    second = int(whole[1][0]["position"])

    truncated = tmp_path / "truncated" / f"{SEGMENT}.log"
    truncated.parent.mkdir()
    truncated.write_bytes(data[:second + 20])
    code, out, err = dump(capsys, "--files", truncated, "--deep-iteration")
    assert code == 0 and err == []
    assert len(batches_and_records(out)) == 1 and out[-1] == f"Found 20 invalid bytes at the end of {SEGMENT}.log"

    bad_crc = tmp_path / "bad-crc" / f"{SEGMENT}.log"
    bad_crc.parent.mkdir()
    flipped = bytearray(data)
    flipped[second - 1] ^= 0xFF           # the last byte of the first batch
    bad_crc.write_bytes(flipped)
    code, out, _ = dump(capsys, "--files", bad_crc)
    assert code == 0
    assert [batch["isvalid"] for batch, _ in batches_and_records(out)] == ["false"] + ["true"] * (len(whole) - 1)

    garbage = tmp_path / "garbage" / f"{SEGMENT}.log"
    garbage.parent.mkdir()
    garbage.write_bytes(data[:second] + struct.pack(">qi", 1, 3) + bytes(40))     # a batch size below 14 bytes
    code, out, err = dump(capsys, "--files", f"{garbage},{source}")
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"kmem dump-log: error: {garbage}: ") and "Traceback" not in err[0]
    assert out.count(f"Found 52 invalid bytes at the end of {SEGMENT}.log") == 1
    assert out[-1].startswith("baseOffset:")      # the next file was still dumped


def test_a_corrupt_producer_snapshot_gives_kafkas_message(written, capsys, tmp_path):
    directory = written / "idempotent-0"
    snapshot = sorted(p for p in os.listdir(directory) if p.endswith(".snapshot"))[-1]
    path = tmp_path / snapshot
    data = bytearray((directory / snapshot).read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(data)
    code, out, err = dump(capsys, "--files", path)
    assert code == 1 and out == [f"Dumping {path}"]
    assert len(err) == 1 and "Snapshot is corrupt (CRC is no longer valid). Stored crc: " in err[0]


def test_missing_and_unknown_files_and_bad_arguments(capsys, tmp_path):
    code, out, err = dump(capsys, "--files", f"{tmp_path}/missing.log,{tmp_path}/notes.txt")
    assert code == 1
    assert err == [f"kmem dump-log: error: {tmp_path}/missing.log: No such file or directory",
                   f"Ignoring unknown file {tmp_path}/notes.txt"]
    assert dump(capsys)[0] == 2                                          # --files is required
    assert dump(capsys, "--files", "a.log", "--max-bytes", "-1")[0] == 2
    assert dump(capsys, "--files", "a.log", "--offsets-decoder", "--transaction-log-decoder")[0] == 2
    code, out, _ = dump(capsys, "--help")
    assert code == 0 and "exit codes:" in out and "--verify-index-only" in "\n".join(out)


def test_a_closed_stdout_ends_the_run_quietly(written):
    """``kmem dump-log ... | head``: no error line once the reader has gone."""
    files = ",".join([str(segment(written, "plain-0"))] * 50)         # far more than a pipe's buffer
    process = subprocess.Popen([sys.executable, "-c", "import sys; from kmem.cli import main; sys.exit(main())",
                                "dump-log", "--files", files, "--print-data-log"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().startswith(b"Dumping ")
    process.stdout.close()
    assert process.wait(TIMEOUT) == 0 and process.stderr.read() == b""
    process.stderr.close()


def test_batch_and_snapshot_lines_are_kafkas(capsys, tmp_path):
    """Whole lines, field for field as DumpLogSegments prints them (Java's booleans and OptionalLong, the
    trailing space of a producer without a batch)."""
    path = tmp_path / f"{SEGMENT}.log"
    data = bytes(build_records([{"value": b"v", "key": b"key", "timestamp": 1500,
                                 "headers": [("a", b"1"), ("b", None)]}, {"value": None, "timestamp": 1600}],
                               base_offset=0, producer_id=42, producer_epoch=3, base_sequence=2147483647,
                               partition_leader_epoch=5))
    data += bytes(build_control_batch(ControlRecordType.ABORT, 2, 42, 3, 1700, coordinator_epoch=9))
    path.write_bytes(data)
    first_size = struct.unpack_from(">i", data, 8)[0] + 12
    crcs = [struct.unpack_from(">I", data, 17)[0], struct.unpack_from(">I", data, first_size + 17)[0]]
    code, out, err = dump(capsys, "--files", path, "--print-data-log")
    assert code == 0 and err == []
    assert out[2:] == [
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 2147483647 lastSequence: 0 producerId: 42 "
        "producerEpoch: 3 partitionLeaderEpoch: 5 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1600 size: {first_size} magic: 2 "
        f"compresscodec: none crc: {crcs[0]} isvalid: true",
        "| offset: 0 CreateTime: 1500 keySize: 3 valueSize: 1 sequence: 2147483647 headerKeys: [a,b] key: key "
        "payload: v",
        "| offset: 1 CreateTime: 1600 keySize: -1 valueSize: -1 sequence: 0 headerKeys: []",
        "baseOffset: 2 lastOffset: 2 count: 1 baseSequence: -1 lastSequence: -1 producerId: 42 producerEpoch: 3 "
        "partitionLeaderEpoch: -1 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty "
        f"position: {first_size} CreateTime: 1700 size: {len(data) - first_size} magic: 2 compresscodec: none "
        f"crc: {crcs[1]} isvalid: true",
        "| offset: 2 CreateTime: 1700 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: ABORT "
        "coordinatorEpoch: 9"]
    code, out, _ = dump(capsys, "--files", path, "--print-data-log", "--skip-record-metadata")
    assert [line for line in out if not line.startswith(("Dumping", "Log", "baseOffset"))] == ["| key: key payload: v",
                                                                                               "", ""]

    snapshot = tmp_path / "00000000000000000106.snapshot"
    write_snapshot(snapshot, [ProducerEntry(7, 2, 2, 105, 4, 1700, 3, 100), ProducerEntry(8, 0, -1, -1, 0, 1800, -1)])
    code, out, err = dump(capsys, "--files", snapshot)
    assert code == 0 and err == []
    assert out[1:] == [
        "producerId: 7 producerEpoch: 2 coordinatorEpoch: 3 currentTxnFirstOffset: OptionalLong[100] "
        "lastTimestamp: 1700 firstSequence: 2147483646 lastSequence: 2 lastOffset: 105 offsetDelta: 4 timestamp: 1700",
        "producerId: 8 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: 1800 "]


def test_max_bytes_reads_only_the_batches_within_it(written, capsys):
    path = segment(written, "plain-0")
    whole = batches_and_records(dump(capsys, "--files", path)[1])
    first_two = sum(int(batch["size"]) for batch, _ in whole[:2])
    code, out, _ = dump(capsys, "--files", path, "--max-bytes", first_two + 1)
    assert code == 0
    assert [batch for batch, _ in batches_and_records(out)] == [batch for batch, _ in whole[:2]]
    assert not any(line.startswith("Found") for line in out)       # the cut is not damage


def test_kraft_snapshots_are_read_as_segments(capsys, tmp_path):
    data = bytes(build_records([b"record"], base_offset=0))
    for name, header in (("00000000000000000010-0000000003.checkpoint", "Snapshot end offset: 10, epoch: 3"),
                         ("bootstrap.checkpoint", "KRaft bootstrap snapshot")):
        (tmp_path / name).write_bytes(data)
        code, out, _ = dump(capsys, "--files", tmp_path / name, "--print-data-log")
        assert code == 0 and out[1] == header and out[-1].endswith("payload: record")


@pytest.fixture(scope="module")
def kafka_reader(tmp_path_factory):
    """Apache's kafka-clients reading segments (tests/java/KafkaRecordsProbe.java), skipped without a JDK or the jars."""
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256),
                 *map(wheel_jar, ("slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar"))]
    running = start_probe(tmp_path_factory.mktemp("records-probe"), "KafkaRecordsProbe.java", classpath)
    yield running
    running.close()


def kafka_text(value):
    """A value of Kafka's getters as DumpLogSegments prints it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"[{','.join(value)}]"
    return str(value)


@pytest.mark.parametrize("source", ["plain-0", "idempotent-0", "txn-0", "old formats", "truncated"])
def test_every_field_is_what_kafkas_own_reader_finds(written, kafka_reader, capsys, tmp_path, source):
    if source == "old formats":
        path = tmp_path / f"{SEGMENT}.log"
        old_format_segment(path)
    elif source == "truncated":
        path = tmp_path / f"{SEGMENT}.log"
        path.write_bytes(segment(written, "plain-0").read_bytes()[:-30])
    else:
        path = segment(written, source)
    kafka = kafka_reader("read", path)
    assert "error" not in kafka, kafka
    code, out, _ = dump(capsys, "--files", path, "--print-data-log")
    assert code == 0
    found = batches_and_records(out)
    assert len(found) == len(kafka["batches"])
    for (batch, records), expected in zip(found, kafka["batches"]):
        timestamp_type = expected["timestampType"]
        assert batch[timestamp_type] == str(expected["maxTimestamp"])
        names = ["position", "size", "magic", "compresscodec", "crc", "isvalid"]
        if expected["magic"] == 2:
            names += ["baseOffset", "lastOffset", "count", "baseSequence", "lastSequence", "producerId",
                      "producerEpoch", "partitionLeaderEpoch", "isTransactional", "isControl", "deleteHorizonMs"]
        else:
            assert batch["offset"] == str(expected["lastOffset"])
        assert {name: batch[name] for name in names} == {name: kafka_text(expected[name]) for name in names}
        assert len(records) == len(expected["records"])
        for line, kafka_record in zip(records, expected["records"]):
            record = fields(line)
            if "crc" in record:
                record["crc"] = record["crc"].rstrip("}")
            wanted = {name: value for name, value in kafka_record.items() if value is not None}
            wanted[timestamp_type] = wanted.pop("timestamp")
            assert {name: record.get(name) for name in wanted} == {name: kafka_text(v) for name, v in wanted.items()}
    trailing = kafka["size"] - kafka["validBytes"]
    assert (out[-1] == f"Found {trailing} invalid bytes at the end of {SEGMENT}.log") == (trailing > 0)


def test_files_are_only_read(written, capsys, tmp_path):
    """No file is created or changed: a time index whose offset index is gone is checked from the segment's
    start (Kafka's tool would create the missing index)."""
    copy = tmp_path / "plain-0"
    shutil.copytree(written / "plain-0", copy)
    os.remove(copy / f"{SEGMENT}.index")
    before = {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in copy.iterdir()}
    names = ",".join(str(path) for path in sorted(copy.iterdir()))
    code, out, err = dump(capsys, "--files", names, "--print-data-log")
    assert code == 0 and any(line.startswith("timestamp:") for line in out)
    assert not [line for line in err if not line.startswith("Ignoring unknown file")]
    assert {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in copy.iterdir()} == before


def kafka_string(text):
    return struct.pack(">h", len(text)) + text.encode()


def test_offsets_decoder_json_is_kafkas(capsys, tmp_path):
    """The strings of Kafka's DumpLogSegmentsTest.testOffsetsMessageParser (at GroupMetadataValue v3, which
    kmem and Kafka 3.9 write: v4 has the same fields), and its answers for what does not decode."""
    foo_0 = struct.pack(">i", 1) + kafka_string("foo") + struct.pack(">ii", 1, 0)
    subscription = (struct.pack(">hi", 3, 1) + kafka_string("foo") + struct.pack(">i", -1) + foo_0
                    + struct.pack(">i", 0) + kafka_string("rack"))           # ConsumerProtocolSubscription v3
    assignment = struct.pack(">h", 3) + foo_0 + struct.pack(">i", -1)       # ConsumerProtocolAssignment v3

    def group(subscription, assignment):
        member = MemberRecord("member", "instance", "client", "host", 1000, 100, subscription, assignment)
        return group_metadata_value(GroupRecord("consumer", 10, "range", "member", -1, [member]))

    key = group_metadata_key("group")
    path = tmp_path / f"{SEGMENT}.log"
    path.write_bytes(bytes(build_records([
        {"key": key, "value": group(subscription, assignment)},
        {"key": key, "value": group(b"Subscription", b"Assignment")},
        {"key": key, "value": None},
        {"key": struct.pack(">h", 32767) + kafka_string("group"), "value": b"?"},
        {"key": None, "value": b"?"},
        {"key": offset_commit_key("group", "foo", 0), "value": struct.pack(">hq", 3, 5)},
    ])))
    code, out, _ = dump(capsys, "--files", path, "--offsets-decoder", "--skip-record-metadata")
    assert code == 0
    member = ('{"version":"3","data":{"protocolType":"consumer","generation":10,"protocol":"range","leader":"member",'
              '"currentStateTimestamp":-1,"members":[{"memberId":"member","groupInstanceId":"instance","clientId":'
              '"client","clientHost":"host","rebalanceTimeout":1000,"sessionTimeout":100,')
    assert [line for line in out if line.startswith("|")] == [
        '| key: {"type":"2","data":{"group":"group"}} payload: ' + member + '"subscription":{"topics":["foo"],'
        '"userData":null,"ownedPartitions":[{"topic":"foo","partitions":[0]}],"generationId":0,"rackId":"rack"},'
        '"assignment":{"assignedPartitions":[{"topic":"foo","partitions":[0]}],"userData":null}}]}}',
        '| key: {"type":"2","data":{"group":"group"}} payload: ' + member + '"subscription":"U3Vic2NyaXB0aW9u",'
        '"assignment":"QXNzaWdubWVudA=="}]}}',
        '| key: {"type":"2","data":{"group":"group"}} payload: <DELETE>',
        "| key: Unknown record type 32767 at offset 3, skipping.",
        "| key: Failed to decode message at offset 4 using offset topic decoder (message had a missing key)",
        "| key: Error at offset 5, skipping. __consumer_offsets offset commit value: truncated at byte 10 (needs 4 "
        "more bytes)"]

"""``kmem produce``: Kafka's ``kafka-console-producer.sh`` (its ``ConsoleProducer`` and ``LineMessageReader``) over
any Kafka broker: each line of stdin a message, parsed with the ``--property`` settings Kafka's reader takes.

Messages go to each partition's leader in Produce requests of kmem's own record batches (acks=all), a batch
per partition, sent when it holds ``BATCH_RECORDS`` messages or ``BATCH_BYTES``, when ``LINGER`` passed since
its first message, and at the end of stdin. A keyed message goes to the partition Kafka's default
partitioner picks (murmur2 of the key), so it lands where a Java client puts that key; others go round
robin, a batch at a time.
"""
import os
import queue
import signal
import sys
import threading
import time

from kmem.admin.commands import BAD_ARGUMENTS, CommandError, tool_properties

NAME = "produce"
HELP = "produce the lines of stdin as messages to a topic (kafka-console-producer.sh)"
DESCRIPTION = """\
Produce each line of stdin as a message to a topic, on any Kafka broker, as Kafka's kafka-console-producer.sh
does (its --property settings). It returns at the end of stdin once every message is acknowledged (acks=all).

  kmem produce --bootstrap-server HOST:PORT --topic T [--property parse.key=true] [--property key.separator=:]
               [--property parse.headers=true] [--partition P] [--rate MESSAGES_PER_SECOND] < lines

--property: parse.key (false: the line is the value), key.separator (a tab), parse.headers (false; true:
HEADERS<headers.delimiter>REST, with HEADERS as KEY<headers.key.separator>VALUE pairs between
headers.separator), headers.delimiter (a tab), headers.separator (,), headers.key.separator (:),
null.marker (none: a key, value or header value equal to it is null), ignore.error (false: a line without
the key separator is an error; true: it is the value)."""

LINE_PROPERTIES = {"parse.key": "false", "key.separator": "\t", "parse.headers": "false", "headers.delimiter": "\t",
                   "headers.separator": ",", "headers.key.separator": ":", "null.marker": "", "ignore.error": "false"}
BATCH_RECORDS, BATCH_BYTES, LINGER = 1000, 1 << 20, 0.1
ALL_REPLICAS = -1                   # acks=all, kafka-console-producer.sh's default
END = None                          # what the stdin reader queues at the end of stdin


def add_arguments(parser):
    parser.add_argument("--topic", required=True, help="the topic to produce to")
    parser.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                        help="how lines are read: " + ", ".join(LINE_PROPERTIES) + "; repeatable")
    parser.add_argument("--partition", metavar="P", help="send every message to partition P")
    parser.add_argument("--rate", metavar="MESSAGES_PER_SECOND",
                        help="send at most this many messages a second (default: as fast as stdin gives them)")


def check_arguments(args):
    properties = tool_properties(args.property, LINE_PROPERTIES)
    for flag in ("parse.key", "parse.headers", "ignore.error"):
        if properties[flag].lower() not in ("true", "false"):
            raise CommandError(f"--property {flag} takes true or false, not {properties[flag]!r}", BAD_ARGUMENTS)
    for separator in ("key.separator", "headers.delimiter", "headers.separator", "headers.key.separator"):
        if not properties[separator]:
            raise CommandError(f"--property {separator} must not be empty", BAD_ARGUMENTS)
    args.reader = LineReader(properties)
    if args.partition is not None:
        if not args.partition.isdigit():
            raise CommandError(f"--partition takes a partition number, not {args.partition!r}", BAD_ARGUMENTS)
        args.partition = int(args.partition)
    if args.rate is not None:
        try:
            args.rate = float(args.rate)
        except ValueError:
            args.rate = 0.0
        if not 0 < args.rate < float("inf"):
            raise CommandError("--rate takes a number of messages a second above 0", BAD_ARGUMENTS)


class LineReader:
    """A line of stdin as a message: ``{"key", "value", "headers"}``, as Kafka's ``LineMessageReader`` reads it."""

    def __init__(self, properties):
        self.parse_key = properties["parse.key"].lower() == "true"
        self.parse_headers = properties["parse.headers"].lower() == "true"
        self.ignore_error = properties["ignore.error"].lower() == "true"
        self.key_separator, self.headers_delimiter, self.headers_separator, self.header_key_separator = (
            properties[name].encode() for name in ("key.separator", "headers.delimiter", "headers.separator",
                                                   "headers.key.separator"))
        self.null_marker = properties["null.marker"].encode() or None

    def message(self, line, number):
        headers = []
        if self.parse_headers:
            pairs, found, line = line.partition(self.headers_delimiter)
            if not found:
                raise CommandError(f"No headers delimiter found on line number {number}: {_shown(pairs)}")
            for pair in pairs.split(self.headers_separator) if pairs else ():
                key, found, value = pair.partition(self.header_key_separator)
                if not found:
                    raise CommandError(f"No header key separator found in pair {_shown(pair)} on line number "
                                       f"{number}")
                try:
                    headers.append((key.decode(), self._nullable(value)))
                except UnicodeDecodeError:
                    raise CommandError(f"the header key {_shown(key)} on line number {number} is not UTF-8") \
                        from None
        key = None
        if self.parse_key:
            key, found, value = line.partition(self.key_separator)
            if not found:
                if not self.ignore_error:
                    raise CommandError(f"No key separator found on line number {number}: {_shown(line)} "
                                       "(--property ignore.error=true takes such a line as a value)")
                key, value = None, line
            line = value
        return {"key": self._nullable(key), "value": self._nullable(line), "headers": headers}

    def _nullable(self, data):
        return None if data is None or data == self.null_marker else data


def _shown(data):
    return repr(data.decode(errors="replace"))


def _stdin_lines():
    """stdin's lines as bytes. A file of its own over stdin's descriptor where there is one: the reader thread
    blocks in it, and a Ctrl-C exit then finds ``sys.stdin`` free to close (a daemon thread holding its lock at
    interpreter shutdown aborts the process)."""
    try:
        return open(os.dup(sys.stdin.fileno()), "rb")
    except (AttributeError, OSError, ValueError):      # a stdin without a descriptor (io.StringIO)
        return getattr(sys.stdin, "buffer", None) or (line.encode() for line in sys.stdin)


def _read_lines(stream, lines):
    """Queues each line of ``stream`` (bytes, without its line end), then ``END``; a thread of its own, so that a
    batch waiting for more lines is sent after ``LINGER`` whatever stdin does."""
    try:
        for line in stream:
            lines.put(line.rstrip(b"\n").rstrip(b"\r"))
    finally:
        lines.put(END)


def execute(client, args):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check

    topic = client.metadata([args.topic]).topics[0]
    if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --create --topic {args.topic} "
                           "creates it")
    check(topic.error_code, f"cannot read the metadata of topic {args.topic!r}")
    partitions = len(topic.partitions)
    if args.partition is not None and args.partition >= partitions:
        raise CommandError(f"topic {args.topic!r} has no partition {args.partition}: it has {partitions}")

    lines = queue.Queue(maxsize=BATCH_RECORDS)
    stream = _stdin_lines()
    threading.Thread(target=_read_lines, args=(stream, lines), name="kmem-produce-stdin", daemon=True).start()
    sender = Sender(client, args.topic, partitions)
    # Ctrl-C ends the input, as the end of stdin does: noted by a handler, not raised, so that it never cuts a
    # send short (the messages taken from the buffer would be lost, a pooled answer left unreleased)
    interrupted = threading.Event()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set()) if in_main_thread else None
    try:
        _produce_lines(args, lines, sender, interrupted)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    sender.send()


def _produce_lines(args, lines, sender, interrupted):
    started, number = time.monotonic(), 0
    while True:
        wait = LINGER if sender.first_buffered is None else max(0.0, sender.first_buffered + LINGER - time.monotonic())
        try:       # once interrupted, the lines already read are taken, without waiting for more
            line = lines.get(block=not interrupted.is_set(), timeout=wait)
        except queue.Empty:
            if interrupted.is_set():
                break
            sender.send()
            continue
        if line is END:
            break
        number += 1
        try:
            message = args.reader.message(line, number)
        except CommandError:
            sender.send()       # the lines before it are produced, as Kafka's console producer has sent them
            raise
        if args.rate is not None:       # the n-th message goes no sooner than n / rate seconds after the first
            ahead = started + (number - 1) / args.rate - time.monotonic()
            if ahead > 0:
                sender.send()
                time.sleep(ahead)
        if args.partition is not None:
            partition = args.partition
        elif message["key"] is not None:
            partition = (murmur2(message["key"]) & 0x7FFFFFFF) % sender.partitions
        else:
            partition = sender.sticky_partition
        sender.add(partition, message)
        if sender.buffered_records >= BATCH_RECORDS or sender.buffered_bytes >= BATCH_BYTES:
            sender.send()


class Sender:
    """Batches of a topic's partitions, sent to their leaders (acks=all), retried on a leader change.
    ``sticky_partition`` is where messages without a key go: the next partition after each send (KIP-480)."""

    def __init__(self, client, topic, partitions):
        self.client, self.topic, self.partitions = client, topic, partitions
        self.sticky_partition = 0
        self.batches = {}
        self.first_buffered = None
        self.buffered_records = self.buffered_bytes = 0

    def add(self, partition, message):
        message["timestamp"] = int(time.time() * 1000)
        self.batches.setdefault(partition, []).append(message)
        self.first_buffered = self.first_buffered or time.monotonic()
        self.buffered_records += 1
        self.buffered_bytes += len(message["value"] or b"") + len(message["key"] or b"")

    def send(self):
        """Sends what is buffered and waits for every acknowledgement; raises ``AdminError`` for a refusal."""
        from kmem.admin.client import RETRIABLE, check
        from kmem.records import build_records

        if not self.batches:
            return
        pending = {partition: bytes(build_records(messages)) for partition, messages in self.batches.items()}
        self.sticky_partition = (self.sticky_partition + 1) % self.partitions
        self.batches, self.first_buffered, self.buffered_records, self.buffered_bytes = {}, None, 0, 0
        deadline = time.monotonic() + self.client.request_timeout_ms / 1000
        while pending:
            leaders = {p.partition_index: p.leader_id for p in self.client.metadata([self.topic]).topics[0].partitions}
            by_leader = {}
            for partition, records in pending.items():
                by_leader.setdefault(leaders.get(partition, -1), {})[partition] = records
            for leader, batches in by_leader.items():
                if leader < 0:
                    continue        # no leader for now: asked again below
                for partition, code, message in self._produce(leader, batches):
                    if code in RETRIABLE and time.monotonic() < deadline:
                        continue
                    check(code, f"cannot produce to {self.topic}-{partition}", message)
                    del pending[partition]
            if pending:
                if time.monotonic() > deadline:
                    raise CommandError(f"partitions {sorted(pending)} of {self.topic!r} have no leader that "
                                       "takes the messages: try again when kmem topics --describe shows one")
                time.sleep(0.1)

    def _produce(self, leader, batches):
        from kmem.protocol import messages

        Request = messages.ProduceRequest
        response = self.client.request(Request(
            acks=ALL_REPLICAS, timeout_ms=self.client.request_timeout_ms, transactional_id=None,
            topic_data=[Request.TopicProduceData(name=self.topic, partition_data=[
                Request.PartitionProduceData(index=partition, records=records)
                for partition, records in sorted(batches.items())])]), leader)
        return [(p.index, p.error_code, p.error_message)
                for topic in response.responses for p in topic.partition_responses]


def murmur2(data):
    """Murmur2 (32 bits, seed 0x9747b28c) as Kafka's default partitioner hashes a key, as a signed int."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h

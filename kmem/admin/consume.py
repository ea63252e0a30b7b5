"""``kmem consume``: Kafka's ``kafka-console-consumer.sh`` (its ``ConsoleConsumer`` and ``DefaultMessageFormatter``)
over any Kafka broker, with kmem's consumer (``kmem.consumer.Consumer``): messages to stdout, a line each, with
the fields the ``print.*`` properties ask for.

Without --group it assigns itself the partitions (no group, nothing committed); with --group it subscribes as
a member of that group and commits, when it ends, the offsets of the messages it printed.
"""
import sys
import time

from kmem.admin.commands import BAD_ARGUMENTS, CommandError, tool_properties

NAME = "consume"
HELP = "print a topic's messages to stdout (kafka-console-consumer.sh)"
DESCRIPTION = """\
Print the messages of a topic to stdout, a line each, from any Kafka broker, as Kafka's kafka-console-consumer.sh
does (its options, its --property settings). It runs until --max-messages are printed, --timeout-ms passes
without a message, or Ctrl-C, then says how many it printed on stderr.

  kmem consume --bootstrap-server HOST:PORT --topic T [--from-beginning] [--group G] [--max-messages N]
               [--timeout-ms MS] [--isolation-level read_committed] [--property print.key=true ...]
  kmem consume --bootstrap-server HOST:PORT --topic T --partition P --offset earliest|latest|OFFSET
  kmem consume --bootstrap-server HOST:PORT --topic T [--partition P] --from-timestamp MS|YYYY-MM-DDTHH:mm:SS

--from-timestamp starts each partition at its first message at or after that time (ListOffsets by timestamp, as
kafka-consumer-groups --to-datetime and kcat -o s@MS find it); a partition whose messages are all older starts at
its end. A time without a zone is local time.

--property: print.timestamp, print.partition, print.offset, print.headers, print.key (false), print.value
(true); key.separator (a tab, between the fields), line.separator (a newline), headers.separator (,),
headers.key.separator (:), null.literal (null: how a null key, value or header value is printed).
A line is TIMESTAMP_TYPE:TIMESTAMP, Partition:P, Offset:O, headers (NO_HEADERS without), key, value."""

FORMAT_PROPERTIES = {"print.timestamp": "false", "print.partition": "false", "print.offset": "false",
                     "print.headers": "false", "print.key": "false", "print.value": "true", "key.separator": "\t",
                     "line.separator": "\n", "headers.separator": ",", "headers.key.separator": ":",
                     "null.literal": "null"}
FIELDS = ("print.timestamp", "print.partition", "print.offset", "print.headers", "print.key", "print.value")
POLL_MS = 200


def add_arguments(parser):
    parser.add_argument("--topic", required=True, help="the topic to consume")
    parser.add_argument("--partition", metavar="P", help="only partition P (default: every partition)")
    parser.add_argument("--offset", metavar="earliest|latest|OFFSET",
                        help="with --partition: where to start (default: latest)")
    parser.add_argument("--from-beginning", action="store_true",
                        help="start at the earliest message (with --group: where the group has no offset)")
    parser.add_argument("--from-timestamp", metavar="MS|YYYY-MM-DDTHH:mm:SS",
                        help="start at the first message at or after this time (milliseconds since the epoch, or "
                             "an ISO-8601 date and time)")
    parser.add_argument("--group", help="consume as a member of this group, and commit what was printed")
    parser.add_argument("--max-messages", metavar="N", help="stop after N messages")
    parser.add_argument("--timeout-ms", metavar="MS", help="stop when no message came for MS milliseconds")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted", help="read_committed: leave out aborted transactions' "
                                                         "messages, and stop at the first open one")
    parser.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                        help="how messages are printed: " + ", ".join(FORMAT_PROPERTIES) + "; repeatable")


def check_arguments(args):
    args.format = Formatter(tool_properties(args.property, FORMAT_PROPERTIES))
    args.partition = _number(args.partition, "--partition", "a partition number")
    args.max_messages = _number(args.max_messages, "--max-messages", "a number of messages")
    args.timeout_ms = _number(args.timeout_ms, "--timeout-ms", "a number of milliseconds")
    if args.offset is not None:
        if args.partition is None:
            raise CommandError("--offset needs --partition (the partition it is an offset of)", BAD_ARGUMENTS)
        if args.from_beginning:
            raise CommandError("--offset and --from-beginning exclude each other", BAD_ARGUMENTS)
        if args.offset not in ("earliest", "latest"):
            args.offset = _number(args.offset, "--offset", "earliest, latest or an offset")
    if args.from_timestamp is not None:
        from kmem.admin.reset_offsets import datetime_ms

        text = args.from_timestamp.strip()
        args.from_timestamp = int(text) if text.isdigit() else datetime_ms(text, "--from-timestamp",
                                                                           "milliseconds since the epoch or ")
        for other, given in (("--offset", args.offset is not None), ("--from-beginning", args.from_beginning),
                             ("--group", args.group is not None)):
            if given:
                raise CommandError(f"--from-timestamp and {other} exclude each other"
                                   + (": kmem groups --reset-offsets --to-datetime moves a group"
                                      if other == "--group" else ""), BAD_ARGUMENTS)
    if args.group is not None and args.partition is not None:
        raise CommandError("--group and --partition exclude each other: a group assigns its members the "
                           "partitions", BAD_ARGUMENTS)


def _number(text, option, what):
    if text is None:
        return None
    if not text.strip().isdigit():
        raise CommandError(f"{option} takes {what}, not {text!r}", BAD_ARGUMENTS)
    return int(text)


class Formatter:
    """A message as Kafka's ``DefaultMessageFormatter`` prints it, as bytes."""

    def __init__(self, properties):
        for flag in FIELDS:
            if properties[flag].lower() not in ("true", "false"):
                raise CommandError(f"--property {flag} takes true or false, not {properties[flag]!r}", BAD_ARGUMENTS)
        self.fields = [flag for flag in FIELDS if properties[flag].lower() == "true"]
        self.separator, self.line_end, self.headers_separator, self.header_key_separator, self.null = (
            properties[name].encode() for name in ("key.separator", "line.separator", "headers.separator",
                                                   "headers.key.separator", "null.literal"))

    def line(self, record):
        # kmem's consumer does not hand over the timestamp type: a topic of LogAppendTime prints CreateTime too
        shown = {
            "print.timestamp": f"CreateTime:{record.timestamp}".encode() if record.timestamp >= 0 else b"NO_TIMESTAMP",
            "print.partition": f"Partition:{record.partition}".encode(),
            "print.offset": f"Offset:{record.offset}".encode(),
            "print.headers": self.headers_separator.join(
                key.encode() + self.header_key_separator + self._nullable(value) for key, value in record.headers)
            or b"NO_HEADERS",
            "print.key": self._nullable(record.key),
            "print.value": self._nullable(record.value),
        }
        return self.separator.join(shown[field] for field in self.fields) + self.line_end

    def _nullable(self, data):
        return self.null if data is None else bytes(data)


def execute(client, args):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check
    from kmem.consumer import Consumer, TopicPartition

    topic = client.metadata([args.topic]).topics[0]
    if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
    check(topic.error_code, f"cannot read the metadata of topic {args.topic!r}")
    partitions = sorted(p.partition_index for p in topic.partitions)
    if args.partition is not None and args.partition not in partitions:
        raise CommandError(f"topic {args.topic!r} has no partition {args.partition}: it has {len(partitions)}")

    config = args.client_config
    start_at_beginning = args.from_beginning or args.offset == "earliest"
    consumer = Consumer.from_properties({
        "bootstrap.servers": args.bootstrap_server, "client.id": config["client.id"], "group.id": args.group,
        "enable.auto.commit": False, "auto.offset.reset": "earliest" if start_at_beginning else "latest",
        "isolation.level": args.isolation_level, "request.timeout.ms": config["request.timeout.ms"],
        "allow.auto.create.topics": False, **config["security_properties"]}, ssl_context=config["ssl_context"])
    printed, next_offsets = 0, {}
    try:
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            assigned = [TopicPartition(args.topic, p) for p in
                        ([args.partition] if args.partition is not None else partitions)]
            consumer.assign(assigned)
            if isinstance(args.offset, int):
                consumer.seek(assigned[0], args.offset)
            if args.from_timestamp is not None:
                _seek_to_time(client, consumer, assigned, args.from_timestamp)
        out = Output()
        last_message = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            if args.timeout_ms is not None and time.monotonic() - last_message > args.timeout_ms / 1000:
                break
            records = consumer.poll(POLL_MS)
            if records:
                last_message = time.monotonic()
            for record in records[:None if args.max_messages is None else args.max_messages - printed]:
                out.write(args.format.line(record))
                printed += 1
                next_offsets[TopicPartition(record.topic, record.partition)] = record.offset + 1
            out.flush()
    except KeyboardInterrupt:       # Ctrl-C: the end the user asked for
        pass
    finally:
        try:
            if args.group is not None and next_offsets:
                consumer.commit(next_offsets)
        finally:
            consumer.close(autocommit=False)
            print(f"Processed a total of {printed} messages", file=sys.stderr)


def _seek_to_time(client, consumer, assigned, timestamp):
    """Each partition to its first message at or after ``timestamp`` (ms); one without stays where
    auto.offset.reset (latest) puts it: at its end."""
    from kmem.admin.groups import _log_end_offsets

    found = _log_end_offsets(client, [(tp.topic, tp.partition) for tp in assigned], timestamp)
    for tp in assigned:
        if (tp.topic, tp.partition) in found:
            consumer.seek(tp, found[(tp.topic, tp.partition)])


class Output:
    """stdout as bytes (a message's key and value are printed as they are, as Kafka's formatter prints them);
    a stdout of text only (a StringIO) gets them decoded as UTF-8."""

    def __init__(self):
        self.binary = getattr(sys.stdout, "buffer", None)
        if self.binary is not None:
            sys.stdout.flush()

    def write(self, data):
        if self.binary is not None:
            self.binary.write(data)
        else:
            sys.stdout.write(data.decode(errors="replace"))

    def flush(self):
        (self.binary or sys.stdout).flush()

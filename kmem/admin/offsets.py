"""``kmem offsets``: Kafka's ``kafka-get-offsets.sh`` (its ``GetOffsetShell``) over any Kafka broker: an offset of
each partition, ``TOPIC:PARTITION:OFFSET`` a line, from ListOffsets to the partition's leader."""
import re

from kmem.admin.commands import BAD_ARGUMENTS, CommandError

NAME = "offsets"
HELP = "the earliest, latest or first-after-a-time offset of partitions (kafka-get-offsets.sh)"
DESCRIPTION = """\
Print an offset of each partition, TOPIC:PARTITION:OFFSET a line, from any Kafka broker, as Kafka's
kafka-get-offsets.sh does:

  kmem offsets --bootstrap-server HOST:PORT [--topic REGEX] [--partitions 0,2-4] [--time -1|-2|-3|TIMESTAMP]

--time: -1 or latest (the log end offset, the default), -2 or earliest (the log start offset), -3 or
max-timestamp (the offset of the record with the largest timestamp), or a timestamp in milliseconds (the
first record at or after it; a partition with none is left out)."""

TIMES = {"latest": -1, "earliest": -2, "max-timestamp": -3}
PARTITIONS = re.compile(r"(\d+)(?:-(\d+))?")


def add_arguments(parser):
    parser.add_argument("--topic", help="a regular expression of the topics (default: every topic)")
    parser.add_argument("--partitions", metavar="P,P-Q", help="the partitions: numbers and ranges, e.g. 0,3-5 "
                                                             "(default: every partition)")
    parser.add_argument("--time", default="-1", metavar="-1|-2|-3|TIMESTAMP",
                        help="latest (-1, default), earliest (-2), max-timestamp (-3) or a timestamp in ms")
    parser.add_argument("--exclude-internal-topics", action="store_true",
                        help="leave out internal topics (__consumer_offsets, ...)")


def check_arguments(args):
    try:
        args.pattern = re.compile(args.topic or ".*")
    except re.error as exc:
        raise CommandError(f"--topic {args.topic!r} is not a regular expression: {exc}", BAD_ARGUMENTS) from None
    args.partition_filter = None
    if args.partitions is not None:
        args.partition_filter = []
        for part in args.partitions.split(","):
            match = PARTITIONS.fullmatch(part.strip())
            if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
                raise CommandError(f"--partitions takes partition numbers and ranges such as 0,3-5, not "
                                   f"{args.partitions!r}", BAD_ARGUMENTS)
            args.partition_filter.append((int(match.group(1)), int(match.group(2) or match.group(1))))
    time = TIMES.get(args.time, args.time)
    if not re.fullmatch(r"-[123]|\d{1,18}", str(time)):
        raise CommandError(f"--time takes -1 (latest), -2 (earliest), -3 (max-timestamp) or a timestamp in "
                           f"milliseconds, not {args.time!r}", BAD_ARGUMENTS)
    args.timestamp = int(time)


def execute(client, args):
    from kmem.admin.groups import _log_end_offsets

    partitions = []
    for topic in sorted(client.metadata().topics, key=lambda t: t.name):
        if topic.error_code or not args.pattern.fullmatch(topic.name) or \
                (args.exclude_internal_topics and topic.is_internal):
            continue
        partitions += [(topic.name, index) for index in sorted(p.partition_index for p in topic.partitions)
                       if args.partition_filter is None or
                       any(low <= index <= high for low, high in args.partition_filter)]
    if not partitions:
        raise CommandError("Could not match any topic-partitions with the specified filters: kmem topics --list "
                           "shows the topics")
    offsets = _log_end_offsets(client, partitions, args.timestamp)
    for topic, partition in partitions:
        if (topic, partition) in offsets:
            print(f"{topic}:{partition}:{offsets[(topic, partition)]}")

"""``kmem groups --reset-offsets``: Kafka's ``kafka-consumer-groups.sh --reset-offsets`` (its
``ConsumerGroupCommand``): a plan of new committed offsets for an inactive group's partitions, printed as
Kafka's table (``--dry-run``, the default) or committed (``--execute``).

The new offsets come from the partitions' log start and end (ListOffsets earliest and latest, from each
leader), a time (ListOffsets by timestamp: the first record at or after it; past the last record, the log
end), or the group's committed offsets (OffsetFetch); a requested offset outside the log is moved to its
nearest end, as Kafka's tool does. ``--execute`` commits them as an admin does (OffsetCommit with no
generation and no member id), which the coordinator accepts only for a group without members.
"""
import datetime
import re
import sys
import time

from kmem.admin.commands import BAD_ARGUMENTS, CommandError, print_table

SCENARIOS = ("to_earliest", "to_latest", "to_current", "to_offset", "shift_by", "to_datetime", "by_duration")
INACTIVE = ("Empty", "Dead")        # Dead: the coordinator knows no such group, whose offsets a reset creates
EARLIEST, LATEST = -2, -1           # ListOffsets' special timestamps
# Java's Duration.parse: PnDTnHnMn.nS, each part optional and signed, the whole too
DURATION = re.compile(r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d{1,9})?)S)?)?",
                      re.IGNORECASE)
TOPIC_PARTITIONS = re.compile(r"([^:]+)(?::(\d+(?:,\d+)*))?")
MEMBERS_PRESENT = {22, 25, 27}     # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS


def add_arguments(parser):
    """The options of --reset-offsets (the action itself is among kmem groups' actions)."""
    parser.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P...]",
                        help="--reset-offsets: a topic (every partition) or some of its partitions, e.g. orders:0,2; "
                             "repeatable")
    parser.add_argument("--all-topics", action="store_true",
                        help="--reset-offsets: every partition the group has committed an offset for")
    scenarios = parser.add_mutually_exclusive_group()
    scenarios.add_argument("--to-earliest", action="store_true", help="reset to each partition's log start offset")
    scenarios.add_argument("--to-latest", action="store_true", help="reset to each partition's log end offset")
    scenarios.add_argument("--to-current", action="store_true",
                           help="reset to the committed offset (the log end offset where none is)")
    scenarios.add_argument("--to-offset", metavar="OFFSET", help="reset to OFFSET (within the log's start and end)")
    scenarios.add_argument("--shift-by", metavar="N", help="move the committed offset by N (negative: back)")
    scenarios.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss",
                           help="reset to the first record at or after this time (local time, or with a zone: "
                                "Z, +01:00)")
    scenarios.add_argument("--by-duration", metavar="PnDTnHnMnS",
                           help="reset to the first record at or after this long ago (ISO-8601, e.g. PT30M, P1DT2H)")
    run = parser.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="--reset-offsets: print the plan only (the default)")
    run.add_argument("--execute", action="store_true", help="--reset-offsets: commit the new offsets")


def check_arguments(args):
    """Checks and parses what --reset-offsets takes (``CommandError``, exit 2); other actions take none of it."""
    given = [name for name in SCENARIOS if getattr(args, name) not in (None, False)]
    options = given + [name for name in ("topic", "all_topics", "dry_run", "execute") if getattr(args, name)]
    if not args.reset_offsets:
        if options:
            raise CommandError(f"--{options[0].replace('_', '-')} applies to --reset-offsets", BAD_ARGUMENTS)
        return
    if not given:
        raise CommandError("--reset-offsets takes one of --to-earliest, --to-latest, --to-current, --to-offset, "
                           "--shift-by, --to-datetime, --by-duration", BAD_ARGUMENTS)
    if bool(args.topic) == bool(args.all_topics):
        raise CommandError("--reset-offsets takes --topic or --all-topics (one of them)", BAD_ARGUMENTS)
    args.scenario = given[0]
    args.reset_topics = [_topic_partitions(spec) for spec in args.topic]
    if args.to_offset is not None:
        args.to_offset = _whole(args.to_offset, "--to-offset", "an offset")
    if args.shift_by is not None:
        args.shift_by = _whole(args.shift_by, "--shift-by", "a number of offsets")
    if args.to_datetime is not None:
        args.timestamp = datetime_ms(args.to_datetime)
    if args.by_duration is not None:
        args.timestamp = int(time.time() * 1000) - _duration_ms(args.by_duration)


def _whole(text, option, what):
    if not re.fullmatch(r"[-+]?\d{1,19}", text.strip()):
        raise CommandError(f"{option} takes {what} (a whole number), not {text!r}", BAD_ARGUMENTS)
    return int(text)


def _topic_partitions(spec):
    """``(topic, [partitions] or None)`` of ``TOPIC`` or ``TOPIC:P,P``."""
    match = TOPIC_PARTITIONS.fullmatch(spec)
    if not match or not match.group(1).strip():
        raise CommandError(f"--topic takes TOPIC or TOPIC:PARTITION,PARTITION..., not {spec!r}", BAD_ARGUMENTS)
    partitions = match.group(2)
    return match.group(1), None if partitions is None else sorted({int(p) for p in partitions.split(",")})


def datetime_ms(text, option="--to-datetime", also=""):
    """Milliseconds since the epoch of Kafka's --to-datetime (``Utils.getDateTime``): an ISO-8601 date and time,
    in the local time zone unless one is given; ``CommandError`` naming ``option`` (which takes ``also`` too)."""
    try:
        if "T" not in text:
            raise ValueError
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{option} takes {also}YYYY-MM-DDTHH:mm:SS.sss with an optional time zone (Z, +01:00), "
                           f"not {text!r}", BAD_ARGUMENTS) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()        # the local time zone, as Kafka's tool reads a time without one
    return int(moment.timestamp() * 1000)


def _duration_ms(text):
    match = DURATION.fullmatch(text.strip())
    if not match or not any(match.groups()[1:]) or text.strip().upper().endswith("T"):
        raise CommandError(f"--by-duration takes an ISO-8601 duration PnDTnHnMnS (e.g. PT30M, P1DT12H), "
                           f"not {text!r}", BAD_ARGUMENTS)
    sign, days, hours, minutes, seconds = match.groups()
    total = sum(float((part or "0").replace(",", ".")) * scale
                for part, scale in ((days, 86400), (hours, 3600), (minutes, 60), (seconds, 1)))
    return int(round(total * 1000)) * (-1 if sign == "-" else 1)


def reset_offsets(client, args, group_ids):
    """Each group's plan as one table; committed with --execute. A group with members is refused (when several
    groups are asked, it is named on stderr and the others go on)."""
    from kmem.admin.groups import each_group

    rows = []

    def reset(group_id):
        plan = _plan(client, args, group_id)
        if args.execute:
            _commit(client, group_id, plan)
        rows.extend((group_id, topic, partition, offset) for (topic, partition), offset in sorted(plan.items()))
    failed = each_group(group_ids, reset)
    if not args.execute and not args.dry_run:
        print("WARN: No action will be performed as the --execute option is missing. Add --dry-run to keep this "
              "behaviour without the warning, or --execute to commit the new offsets.", file=sys.stderr)
    print()
    print_table(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), rows, {0: 30, 1: 30, 2: 10})
    return failed


def _plan(client, args, group_id):
    """``{(topic, partition): new offset}`` for an inactive group."""
    from kmem.admin.groups import _committed_offsets, _log_end_offsets

    state = _group_state(client, group_id)
    if state not in INACTIVE:
        raise CommandError(f"Assignments can only be reset if the group '{group_id}' is inactive, but the current "
                           f"state is {state}: stop its consumers, then reset")
    committed = _committed_offsets(client, group_id)
    partitions = sorted(committed) if args.all_topics else _partitions(client, args.reset_topics)
    earliest = _log_end_offsets(client, partitions, EARLIEST)
    latest = _log_end_offsets(client, partitions, LATEST)
    for tp in partitions:
        if tp not in earliest or tp not in latest:
            raise CommandError(f"partition {tp[0]}-{tp[1]} has no leader that answers ListOffsets: try again when "
                               "kmem topics --describe shows one")
    scenario = args.scenario
    if scenario in ("to_datetime", "by_duration"):
        found = _log_end_offsets(client, partitions, args.timestamp)
        return {tp: found.get(tp, latest[tp]) for tp in partitions}       # no record that late: the log end
    if scenario == "to_earliest":
        return {tp: earliest[tp] for tp in partitions}
    if scenario == "to_latest":
        return {tp: latest[tp] for tp in partitions}
    if scenario == "to_current":
        return {tp: committed.get(tp, latest[tp]) for tp in partitions}
    if scenario == "to_offset":
        requested = dict.fromkeys(partitions, args.to_offset)
    else:
        for tp in partitions:
            if tp not in committed:
                raise CommandError(f"Cannot shift offset for partition {tp[0]}-{tp[1]} since there is no current "
                                   "committed offset: reset it with --to-earliest, --to-latest or --to-offset first")
        requested = {tp: committed[tp] + args.shift_by for tp in partitions}
    return {tp: _within_log(tp, offset, earliest[tp], latest[tp]) for tp, offset in requested.items()}


def _within_log(tp, offset, earliest, latest):
    """``offset`` moved into the log, with Kafka's warning when it had to be."""
    if offset > latest:
        print(f"WARN: New offset ({offset}) is higher than latest offset for topic partition {tp[0]}-{tp[1]}. "
              f"Value will be set to {latest}", file=sys.stderr)
        return latest
    if offset < earliest:
        print(f"WARN: New offset ({offset}) is lower than earliest offset for topic partition {tp[0]}-{tp[1]}. "
              f"Value will be set to {earliest}", file=sys.stderr)
        return earliest
    return offset


def _group_state(client, group_id):
    from kmem.admin.client import check
    from kmem.protocol import messages

    response = client.group_request(group_id, messages.DescribeGroupsRequest(
        groups=[group_id], include_authorized_operations=False), lambda r: r.groups[0].error_code)
    group = response.groups[0]
    check(group.error_code, f"cannot describe group {group_id!r}", group.error_message)
    return group.group_state


def _partitions(client, specs):
    """``[(topic, partition)]`` of --topic's specs, each checked against the topic's metadata."""
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check

    names = sorted({topic for topic, _ in specs})
    known = {}
    for topic in client.metadata(names).topics:
        if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
            raise CommandError(f"topic {topic.name!r} does not exist: kmem topics --list shows the topics")
        check(topic.error_code, f"cannot read the metadata of topic {topic.name!r}")
        known[topic.name] = {p.partition_index for p in topic.partitions}
    partitions = set()
    for topic, asked in specs:
        missing = sorted(set(asked or ()) - known[topic])
        if missing:
            raise CommandError(f"topic {topic!r} has no partition {', '.join(map(str, missing))}: it has "
                               f"{len(known[topic])} (kmem topics --describe --topic {topic})")
        partitions.update((topic, p) for p in (asked if asked is not None else known[topic]))
    return sorted(partitions)


def _commit(client, group_id, plan):
    """Commits ``plan`` as an admin (no generation, no member): refused by the coordinator once members joined."""
    from kmem.admin.client import check, error_name
    from kmem.protocol import messages

    if not plan:
        return
    Request = messages.OffsetCommitRequest
    topics = {}
    for (topic, partition), offset in sorted(plan.items()):
        topics.setdefault(topic, []).append(Request.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, commit_timestamp=-1,
            committed_metadata=""))
    response = client.group_request(group_id, Request(
        group_id=group_id, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        retention_time_ms=-1, topics=[Request.OffsetCommitRequestTopic(name=t, partitions=p)
                                      for t, p in topics.items()]),
        lambda r: next((p.error_code for t in r.topics for p in t.partitions if p.error_code), 0))
    for topic in response.topics:
        for p in topic.partitions:
            if p.error_code in MEMBERS_PRESENT:
                raise CommandError(f"consumer group {group_id!r} gained members during the reset "
                                   f"({error_name(p.error_code)}): stop its consumers, then reset again")
            check(p.error_code, f"cannot commit offset {plan[(topic.name, p.partition_index)]} of "
                                f"{topic.name}-{p.partition_index} for group {group_id!r}")

"""``kmem groups``: Kafka's ``kafka-consumer-groups.sh`` (its ``ConsumerGroupCommand``) over any Kafka broker:
--list, --describe (offsets and lag, --members, --state) and --delete, with its options and columns.

The lag of a partition is computed as Kafka's tool computes it: the log end offset (ListOffsets latest,
read_uncommitted, from the partition's leader) less the group's committed offset (OffsetFetch from the
group's coordinator); a partition without a committed offset shows ``-``.
"""
import sys

from kmem.admin import reset_offsets
from kmem.admin.commands import BAD_ARGUMENTS, CommandError, print_table

NAME = "groups"
HELP = "list, describe (offsets, lag, members), delete groups, reset offsets (kafka-consumer-groups.sh)"
DESCRIPTION = """\
List, describe and delete consumer groups and reset their offsets on any Kafka broker, as Kafka's
kafka-consumer-groups.sh does (its options, its columns). One action a run:

  kmem groups --bootstrap-server HOST:PORT --list
  kmem groups --bootstrap-server HOST:PORT --describe --group G [--group G2 ...] [--members | --state]
  kmem groups --bootstrap-server HOST:PORT --describe --all-groups
  kmem groups --bootstrap-server HOST:PORT --delete --group G
  kmem groups --bootstrap-server HOST:PORT --reset-offsets --group G (--topic T[:P,P] ... | --all-topics)
              (--to-earliest | --to-latest | --to-current | --to-offset N | --shift-by N |
               --to-datetime YYYY-MM-DDTHH:mm:SS.sss | --by-duration PnDTnHnMnS) [--dry-run | --execute]

--describe shows, per partition the group is assigned or has committed: CURRENT-OFFSET (the committed
offset), LOG-END-OFFSET, LAG (their difference; '-' without a committed offset) and the consumer that
has it ('-' for none); a member without partitions has a row of its own.

--reset-offsets prints the new offsets as GROUP TOPIC PARTITION NEW-OFFSET; it commits them only with
--execute, and only for a group without active members."""

MISSING = "-"                   # Kafka's MISSING_COLUMN_VALUE
CONSUMER_PROTOCOL = "consumer"
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND = 68, 69        # Kafka's Errors
REBALANCING = ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling")
LATEST, READ_UNCOMMITTED = -1, 0                    # ListOffsets: the log end offset, every record


def add_arguments(parser):
    actions = parser.add_mutually_exclusive_group(required=True)
    actions.add_argument("--list", action="store_true", help="list the groups, one a line")
    actions.add_argument("--describe", action="store_true",
                         help="each partition's committed offset, log end offset, lag and consumer")
    actions.add_argument("--delete", action="store_true", help="delete --group (it must have no members)")
    actions.add_argument("--reset-offsets", action="store_true",
                         help="plan (--dry-run) or commit (--execute) new offsets for an inactive group")
    parser.add_argument("--group", action="append", default=[], help="a group; repeatable")
    parser.add_argument("--all-groups", action="store_true", help="--describe, --delete: every group")
    views = parser.add_mutually_exclusive_group()
    views.add_argument("--members", action="store_true", help="--describe: the members and how many partitions each "
                                                                "has")
    views.add_argument("--state", action="store_true", help="--describe: coordinator, assignment strategy, state and "
                                                              "member count; --list: each group's state")
    reset_offsets.add_arguments(parser)


def check_arguments(args):
    if args.list and (args.group or args.all_groups):
        raise CommandError("--list takes no --group or --all-groups", BAD_ARGUMENTS)
    if not args.list and not (args.group or args.all_groups):
        raise CommandError(f"--{_action(args)} needs --group or --all-groups", BAD_ARGUMENTS)
    if args.group and args.all_groups:
        raise CommandError("--group and --all-groups exclude each other", BAD_ARGUMENTS)
    if args.members and not args.describe:
        raise CommandError("--members applies to --describe", BAD_ARGUMENTS)
    if args.state and not (args.describe or args.list):
        raise CommandError("--state applies to --describe and --list", BAD_ARGUMENTS)
    reset_offsets.check_arguments(args)


def _action(args):
    return next(a for a in ("list", "describe", "delete", "reset_offsets") if getattr(args, a)).replace("_", "-")


def execute(client, args):
    if args.list:
        return list_groups(client, args)
    group_ids = args.group or [g.group_id for g in _listed_groups(client)]
    action = {"describe": describe_groups, "delete": delete_groups, "reset-offsets": reset_offsets.reset_offsets}
    return action[_action(args)](client, args, group_ids)


def _listed_groups(client):
    """Every group of the cluster: ListGroups from each broker, as Kafka's admin client asks."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    client.metadata([])
    groups = {}
    for node in sorted(client.brokers):
        response = client.request(messages.ListGroupsRequest(states_filter=[], types_filter=[]), node)
        check(response.error_code, f"broker {node} cannot list its groups")
        groups.update((g.group_id, g) for g in response.groups)
    return sorted(groups.values(), key=lambda g: g.group_id)


def list_groups(client, args):
    groups = _listed_groups(client)
    if args.state:
        print_table(("GROUP", "STATE"), [(g.group_id, g.group_state or "Unknown") for g in groups])
        return
    for group in groups:
        print(group.group_id)


def _described(client, group_id):
    """``(coordinator node id, DescribeGroups' group)``; raises ``CommandError`` for a group that does not exist."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    response = client.group_request(group_id, messages.DescribeGroupsRequest(
        groups=[group_id], include_authorized_operations=False), lambda r: r.groups[0].error_code)
    coordinator, group = client.coordinator(group_id), response.groups[0]
    check(group.error_code, f"cannot describe group {group_id!r}", group.error_message)
    if group.group_state == "Dead":
        raise CommandError(f"consumer group {group_id!r} does not exist: kmem groups --list shows the groups")
    return coordinator, group


def each_group(group_ids, handle):
    """``handle(group_id)`` for each group. A ``CommandError`` is raised when one group is asked; with several it
    is named on stderr and the others go on. The exit code of the last such error, or None."""
    failed = None
    for group_id in group_ids:
        try:
            handle(group_id)
        except CommandError as exc:
            if len(group_ids) == 1:
                raise
            print(f"kmem groups: error: {exc}", file=sys.stderr)
            failed = exc.exit_code
    return failed


def describe_groups(client, args, group_ids):
    return each_group(group_ids, lambda group_id: _describe_group(client, args, group_id))


def _describe_group(client, args, group_id):
    coordinator, group = _described(client, group_id)
    if args.state:
        host, port = client.brokers[coordinator]
        print()
        print_table(("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                    [(group_id, f"{host}:{port}  ({coordinator})", group.protocol_data or "", group.group_state,
                      len(group.members))], {0: 15, 1: 25, 2: 20, 3: 15})
        return
    if group.group_state == "Empty":
        print(f"\nConsumer group '{group_id}' has no active members.", file=sys.stderr)
    elif group.group_state in REBALANCING:
        print(f"\nWarning: Consumer group '{group_id}' is rebalancing.", file=sys.stderr)
    if args.members:
        rows = [(group_id, m.member_id, m.client_host, m.client_id, len(_assignment(group, m)))
                for m in group.members]
        if rows:
            print()
            print_table(("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"), rows,
                        {0: 15, 1: 15, 2: 15, 3: 15})
        return
    rows = _offset_rows(client, group_id, group)
    if rows:
        print()
        print_table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                     "HOST", "CLIENT-ID"), rows, {0: 15, 1: 15, 2: 10, 3: 15, 4: 15, 5: 15, 6: 15, 7: 15})

def _assignment(group, member):
    """The partitions assigned to a member of a consumer-protocol group: [(topic, partition)]."""
    from kmem.consumer.group import decode_assignment
    from kmem.errors import KmemError

    if group.protocol_type != CONSUMER_PROTOCOL:
        return []
    try:
        return [(tp.topic, tp.partition) for tp in decode_assignment(member.member_assignment)]
    except KmemError:       # an assignment another client wrote in a layout of its own: shown as none
        return []


def _committed_offsets(client, group_id):
    """``{(topic, partition): offset}`` the group has committed (OffsetFetch of every partition)."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    Request = messages.OffsetFetchRequest
    response = client.group_request(group_id, Request(
        group_id=group_id, topics=None, require_stable=False,                                 # v0-7
        groups=[Request.OffsetFetchRequestGroup(group_id=group_id, topics=None)]),
        lambda r: (r.groups[0] if r.groups else r).error_code)
    answer = response.groups[0] if response.groups else response                             # v8+: per group
    check(answer.error_code, f"cannot fetch the offsets of group {group_id!r}")
    committed = {}
    for topic in answer.topics:
        for p in topic.partitions:
            if not p.error_code and p.committed_offset >= 0:
                committed[(topic.name, p.partition_index)] = p.committed_offset
    return committed


def _offset_rows(client, group_id, group):
    committed = _committed_offsets(client, group_id)
    owners = {tp: member for member in group.members for tp in _assignment(group, member)}
    partitions = sorted(set(committed) | set(owners))
    log_ends = _log_end_offsets(client, partitions)
    rows = []
    for tp in partitions:
        offset, log_end, member = committed.get(tp), log_ends.get(tp), owners.get(tp)
        lag = log_end - offset if offset is not None and log_end is not None else None
        rows.append((group_id, tp[0], tp[1], *(MISSING if v is None else v for v in (offset, log_end, lag)),
                     *((member.member_id, member.client_host, member.client_id) if member else (MISSING,) * 3)))
    # a member without partitions has a row too, as in Kafka's tool
    owning = {id(member) for member in owners.values()}
    rows += [(group_id, *(MISSING,) * 5, member.member_id, member.client_host, member.client_id)
             for member in group.members if id(member) not in owning]
    return rows


def _log_end_offsets(client, partitions, timestamp=LATEST):
    """``{(topic, partition): log end offset}`` (ListOffsets latest, read_uncommitted, to each leader; with
    ``timestamp`` -2 the log start offset, -3 the record of the largest timestamp, a time in ms the first record
    at or after it); a partition without a leader, whose topic is gone or without such a record has none."""
    from kmem.protocol import messages

    if not partitions:
        return {}
    topics = sorted({topic for topic, _ in partitions})
    leaders = {(t.name, p.partition_index): p.leader_id for t in client.metadata(topics).topics if not t.error_code
               for p in t.partitions}
    by_leader = {}
    for tp in partitions:
        if leaders.get(tp, -1) >= 0:
            by_leader.setdefault(leaders[tp], []).append(tp)
    Request = messages.ListOffsetsRequest
    log_ends = {}
    for leader, owned in by_leader.items():
        request = Request(replica_id=-1, isolation_level=READ_UNCOMMITTED, topics=[
            Request.ListOffsetsTopic(name=topic, partitions=[
                Request.ListOffsetsPartition(partition_index=p, timestamp=timestamp, current_leader_epoch=-1)
                for t, p in owned if t == topic])
            for topic in sorted({t for t, _ in owned})])
        for topic in client.request(request, leader).topics:
            for p in topic.partitions:
                if not p.error_code and p.offset >= 0:
                    log_ends[(topic.name, p.partition_index)] = p.offset
    return log_ends


def delete_groups(client, args, group_ids):
    from kmem.admin.client import check
    from kmem.protocol import messages

    deleted = []
    for group_id in group_ids:
        response = client.group_request(group_id, messages.DeleteGroupsRequest(groups_names=[group_id]),
                                        lambda r: r.results[0].error_code)
        code = response.results[0].error_code
        if code == NON_EMPTY_GROUP:
            raise CommandError(f"consumer group {group_id!r} has active members: stop its consumers, then delete it")
        if code == GROUP_ID_NOT_FOUND:
            raise CommandError(f"consumer group {group_id!r} does not exist: kmem groups --list shows the groups")
        check(code, f"cannot delete consumer group {group_id!r}")
        deleted.append(group_id)
    print(f"Deletion of requested consumer groups ({', '.join(repr(g) for g in deleted)}) was successful.")

"""``kmem topics``: Kafka's ``kafka-topics.sh`` (its ``TopicCommand``) over any Kafka broker: --list,
--describe, --create, --delete and --alter (partitions, configs), with its options and output lines."""
import re

from kmem.admin.commands import BAD_ARGUMENTS, CommandError, whole_number
from kmem.errors import KmemError

NAME = "topics"
HELP = "list, describe, create, delete and add partitions to topics (kafka-topics.sh)"
DESCRIPTION = """\
List, describe, create, delete topics and add partitions, on any Kafka broker, as Kafka's kafka-topics.sh
does (its options, its output). One action a run:

  kmem topics --bootstrap-server HOST:PORT --list
  kmem topics --bootstrap-server HOST:PORT --describe [--topic T]
  kmem topics --bootstrap-server HOST:PORT --create --topic T [--partitions N] [--replication-factor R]
              [--config KEY=VALUE ...]
  kmem topics --bootstrap-server HOST:PORT --alter --topic T [--partitions N] [--config KEY=VALUE ...]
              [--delete-config KEY ...]
  kmem topics --bootstrap-server HOST:PORT --delete --topic T

--topic is a regular expression for --list and --describe (as Kafka's), a topic's name otherwise. --describe's
partition lines end, after Kafka's fields, with the partition's LeaderEpoch (Metadata) and the Size in bytes of its
leader's replica (DescribeLogDirs; - where the broker does not answer it)."""

TOPIC_ALREADY_EXISTS = 36   # Kafka's Errors.TOPIC_ALREADY_EXISTS
INT32_MAX, INT16_MAX = 2 ** 31 - 1, 2 ** 15 - 1     # CreateTopics' num_partitions, replication_factor
TOPIC_RESOURCE = 2          # Kafka's ConfigResource.Type.TOPIC
DEFAULT_CONFIG = 5          # Kafka's ConfigEntry.ConfigSource.DEFAULT_CONFIG


def add_arguments(parser):
    actions = parser.add_mutually_exclusive_group(required=True)
    actions.add_argument("--list", action="store_true", help="list the topics, one a line")
    actions.add_argument("--describe", action="store_true", help="the topics' partitions, leaders, replicas and "
                                                                   "the configs set on them")
    actions.add_argument("--create", action="store_true", help="create --topic")
    actions.add_argument("--delete", action="store_true", help="delete --topic")
    actions.add_argument("--alter", action="store_true", help="add partitions to --topic (--partitions), set "
                                                              "(--config) or remove (--delete-config) its configs")
    parser.add_argument("--topic", help="the topic (for --list and --describe: a regular expression)")
    parser.add_argument("--partitions", type=whole_number(1, INT32_MAX),
                        help="partitions of a new topic (default: the broker's num.partitions), or the count --alter "
                             "grows it to")
    parser.add_argument("--replication-factor", type=whole_number(1, INT16_MAX),
                        help="replicas of each partition of a new topic (default: the broker's "
                             "default.replication.factor)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config of a new topic, or one --alter sets, e.g. cleanup.policy=compact; "
                             "repeatable")
    parser.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                        help="--alter: a topic config to remove (back to its default); repeatable")
    parser.add_argument("--if-exists", action="store_true", help="--describe, --delete, --alter: a missing topic "
                                                                 "is no error")
    parser.add_argument("--if-not-exists", action="store_true", help="--create: an existing topic is no error")
    parser.add_argument("--exclude-internal", action="store_true",
                        help="--list, --describe: leave out internal topics (__consumer_offsets, ...)")


def check_arguments(args):
    if (args.create or args.delete or args.alter) and not args.topic:
        raise CommandError(f"--{_action(args)} needs --topic", BAD_ARGUMENTS)
    if args.alter and args.partitions is None and not args.config and not args.delete_config:
        raise CommandError("--alter needs --partitions (the new partition count), --config or --delete-config",
                           BAD_ARGUMENTS)
    for option, allowed in (("partitions", args.create or args.alter), ("replication_factor", args.create),
                            ("config", args.create or args.alter), ("delete_config", args.alter),
                            ("if_not_exists", args.create),
                            ("if_exists", args.delete or args.alter or args.describe),
                            ("exclude_internal", args.list or args.describe)):
        if getattr(args, option) and not allowed:
            raise CommandError(f"--{option.replace('_', '-')} does not apply to --{_action(args)}", BAD_ARGUMENTS)
    args.configs = {}
    for setting in args.config:
        name, sep, value = setting.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"--config takes KEY=VALUE, not {setting!r}", BAD_ARGUMENTS)
        args.configs[name.strip()] = value.strip()
    if (args.list or args.describe) and args.topic is not None:
        try:
            args.pattern = re.compile(args.topic)
        except re.error as exc:
            raise CommandError(f"--topic {args.topic!r} is not a regular expression: {exc}", BAD_ARGUMENTS) from None


def _action(args):
    return next(a for a in ("list", "describe", "create", "delete", "alter") if getattr(args, a))


def execute(client, args):
    return ACTIONS[_action(args)](client, args)


def _matching(client, args):
    """The Metadata topics --list and --describe show, by name."""
    topics = [t for t in client.metadata().topics if not t.error_code or t.partitions]
    if args.exclude_internal:
        topics = [t for t in topics if not t.is_internal]
    if args.topic is not None:
        topics = [t for t in topics if args.pattern.fullmatch(t.name)]
        if not topics and args.describe and not args.if_exists:       # --list: nothing to list, as Kafka's
            raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
    return sorted(topics, key=lambda t: t.name)


def list_topics(client, args):
    for topic in _matching(client, args):
        print(topic.name)


def describe_topics(client, args):
    from kmem.admin.client import topic_id_text

    topics = _matching(client, args)
    configs = _set_configs(client, [t.name for t in topics])
    sizes = _leader_sizes(client, topics)
    for topic in topics:
        partitions = sorted(topic.partitions, key=lambda p: p.partition_index)
        replication = len(partitions[0].replica_nodes) if partitions else 0
        print(f"Topic: {topic.name}\tTopicId: {topic_id_text(topic.topic_id)}\tPartitionCount: {len(partitions)}\t"
              f"ReplicationFactor: {replication}\tConfigs: {configs[topic.name]}")
        for p in partitions:
            line = (f"\tTopic: {topic.name}\tPartition: {p.partition_index}\t"
                    f"Leader: {p.leader_id if p.leader_id >= 0 else 'none'}\t"
                    f"Replicas: {_ids(p.replica_nodes)}\tIsr: {_ids(p.isr_nodes)}")
            if p.offline_replicas:
                line += f"\tOffline: {_ids(p.offline_replicas)}"
            epoch = p.leader_epoch if p.leader_epoch >= 0 else "-"
            print(f"{line}\tLeaderEpoch: {epoch}\tSize: {sizes.get((topic.name, p.partition_index), '-')}")


def _leader_sizes(client, topics):
    """``{(topic, partition): bytes}`` of each partition's replica on its leader (DescribeLogDirs, KIP-113, asked of
    each leader for the partitions it leads); {} from a broker that does not serve it."""
    from kmem.admin.client import AdminError, check
    from kmem.protocol import messages

    Request = messages.DescribeLogDirsRequest
    by_leader = {}
    for topic in topics:
        for p in topic.partitions:
            if p.leader_id >= 0:
                by_leader.setdefault(p.leader_id, {}).setdefault(topic.name, []).append(p.partition_index)
    sizes = {}
    for leader, led in sorted(by_leader.items()):
        try:
            response = client.request(Request(topics=[Request.DescribableLogDirTopic(topic=name, partitions=indexes)
                                                      for name, indexes in sorted(led.items())]), leader)
        except (AdminError, KmemError):     # an older broker, or one without the API (Tansu)
            return {}
        for log_dir in response.results:
            check(log_dir.error_code, f"broker {leader} cannot describe its log directory {log_dir.log_dir}")
            for topic in log_dir.topics:
                for p in topic.partitions:
                    if not p.is_future_key and p.partition_index in led.get(topic.name, ()):
                        sizes[(topic.name, p.partition_index)] = p.partition_size
    return sizes


def _ids(nodes):
    return ",".join(map(str, nodes))


def _set_configs(client, names):
    """``{topic: "k=v,k=v"}``: the configs not at their default, as Kafka's describe shows them."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    if not names:
        return {}
    Resource = messages.DescribeConfigsRequest.DescribeConfigsResource
    response = client.request(messages.DescribeConfigsRequest(
        resources=[Resource(resource_type=TOPIC_RESOURCE, resource_name=name, configuration_keys=None)
                   for name in names], include_synonyms=False, include_documentation=False))
    shown = {}
    for result in response.results:
        check(result.error_code, f"cannot describe the configs of topic {result.resource_name!r}",
              result.error_message)
        # DescribeConfigs v0 says is_default; later versions give the source (ConfigEntry.isDefault)
        shown[result.resource_name] = ",".join(
            f"{c.name}={'' if c.value is None else c.value}" for c in result.configs
            if not (c.is_default if c.config_source in (None, -1) else c.config_source == DEFAULT_CONFIG))
    return shown


def create_topic(client, args):
    from kmem.admin.client import check
    from kmem.protocol import messages

    Request = messages.CreateTopicsRequest
    topic = Request.CreatableTopic(
        name=args.topic, num_partitions=args.partitions or -1, replication_factor=args.replication_factor or -1,
        assignments=[], configs=[Request.CreatableTopicConfig(name=k, value=v) for k, v in args.configs.items()])
    response = client.controller_request(Request(topics=[topic], timeout_ms=client.request_timeout_ms, validate_only=False))
    result = response.topics[0]
    if result.error_code == TOPIC_ALREADY_EXISTS:
        if args.if_not_exists:
            return
        raise CommandError(f"topic {args.topic!r} already exists (--if-not-exists accepts that)")
    check(result.error_code, f"cannot create topic {args.topic!r}", result.error_message)
    print(f"Created topic {args.topic}.")


def delete_topic(client, args):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check
    from kmem.protocol import messages

    listed = client.metadata([args.topic]).topics
    if listed and listed[0].is_internal:         # as Kafka's TopicCommand, which refuses it before asking
        raise CommandError(f"topic {args.topic!r} is a Kafka internal topic and is not allowed to be deleted")
    Request = messages.DeleteTopicsRequest
    response = client.controller_request(Request(topics=[Request.DeleteTopicState(name=args.topic)],
                                                 topic_names=[args.topic], timeout_ms=client.request_timeout_ms))
    result = response.responses[0]
    if result.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        if args.if_exists:
            return
        raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
    check(result.error_code, f"cannot delete topic {args.topic!r}", result.error_message)


def alter_topic(client, args):
    """Partitions (CreatePartitions), then configs (IncrementalAlterConfigs). Configs the broker would refuse are
    found first (validate_only), so a refused --config leaves the partition count as it was."""
    from kmem.admin.configs import alter_configs

    altering_configs = bool(args.config or args.delete_config)
    if altering_configs:
        if not any(t.name == args.topic for t in client.metadata([args.topic]).topics if not t.error_code):
            if args.if_exists:
                return
            raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
        if args.partitions is not None:
            alter_configs(client, TOPIC_RESOURCE, args.topic, args.configs, args.delete_config, validate_only=True)
    if args.partitions is not None:
        _add_partitions(client, args)
    if altering_configs:
        alter_configs(client, TOPIC_RESOURCE, args.topic, args.configs, args.delete_config)


def _add_partitions(client, args):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check
    from kmem.protocol import messages

    Request = messages.CreatePartitionsRequest
    response = client.controller_request(Request(
        topics=[Request.CreatePartitionsTopic(name=args.topic, count=args.partitions, assignments=None)],
        timeout_ms=client.request_timeout_ms, validate_only=False))
    result = response.results[0]
    if result.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        if args.if_exists:
            return
        raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
    check(result.error_code, f"cannot add partitions to topic {args.topic!r}", result.error_message)


ACTIONS = {"list": list_topics, "describe": describe_topics, "create": create_topic, "delete": delete_topic,
           "alter": alter_topic}

"""``kmem configs``: Kafka's ``kafka-configs.sh`` (its ``ConfigCommand``) for topics, brokers and client metrics
subscriptions (KIP-714) over any Kafka broker: --describe (DescribeConfigs) and --alter with --add-config /
--delete-config (IncrementalAlterConfigs, KIP-339), with its options and output lines."""
import re

from kmem.admin.commands import BAD_ARGUMENTS, CommandError

NAME = "configs"
HELP = "describe and alter the configs of topics, brokers and client metrics (kafka-configs.sh)"
DESCRIPTION = """\
Describe and alter the configs of topics, brokers and client metrics subscriptions (KIP-714), on any Kafka
broker, as Kafka's kafka-configs.sh does:

  kmem configs --bootstrap-server HOST:PORT --entity-type topics|brokers|client-metrics
               [--entity-name NAME | --entity-default] --describe [--all]
  kmem configs --bootstrap-server HOST:PORT --entity-type topics|client-metrics --entity-name NAME --alter
               [--add-config K1=V1,K2=[A,B]] [--delete-config K1,K2]

A client metrics subscription takes metrics=[PREFIX,...] ("*": every metric), interval.ms=MS and
match=[SELECTOR=REGEX,...] (client_id, client_software_name, client_source_address...); deleting every config
deletes it.

--describe shows the configs set on the entity (dynamic ones), or with --all every config, as
  NAME=VALUE sensitive=BOOL synonyms={SOURCE:NAME=VALUE, ...}
Without --entity-name, --describe shows every topic or every broker. --entity-default (brokers) is the
cluster-wide default of dynamic broker configs."""

RESOURCE_TYPES = {"topics": 2, "brokers": 4, "client-metrics": 16}        # Kafka's ConfigResource.Type
SET, DELETE = 0, 1                                  # IncrementalAlterConfigs' AlterConfigOp.OpType
# Kafka's ConfigEntry.ConfigSource, by the number DescribeConfigs (v1+) gives it
SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
           4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
           7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
DYNAMIC = {"topics": {1}, "brokers": {2, 3}, "client-metrics": {7}}       # what --describe shows without --all
CONFIG_PAIR = re.compile(r"\s*([^=\s,]+)\s*=\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)")


def add_arguments(parser):
    actions = parser.add_mutually_exclusive_group(required=True)
    actions.add_argument("--describe", action="store_true", help="the configs of the entity (entities)")
    actions.add_argument("--alter", action="store_true", help="set (--add-config) and remove (--delete-config) configs")
    parser.add_argument("--entity-type", required=True, choices=sorted(RESOURCE_TYPES),
                        help="topics, brokers or client-metrics")
    parser.add_argument("--entity-name", help="the topic's name, the broker's id, or the subscription's name")
    parser.add_argument("--entity-default", action="store_true", help="brokers: the cluster-wide default")
    parser.add_argument("--add-config", metavar="K1=V1,K2=[A,B]",
                        help="--alter: configs to set; a value with commas goes in square brackets")
    parser.add_argument("--delete-config", metavar="K1,K2", help="--alter: configs to remove (back to the default)")
    parser.add_argument("--all", action="store_true", help="--describe: every config, not only those set")


def check_arguments(args):
    if args.entity_default and (args.entity_type != "brokers" or args.entity_name is not None):
        raise CommandError("--entity-default applies to --entity-type brokers, without --entity-name", BAD_ARGUMENTS)
    if args.entity_type == "brokers" and args.entity_name is not None and not args.entity_name.isdigit():
        raise CommandError(f"--entity-name of a broker is its id (a number), not {args.entity_name!r}",
                           BAD_ARGUMENTS)
    if args.describe and (args.add_config or args.delete_config):
        raise CommandError("--add-config and --delete-config apply to --alter", BAD_ARGUMENTS)
    if args.alter:
        if args.all:
            raise CommandError("--all applies to --describe", BAD_ARGUMENTS)
        if args.entity_name is None and not args.entity_default:
            raise CommandError("--alter needs --entity-name (or, for brokers, --entity-default)", BAD_ARGUMENTS)
        if not args.add_config and not args.delete_config:
            raise CommandError("--alter needs --add-config or --delete-config", BAD_ARGUMENTS)
    args.additions = _pairs(args.add_config or "")
    args.deletions = [name.strip() for name in (args.delete_config or "").split(",") if name.strip()]
    both = sorted(set(args.additions) & set(args.deletions))
    if both:
        raise CommandError(f"{', '.join(both)} cannot be both added and deleted", BAD_ARGUMENTS)


def _pairs(text):
    """``{name: value}`` of ``K1=V1,K2=[A,B]`` (brackets keep a value's commas, as Kafka's ConfigCommand reads
    them); raises ``CommandError`` naming what does not parse."""
    pairs, position = {}, 0
    while position < len(text.rstrip()):
        match = CONFIG_PAIR.match(text, position)
        if not match:
            raise CommandError(f"--add-config takes K1=V1,K2=V2 (a value with commas in [ ]), not {text!r}",
                               BAD_ARGUMENTS)
        value = match.group(2).strip()
        pairs[match.group(1)] = value[1:-1] if value.startswith("[") else value
        position = match.end()
    return pairs


def execute(client, args):
    from kmem.admin.client import check

    resource_type = RESOURCE_TYPES[args.entity_type]
    if args.alter:
        return alter(client, args, resource_type)
    if args.entity_default:
        names = [""]
    elif args.entity_name is not None:
        names = [args.entity_name]
    elif args.entity_type == "topics":
        names = sorted(t.name for t in client.metadata().topics if not t.error_code)
    elif args.entity_type == "client-metrics":
        names = _subscriptions(client)
    else:
        client.metadata([])
        names = [str(node) for node in sorted(client.brokers)]
    for name in names:
        result = _described(client, resource_type, name)
        check(result.error_code, f"cannot describe the configs of {_entity(args, name)}", result.error_message)
        configs = sorted(result.configs, key=lambda c: c.name)
        if not args.all:
            configs = [c for c in configs if c.config_source in DYNAMIC[args.entity_type]]
        print(f"{'All' if args.all else 'Dynamic'} configs for {_entity(args, name)} are:")
        for config in configs:
            synonyms = ", ".join(f"{SOURCES.get(s.source, s.source)}:{s.name}={_shown(s.value)}"
                                 for s in config.synonyms)
            print(f"  {config.name}={_shown(config.value)} sensitive={str(config.is_sensitive).lower()} "
                  f"synonyms={{{synonyms}}}")


def _subscriptions(client):
    """The client metrics subscriptions' names (ListClientMetricsResources)."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    response = client.request(messages.ListClientMetricsResourcesRequest())
    check(response.error_code, "cannot list the client metrics subscriptions")
    return sorted(resource.name for resource in response.client_metrics_resources)


def _entity(args, name):
    if args.entity_type == "topics":
        return f"topic {name}"
    if args.entity_type == "client-metrics":
        return f"client-metric {name}"
    return "brokers in the cluster" if name == "" else f"broker {name}"


def _shown(value):
    return "null" if value is None else value


def _described(client, resource_type, name):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION
    from kmem.protocol import messages

    Resource = messages.DescribeConfigsRequest.DescribeConfigsResource
    response = client.request(messages.DescribeConfigsRequest(
        resources=[Resource(resource_type=resource_type, resource_name=name, configuration_keys=None)],
        include_synonyms=True, include_documentation=False), _node(resource_type, name))
    result = response.results[0]
    if result.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        raise CommandError(f"topic {name!r} does not exist: kmem topics --list shows the topics")
    return result


def alter(client, args, resource_type):
    name = "" if args.entity_default else args.entity_name
    alter_configs(client, resource_type, name, args.additions, args.deletions)
    default = "default " if name == "" else ""
    print(f"Completed updating {default}config for {_entity(args, name)}.")


def alter_configs(client, resource_type, name, additions, deletions, validate_only=False):
    """Sets ``additions`` ({name: value}) and removes ``deletions`` of a topic or broker (IncrementalAlterConfigs;
    ``validate_only``: only asks whether the broker would); raises ``CommandError`` for an unknown topic,
    ``AdminError`` for what else the broker refuses."""
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check
    from kmem.protocol import messages

    Request = messages.IncrementalAlterConfigsRequest
    configs = [Request.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in additions.items()]
    configs += [Request.AlterableConfig(name=k, config_operation=DELETE, value=None) for k in deletions]
    response = client.request(Request(resources=[Request.AlterConfigsResource(
        resource_type=resource_type, resource_name=name, configs=configs)], validate_only=validate_only),
        _node(resource_type, name))
    result = response.responses[0]
    if result.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        raise CommandError(f"topic {name!r} does not exist: kmem topics --list shows the topics")
    entity = {2: "topic", 4: "broker", 16: "client-metric"}[resource_type]
    check(result.error_code, f"cannot alter the configs of {entity} {name or '(the default)'}", result.error_message)


def _node(resource_type, name):
    """The broker a broker's config goes to (its own); any broker for a topic or the cluster default."""
    return int(name) if resource_type == RESOURCE_TYPES["brokers"] and name != "" else None

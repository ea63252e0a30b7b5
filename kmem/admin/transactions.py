"""``kmem transactions``: Kafka's ``kafka-transactions.sh`` (KIP-664, its ``TransactionsCommand``) over any Kafka
broker: list the transactional producers (ListTransactions, from every broker), describe one (DescribeTransactions,
from its coordinator), and abort a hanging transaction on a partition (WriteTxnMarkers to the partition's leader,
the producer found by DescribeProducers from the offset its transaction starts at, or given)."""
import time

from kmem.admin.commands import BAD_ARGUMENTS, CommandError, print_table, whole_number

NAME = "transactions"
HELP = "list, describe and abort transactions (kafka-transactions.sh, KIP-664)"
DESCRIPTION = """\
List and describe transactions, and abort a hanging one, on any Kafka broker, as Kafka's kafka-transactions.sh
does (KIP-664):

  kmem transactions --bootstrap-server HOST:PORT list
  kmem transactions --bootstrap-server HOST:PORT describe --transactional-id ID
  kmem transactions --bootstrap-server HOST:PORT abort --topic T --partition P --start-offset OFFSET
  kmem transactions --bootstrap-server HOST:PORT abort --topic T --partition P --producer-id ID
                    --producer-epoch E --coordinator-epoch C

A hanging transaction is one whose producer is gone while its records hold back the last stable offset of a
partition, so read_committed consumers stop there: abort writes the abort marker its coordinator would have
written. --start-offset is the offset of its first record (kmem dump-log or DescribeProducers show it)."""

INT64_MAX, INT32_MAX, INT16_MAX = 2 ** 63 - 1, 2 ** 31 - 1, 2 ** 15 - 1
ABORT = False                       # WriteTxnMarkers' transaction_result: false aborts
TRANSACTIONAL_ID_NOT_FOUND = 105    # Kafka's Errors


def add_arguments(parser):
    parser.add_argument("action", choices=("list", "describe", "abort"), help="list, describe or abort")
    parser.add_argument("--transactional-id", help="describe: the transactional id")
    parser.add_argument("--topic", help="abort: the partition's topic")
    parser.add_argument("--partition", type=whole_number(0, INT32_MAX), help="abort: the partition")
    parser.add_argument("--start-offset", type=whole_number(0, INT64_MAX),
                        help="abort: the offset of the transaction's first record on the partition")
    parser.add_argument("--producer-id", type=whole_number(0, INT64_MAX), help="abort: the producer id")
    parser.add_argument("--producer-epoch", type=whole_number(0, INT16_MAX), help="abort: the producer epoch")
    parser.add_argument("--coordinator-epoch", type=whole_number(0, INT32_MAX),
                        help="abort: the coordinator epoch of the transaction's markers")


def check_arguments(args):
    producer = [args.producer_id, args.producer_epoch, args.coordinator_epoch]
    given = {"describe": args.transactional_id is not None,
             "abort": args.topic is not None or args.partition is not None or args.start_offset is not None or
             any(value is not None for value in producer)}
    for action, present in given.items():
        if present and args.action != action:
            raise CommandError(f"{_options(action)} {'applies' if action == 'describe' else 'apply'} to {action}",
                               BAD_ARGUMENTS)
    if args.action == "describe" and args.transactional_id is None:
        raise CommandError("describe needs --transactional-id", BAD_ARGUMENTS)
    if args.action == "abort":
        if args.topic is None or args.partition is None:
            raise CommandError("abort needs --topic and --partition", BAD_ARGUMENTS)
        if (args.start_offset is None) == all(value is None for value in producer) or \
                (args.start_offset is None and None in producer):
            raise CommandError("abort takes --start-offset, or --producer-id, --producer-epoch and "
                               "--coordinator-epoch", BAD_ARGUMENTS)


def _options(action):
    return "--transactional-id" if action == "describe" else \
        "--topic, --partition, --start-offset, --producer-id, --producer-epoch and --coordinator-epoch"


def execute(client, args):
    return {"list": list_transactions, "describe": describe_transaction, "abort": abort_transaction}[args.action](
        client, args)


def list_transactions(client, args):
    from kmem.admin.client import check
    from kmem.protocol import messages

    client.metadata([])
    rows = []
    for node in sorted(client.brokers):
        response = client.request(messages.ListTransactionsRequest(
            state_filters=[], producer_id_filters=[], duration_filter=-1, transactional_id_pattern=None), node)
        check(response.error_code, f"broker {node} cannot list its transactions")
        rows += [(t.transactional_id, node, t.producer_id, t.transaction_state) for t in response.transaction_states]
    print_table(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"), sorted(rows))


def describe_transaction(client, args):
    from kmem.admin.client import TRANSACTION_KEY, check
    from kmem.protocol import messages

    node = client.coordinator(args.transactional_id, key_type=TRANSACTION_KEY)
    response = client.request(messages.DescribeTransactionsRequest(transactional_ids=[args.transactional_id]), node)
    state = response.transaction_states[0]
    if state.error_code == TRANSACTIONAL_ID_NOT_FOUND:
        raise CommandError(f"transactional id {args.transactional_id!r} does not exist: kmem transactions list shows "
                           "the transactions")
    check(state.error_code, f"cannot describe transactional id {args.transactional_id!r}")
    started = state.transaction_start_time_ms
    duration = int(time.time() * 1000) - started if started >= 0 else None
    partitions = ",".join(f"{t.topic}-{p}" for t in sorted(state.topics, key=lambda t: t.topic)
                          for p in sorted(t.partitions))
    print_table(("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                 "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"),
                [(node, state.transactional_id, state.producer_id, state.producer_epoch, state.transaction_state,
                  state.transaction_timeout_ms, started if started >= 0 else "None",
                  duration if duration is not None else "None", partitions)])


def abort_transaction(client, args):
    from kmem.admin.client import UNKNOWN_TOPIC_OR_PARTITION, check
    from kmem.protocol import messages

    topic = client.metadata([args.topic]).topics[0]
    if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        raise CommandError(f"topic {args.topic!r} does not exist: kmem topics --list shows the topics")
    check(topic.error_code, f"cannot read the metadata of topic {args.topic!r}")
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    if leaders.get(args.partition, -1) < 0:
        raise CommandError(f"topic {args.topic!r} has no partition {args.partition} with a leader "
                           f"(kmem topics --describe --topic {args.topic})")
    leader = leaders[args.partition]
    if args.start_offset is not None:
        producer_id, producer_epoch, coordinator_epoch = _open_transaction(client, args, leader)
    else:
        producer_id, producer_epoch, coordinator_epoch = args.producer_id, args.producer_epoch, args.coordinator_epoch
    Request = messages.WriteTxnMarkersRequest
    response = client.request(Request(markers=[Request.WritableTxnMarker(
        producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=ABORT,
        coordinator_epoch=coordinator_epoch, transaction_version=0,
        topics=[Request.WritableTxnMarkerTopic(name=args.topic, partition_indexes=[args.partition])])]), leader)
    for marker in response.markers:
        for result in marker.topics:
            for p in result.partitions:
                check(p.error_code, f"cannot abort the transaction of producer {producer_id} on "
                                    f"{args.topic}-{args.partition}")


def _open_transaction(client, args, leader):
    """``(producer id, producer epoch, coordinator epoch)`` of the transaction open at --start-offset."""
    from kmem.admin.client import check
    from kmem.protocol import messages

    Request = messages.DescribeProducersRequest
    response = client.request(Request(topics=[Request.TopicRequest(name=args.topic,
                                                                   partition_indexes=[args.partition])]), leader)
    partition = response.topics[0].partitions[0]
    check(partition.error_code, f"cannot describe the producers of {args.topic}-{args.partition}",
          partition.error_message)
    for producer in partition.active_producers:
        if producer.current_txn_start_offset == args.start_offset:
            return producer.producer_id, producer.producer_epoch, max(0, producer.coordinator_epoch)
    raise CommandError(f"Could not find any open transactions starting at offset {args.start_offset} on partition "
                       f"{args.topic}-{args.partition}")

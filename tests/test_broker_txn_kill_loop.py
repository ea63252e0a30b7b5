"""``kmem broker`` SIGKILLed again and again under transactional load, restarted each time on its log directory
and port: nothing acknowledged is lost or doubled, nothing aborted shows.

Transactional producers (confluent-kafka, one thread each) run as an application would: transactions of a few
records over the partitions of "out", some aborted, some carrying the input offsets of a consumer group
(``send_offsets_to_transaction``); a retriable error is retried, an abortable one aborts, a fatal one (fenced)
makes a new producer with the same ``transactional.id``; an instance also dies now and then, mid-transaction or
committing, and a new one takes over (the old one lives on as a zombie, to be fenced). Each transaction ends
committed (commit_transaction returned), aborted (abort_transaction returned, or the producer was replaced before
commit was asked) or unknown (commit was asked and did not return). Meanwhile the broker is killed at random steps
of the producers, and some of its restarts are killed too while they recover.

Then: every committed transaction's records are read (read_committed) exactly once, no aborted transaction's,
an unknown one's all or none; the last stable offset reaches the high watermark (no transaction left hanging);
each group's committed offset is that of its producer's last transaction that carried offsets and is visible;
a read_uncommitted ``kmem.consumer`` gets no record from a marker's offset. The log directory is read back with
kmem's own ``LogManager`` after a last kill: every transactional batch is closed by a marker, the markers decide
the same records as the broker answered, and the ``.txnindex`` entries are the aborted transactions."""
import random
import threading
import time

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from broker_helpers import TIMEOUT, consume_to_end, start_broker_process, wait_for
from kmem.broker import BrokerConfig, LogManager
from kmem.broker.log.unified_log import batches_from_start
from kmem.consumer import Consumer as KmemConsumer
from kmem.records import ControlRecordType
from test_broker_txn_clients import committed_offsets, kill, marker_offsets

OUTPUT, INPUT, PARTITIONS = "out", "in", 3
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
BROKER_SETTINGS = ("--override", "transaction.abort.timed.out.transaction.cleanup.interval.ms=200",
                   # segments roll (markers and .txnindex across them) and the cleaner compacts the internal topics
                   "--override", "log.segment.bytes=20000", "--override", "transaction.state.log.segment.bytes=5000",
                   "--override", "offsets.topic.segment.bytes=5000", "--override", "log.cleaner.backoff.ms=100")

# the broker SIGKILLs itself at its n-th log record (before the record is printed)
KILLED_AT_LOG_RECORD = """
import logging, os, signal
class Killer(logging.Handler):
    records = 0
    def emit(self, record):
        Killer.records += 1
        if Killer.records == {}:
            os.kill(os.getpid(), signal.SIGKILL)
logging.getLogger("kmem.broker").addHandler(Killer())
"""


class RestartedBroker:
    """``kmem broker`` on one log directory and one port, killed (SIGKILL) and started again."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.process, self.bootstrap = start_broker_process(log_dir, *BROKER_SETTINGS)
        self.port = int(self.bootstrap.rsplit(":", 1)[1])
        self.starts = 1

    def kill_and_restart(self, killed_starting=None):
        """``killed_starting``: n, a start is first killed at its n-th log record (recovering the log, loading
        the groups or transactions, completing a commit found prepared)."""
        kill(self.process)
        if killed_starting is not None:
            with pytest.raises(AssertionError, match="did not start"):
                start_broker_process(self.log_dir, *BROKER_SETTINGS, port=self.port,
                                     before=KILLED_AT_LOG_RECORD.format(killed_starting))
        self.process, _ = start_broker_process(self.log_dir, *BROKER_SETTINGS, port=self.port)
        self.starts += 1

    def kill(self):
        kill(self.process)

    def log(self):
        return "".join(self.process.log_lines[-30:])


class TransactionalApp(threading.Thread):
    """A transactional producer run as an application runs one (see the module docstring); ``steps`` counts its
    calls, so the test can kill the broker at one of them."""

    def __init__(self, bootstrap, name, seed, deadline):
        super().__init__(name=name, daemon=True)
        self.bootstrap, self.transactional_id, self.group = bootstrap, name, f"{name}-group"
        self.random = random.Random(seed)
        self.deadline = deadline
        self.outcomes, self.records, self.offsets = {}, {}, {}     # by transaction number
        self.steps, self.doing = 0, None
        self.producers, self.zombies = 0, []
        self.stopping = threading.Event()
        self.failure = None
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": self.group})
        self.metadata = consumer.consumer_group_metadata()
        consumer.close()

    def count(self, outcome):
        return sum(o == outcome for o in list(self.outcomes.values()))

    def run(self):
        try:
            producer = self.new_producer()
            number = 0
            while not self.stopping.is_set():
                producer = self.transaction(producer, number)
                number += 1
            self.zombies.clear()
        except BaseException as e:          # the test fails with it
            self.failure = e

    def call(self, function, *args, **kwargs):
        """``function`` retried while it fails with a retriable error (a transaction call may be repeated)."""
        while True:
            self.steps += 1
            self.doing = function.__name__
            try:
                return function(*args, **kwargs)
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() > self.deadline:
                    raise

    def new_producer(self):
        """A producer of the same ``transactional.id``: its init fences the previous one and aborts what it left
        open."""
        while True:
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
                                 "transaction.timeout.ms": 10000, "linger.ms": 2,
                                 "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                                 # with the only broker down, a re-bootstrap decommissions it, and a group
                                 # coordinator cached as that broker makes send_offsets_to_transaction hang
                                 # past its timeout (librdkafka issues 5511, 5456): not what is tested here
                                 "metadata.recovery.strategy": "none"})
            self.producers += 1
            try:
                self.call(producer.init_transactions, TIMEOUT)
                return producer
            except KafkaException:
                if time.monotonic() > self.deadline:
                    raise

    def transaction(self, producer, number):
        """Run transaction ``number``; returns the producer for the next one."""
        commit = self.random.random() < 0.75
        # the application dies ("open": mid-transaction, "committing": with commit under way) and a new instance
        # takes over; the old producer lives on as a zombie that must be fenced
        dies = self.random.choices([None, "open", "committing"], [16, 2, 2])[0]
        values = [(i % PARTITIONS, f"{self.transactional_id}-{number}-{i}".encode())
                  for i in range(self.random.randint(2, 5))]
        self.records[number] = values
        self.outcomes[number] = ABORTED                  # until commit is asked
        try:
            self.call(producer.begin_transaction)
            for partition, value in values:
                self.call(producer.produce, OUTPUT, value, partition=partition)
            if self.random.random() < 0.4:
                self.offsets[number] = number + 1
                self.call(producer.send_offsets_to_transaction, [TopicPartition(INPUT, 0, number + 1)],
                          self.metadata, TIMEOUT)
            if dies == "open":
                producer.flush(TIMEOUT)
                return self.replace(producer)
            if commit:
                self.outcomes[number] = UNKNOWN
                if dies == "committing":
                    self.steps += 1
                    try:
                        producer.commit_transaction(0.002)
                        self.outcomes[number] = COMMITTED
                        return producer
                    except KafkaException:              # not done in time: the instance dies
                        return self.replace(producer)
                self.call(producer.commit_transaction, TIMEOUT)
                self.outcomes[number] = COMMITTED
            else:
                if self.random.random() < 0.5:
                    producer.flush(TIMEOUT)             # the records reach the log before the abort
                self.call(producer.abort_transaction, TIMEOUT)
            return producer
        except KafkaException as e:
            if e.args[0].txn_requires_abort():
                try:
                    self.call(producer.abort_transaction, TIMEOUT)
                    self.outcomes[number] = ABORTED
                    return producer
                except KafkaException:
                    pass
            if time.monotonic() > self.deadline:
                raise
            return self.new_producer()          # fenced or failed: the old one is dropped

    def replace(self, producer):
        self.zombies.append(producer)
        return self.new_producer()


def read_committed(bootstrap):
    """Every record of "out" up to its last stable offsets: {value: [(partition, offset)]}."""
    found = {}
    for partition, offset, _, value in consume_to_end(bootstrap, OUTPUT, PARTITIONS):
        found.setdefault(value, []).append((partition, offset))
    return found


def ends(admin, isolation):
    asked = {TopicPartition(OUTPUT, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    answers = admin.list_offsets(asked, isolation_level=isolation)
    return [answers[tp].result(TIMEOUT).offset for tp in asked]


def read_uncommitted_with_kmem(bootstrap, log_dir, high_watermarks):
    """What a read_uncommitted ``kmem.consumer`` reads of "out" (values): none of it from a marker's offset."""
    records = []
    with KmemConsumer(bootstrap, isolation_level="read_uncommitted", auto_offset_reset="earliest",
                      fetch_max_wait_ms=50) as consumer:
        consumer.assign([(OUTPUT, p) for p in range(PARTITIONS)])
        wait_for(lambda: records.extend(consumer.poll(50)) or
                 [consumer.position((OUTPUT, p)) for p in range(PARTITIONS)] == high_watermarks, "the end of out")
    markers = {(p, offset) for p in range(PARTITIONS) for offset in marker_offsets(log_dir, OUTPUT, p)}
    assert markers and not markers & {(r.partition, r.offset) for r in records}
    return [r.value for r in records]


def decided_by_markers(log_dir):
    """What kmem's own reader finds in the directory: the values each partition's markers commit, and for each
    partition the aborted transactions (producer id, first offset, marker offset) by its markers and by its
    ``.txnindex`` files; every partition's last stable offset is its end."""
    committed, by_markers, by_index = [], {}, {}
    with LogManager(log_dir, BrokerConfig.from_properties(node_id=0)) as manager:
        for partition in range(PARTITIONS):
            partition_log = manager.get_partition(OUTPUT, partition)
            assert partition_log.last_stable_offset == partition_log.log_end_offset
            open_values, first_offsets, aborted = {}, {}, []
            for batch in batches_from_start(partition_log):
                if batch.is_control_batch:
                    # a marker closes its producer's transaction (none when no record of it reached the partition)
                    values = open_values.pop(batch.producer_id, [])
                    first = first_offsets.pop(batch.producer_id, None)
                    if batch.control_type == ControlRecordType.COMMIT:
                        committed += values
                    elif first is not None:
                        aborted.append((batch.producer_id, first, batch.base_offset))
                elif batch.is_transactional:
                    first_offsets.setdefault(batch.producer_id, batch.base_offset)
                    open_values.setdefault(batch.producer_id, []).extend(r.value for r in batch)
            assert open_values == {}, f"transactions left open in out-{partition}"
            by_markers[partition] = sorted(aborted)
            by_index[partition] = sorted((t.producer_id, t.first_offset, t.last_offset)
                                         for index in partition_log.transaction_indexes() for t in index.entries())
    return sorted(committed), by_markers, by_index


def run_kill_loop(tmp_path, seed, kills, producers):
    """The test of the module docstring with ``producers`` producers and ``kills`` kills; returns counts of what
    happened."""
    log_dir = tmp_path / "logs"
    broker = RestartedBroker(log_dir)
    try:
        visible, counts = kill_under_load(broker, seed, kills, producers)
    finally:
        broker.kill()
    committed_values, by_markers, by_index = decided_by_markers(log_dir)
    assert committed_values == sorted(visible)
    assert by_index == by_markers
    return counts


def kill_under_load(broker, seed, kills, producers):
    """Kill and restart ``broker`` under the producers, check what it answers then; returns (the values
    visible to read_committed, counts)."""
    rng = random.Random(seed)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(OUTPUT, PARTITIONS, 1), NewTopic(INPUT, 1, 1)]).values():
        future.result(TIMEOUT)
    deadline = time.monotonic() + 60 + 20 * kills
    apps = [TransactionalApp(broker.bootstrap, f"app-{seed}-{i}", rng.random(), deadline) for i in range(producers)]

    def failed():
        return next((app.failure for app in apps if app.failure is not None), None)

    def waiting(condition, what, timeout=TIMEOUT):
        try:
            wait_for(condition, what, timeout)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}: {e}, the producers in {[app.doing for app in apps]}; "
                                 f"the broker's log:\n{broker.log()}") from None
    try:
        for app in apps:
            app.start()
        for _ in range(kills):
            # a random step of a producer: in a produce, an AddPartitions, a send_offsets or an EndTxn under way
            app = rng.choice(apps)
            target = app.steps + rng.randint(0, 40)       # 0: at once, with the restart's recovery under way
            waiting(lambda: app.steps >= target or failed(), f"step {target} of {app.name}")
            broker.kill_and_restart(rng.choice([None, None, 1, 2, 3, 4, 5]))
        # the producers go on after the last restart: each commits again
        committed = [app.count(COMMITTED) for app in apps]
        waiting(lambda: failed() or all(app.count(COMMITTED) > c + 2 for app, c in zip(apps, committed)),
                "commits after the last restart", timeout=60)
    finally:
        for app in apps:
            app.stopping.set()
        for app in apps:
            app.join(TIMEOUT * 2)
    assert [app.name for app in apps if app.is_alive()] == []
    assert failed() is None, f"seed {seed}: {failed()!r}"

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    hw = ends(admin, IsolationLevel.READ_UNCOMMITTED)
    wait_for(lambda: ends(admin, IsolationLevel.READ_COMMITTED) == hw, "the last stable offsets at the high watermarks")
    visible = read_committed(broker.bootstrap)
    found_unknown = {COMMITTED: 0, ABORTED: 0}
    written = set()
    for app in apps:
        for number, outcome in app.outcomes.items():
            values = [value for _, value in app.records[number]]
            written.update(values)
            seen = [len(visible.get(value, [])) for value in values]
            where = f"seed {seed}: transaction {number} of {app.name} ({outcome}), records seen {seen}"
            assert set(seen) <= {0, 1}, where
            if outcome == COMMITTED:
                assert set(seen) == {1}, where
            elif outcome == ABORTED:
                assert set(seen) == {0}, where
            else:
                assert len(set(seen)) == 1, where                   # all or none
                found_unknown[COMMITTED if seen[0] else ABORTED] += 1
                app.outcomes[number] = COMMITTED if seen[0] else ABORTED
    assert set(visible) <= written
    # offsets: those of the producer's last transaction carrying offsets that is visible
    for app in apps:
        carried = [n for n in sorted(app.offsets) if app.outcomes[n] == COMMITTED]
        expected = {(INPUT, 0): app.offsets[carried[-1]]} if carried else {}
        wait_for(lambda: committed_offsets(admin, app.group) == expected, f"seed {seed}: {app.group} at {expected}")
    uncommitted = read_uncommitted_with_kmem(broker.bootstrap, broker.log_dir, hw)
    assert set(uncommitted) <= written and set(visible) <= set(uncommitted)
    assert len(uncommitted) == len(set(uncommitted))        # idempotence: no batch stored twice
    return visible, {"restarts": broker.starts - 1, "producers": sum(app.producers for app in apps),
                     "committed": sum(app.count(COMMITTED) for app in apps), "unknown": found_unknown,
                     "aborted": sum(app.count(ABORTED) for app in apps)}


@pytest.mark.parametrize("seed", [1])
def test_a_broker_killed_under_transactions_loses_nothing_committed_and_shows_nothing_aborted(tmp_path, seed):
    counts = run_kill_loop(tmp_path, seed, kills=5, producers=2)
    assert counts["restarts"] == 5 and counts["committed"] > 0 and counts["aborted"] > 0, counts
    assert counts["producers"] > 2, counts        # instances died and were replaced: zombies were fenced


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_broker_killed_often_under_two_transactional_producers(tmp_path, seed):
    counts = run_kill_loop(tmp_path, seed, kills=20, producers=2)
    assert counts["restarts"] == 20 and counts["committed"] > 0 and counts["aborted"] > 0, counts
    assert counts["producers"] > 2, counts

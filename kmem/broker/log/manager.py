"""The log directory: Kafka's ``LogManager`` for one broker.

``LogManager(log_dir, config)`` owns the directory (``flock`` on ``.lock``, as Kafka: a second manager on
it raises ``IllegalStateError``): ``meta.properties``, the offset checkpoints at the root
(recovery point, log start, replication), the clean-shutdown marker (removed on open, written by
``close``), ``kmem-topics.json`` (each topic's configuration overrides: Kafka keeps them in its metadata
log), ``kmem-producer-id-block`` (``allocate_producer_id()`` never reissues an id) and the partitions.
``maintain(now)`` applies retention and writes the checkpoints; call it periodically (Kafka's
``log.retention.check.interval.ms`` is 5 minutes). The segments a roll leaves behind are fsynced on the
manager's flusher thread (``FlushScheduler``, Kafka's scheduler running ``flushUptoOffsetExclusive``), so
the recovery points checkpointed are those flushed. Segments roll only when an append arrives, as in
Kafka; an idle partition's active segment still expires, retention rolling it first. ``cleaner`` is the
``kmem.broker.log.cleaner.LogCleaner`` of the compacted topics (``cleaner.start()`` starts its thread;
``cleaner-offset-checkpoint`` holds each compacted partition's first dirty offset). On a directory a Kafka KRaft
node wrote, the manager first adopts the topics, configs, producer ids, SCRAM users and ACLs of its
``__cluster_metadata-0`` into these files (``kmem.admin.kraft_image``).
"""
import fcntl
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from types import MappingProxyType
from typing import NamedTuple

from kmem.broker.codes import ErrorCode, LogError, storage_error
from kmem.broker.log import checkpoints
from kmem.broker.log.cleaner import LogCleaner
from kmem.broker.log.config import BrokerConfig
from kmem.broker.log.unified_log import PartitionLog, wall_clock_ms
from kmem.durable import fsync_directory, replaced_atomically
from kmem.errors import ConfigError, IllegalStateError
from kmem.metrics import Tallies

log = logging.getLogger(__name__)

TOPICS_FILE = "kmem-topics.json"
LOCK_FILE = ".lock"             # flock()ed while a LogManager has the directory open, as Kafka's
MAX_TOPIC_NAME = 249
LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")        # matched over the whole name (fullmatch)
PARTITION_DIR = re.compile(r"(.+)-([0-9]+)")
METADATA_TOPIC = "__cluster_metadata"           # a KRaft node's metadata log (kmem handover kraft), no topic
METADATA_PARTITION = METADATA_TOPIC + "-0"
#: After an append found the disk full the partitions free their reserved blocks at most this often: on a disk that
#: stays full every refused retry would otherwise visit every partition, though none reserves anew there.
RELEASE_INTERVAL_SECONDS = 1.0


def _count(n, noun):
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class TopicInfo(NamedTuple):
    name: str
    topic_id: str
    partitions: int
    configs: dict            # the topic's overrides (topic-level names)


def validate_topic_name(name):
    """Kafka's ``Topic.validate``: 1-249 characters of ``[a-zA-Z0-9._-]``, not '.' or '..'."""
    if not isinstance(name, str) or not name or name in (".", "..") or len(name) > MAX_TOPIC_NAME \
            or not LEGAL_TOPIC.fullmatch(name):
        raise LogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                       f"topic name {name!r} is not 1 to {MAX_TOPIC_NAME} characters of [a-zA-Z0-9._-] "
                       "(nor '.' or '..')")


class FlushScheduler:
    """One thread running the tasks given to ``schedule`` in turn: the rolls' flushes (Kafka's roll schedules
    ``flushUptoOffsetExclusive`` on its scheduler), so that no request waits for an fsync. The thread starts
    with a task and ends after ``IDLE_SECONDS`` without one (a manager whose logs seldom roll, or one left
    open, keeps no thread). ``stop`` runs the tasks already given, then ends the thread; a task given after it
    runs at once, on the caller's thread."""

    IDLE_SECONDS = 5

    def __init__(self):
        self._tasks = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None
        self._stopped = False

    def schedule(self, task):
        with self._lock:
            if not self._stopped:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="kmem-log-flusher", daemon=True)
                    self._thread.start()
                self._tasks.put(task)
                return
        task()

    def _run(self):
        while True:
            try:
                task = self._tasks.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:        # schedule() puts its task under the lock: none comes in between
                    if self._tasks.empty():
                        self._thread = None
                        return
                continue
            if task is None:
                return
            try:
                task()
            except Exception:           # the thread carries on for the other logs
                log.exception("log flush failed")

    def stop(self):
        with self._lock:
            self._stopped, thread = True, self._thread
            if thread is not None:
                self._tasks.put(None)
        if thread is not None:
            thread.join()


class LogManager:
    """The log directory of one broker (see the module docstring). Thread-safe."""

    def __init__(self, log_dir, config=None, *, clock_ms=None):
        self.log_dir = os.fspath(log_dir)
        self.config = config or BrokerConfig()
        self._clock = clock_ms or wall_clock_ms
        self._lock = threading.RLock()
        self._listeners = []
        self._released_at = -RELEASE_INTERVAL_SECONDS
        self._release_lock = threading.Lock()       # not the manager's: a retention pass holds that for its fsyncs
        if os.path.lexists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise ConfigError(f"log directory {self.log_dir} is not a directory")
        os.makedirs(self.log_dir, exist_ok=True)
        self._lock_file = open(self._path(LOCK_FILE), "ab")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise IllegalStateError(f"log directory {self.log_dir} is in use by another kmem broker (or "
                                    f"LogManager), which holds its {LOCK_FILE}") from None
        self.flusher = FlushScheduler()
        self.flush_stats = Tallies(2)   # every log's flushes (Kafka's LogFlushStats), see PartitionLog
        try:
            self._open()
        except BaseException:
            self.flusher.stop()
            self._lock_file.close()
            raise

    def _open(self):
        if not os.path.exists(self._path(checkpoints.META_PROPERTIES)):
            held = [name for name in os.listdir(self.log_dir)
                    if PARTITION_DIR.fullmatch(name) and os.path.isdir(self._path(name))]
            if held:
                # Formatting it afresh would give its data a new cluster id, silently (Kafka refuses any
                # directory without meta.properties; kmem formats only an empty one).
                raise IllegalStateError(
                    f"log directory {self.log_dir} holds {len(held)} partitions (e.g. {held[0]}) but no "
                    f"{checkpoints.META_PROPERTIES}: restore it, or move the partitions away to start a new cluster")
        self.meta_properties = checkpoints.load_meta_properties(self.log_dir, self.config.node_id)
        self.cluster_id = self.meta_properties["cluster.id"]
        from kmem.admin import kraft_image        # it reads the schemas of kmem.admin.handover, which imports this

        if kraft_image.needs_adoption(self.log_dir):
            kraft_image.adopt(self.log_dir, self.config)
        marker = os.path.join(self.log_dir, checkpoints.CLEAN_SHUTDOWN)
        self.had_clean_shutdown = os.path.exists(marker)
        if self.had_clean_shutdown:
            os.unlink(marker)
            fsync_directory(self.log_dir)
        clean = self.had_clean_shutdown
        try:
            recovery_points = checkpoints.read_offset_checkpoint(self._path(checkpoints.RECOVERY_POINT_CHECKPOINT))
        except checkpoints.CorruptCheckpointError as e:
            log.warning("%s; recovering every partition from its first segment", e)
            recovery_points, clean = {}, False
        try:
            start_offsets = checkpoints.read_offset_checkpoint(self._path(checkpoints.LOG_START_OFFSET_CHECKPOINT))
        except checkpoints.CorruptCheckpointError as e:
            log.warning("%s; each partition's log starts at its first segment again (records deleted by "
                        "DeleteRecords above it are readable again)", e)
            start_offsets = {}
        self._topic_configs = read_topics_file(self.log_dir)
        self.producer_ids = checkpoints.ProducerIdAllocator(self.log_dir)
        self._logs = {}
        self._partition_counts = {}     # topic -> partition count, cleared when partitions come or go
        self._topics = None             # what topics() and topic_name() answer, gathered on demand
        self._closed = False
        try:
            for name in sorted(os.listdir(self.log_dir)):
                if name.endswith("-delete") and os.path.isdir(self._path(name)):
                    shutil.rmtree(self._path(name))        # a topic deletion cut short
                    continue
                match = PARTITION_DIR.fullmatch(name)
                if not match or not os.path.isdir(self._path(name)) or name == METADATA_PARTITION:
                    continue
                topic, partition = match.group(1), int(match.group(2))
                key = (topic, partition)
                self._logs[key] = self._new_log(
                    self._path(name), topic, partition, self.config.topic_config(self._topic_configs.get(topic)),
                    self.config, recovery_point=recovery_points.get(key, 0), log_start_offset=start_offsets.get(key, 0),
                    clean=clean, clock_ms=self._clock)
        except BaseException:
            for opened in self._logs.values():
                opened.close()
            raise
        if self._logs and not clean:
            log.info("recovered %s in %s after an unclean shutdown", _count(len(self._logs), "partition"),
                     self.log_dir)
        self.cleaner = LogCleaner(self.log_dir, self.config, self._logs, self._clock)
        self.checkpoint()

    def _path(self, name):
        return os.path.join(self.log_dir, name)

    def _write_topics_file(self):
        with replaced_atomically(self._path(TOPICS_FILE), fsync=True) as file:
            file.write(json.dumps(self._topic_configs, sort_keys=True, indent=1).encode())

    # --- topics ---------------------------------------------------------------------------------------

    def create_topic(self, name, partitions=None, configs=None):
        """Create ``name`` with ``partitions`` (default ``num.partitions``) and topic-level ``configs``;
        returns its topic id. Raises ``LogError``: INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS,
        INVALID_PARTITIONS, INVALID_CONFIG."""
        validate_topic_name(name)
        if name == METADATA_TOPIC:          # as Kafka's ControllerApis.createTopics
            raise LogError(ErrorCode.INVALID_REQUEST, f"Creation of internal topic {METADATA_TOPIC} is prohibited.")
        partitions = self.config.num_partitions if partitions is None else partitions
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise LogError(ErrorCode.INVALID_PARTITIONS, f"number of partitions must be at least 1: {partitions!r}")
        configs, topic_config = self._checked_topic_configs(configs or {})
        with self._lock:
            self._check_open()
            if name in self.topics():
                raise LogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            topic_id = checkpoints.random_uuid()

            def write_configs():
                if configs:
                    self._topic_configs[name] = configs
                    try:
                        self._write_topics_file()
                    except BaseException:
                        del self._topic_configs[name]
                        raise
            self._create_partitions(name, range(partitions), topic_config, topic_id, write_configs)
            log.info("created topic %s (%s%s)", name, _count(partitions, "partition"),
                     ", " + ", ".join(f"{k}={v}" for k, v in sorted(configs.items())) if configs else "")
            return topic_id

    def _create_partitions(self, name, numbers, topic_config, topic_id, then=None):
        """Create the partitions ``numbers`` of ``name``, then call ``then``; all or nothing: when a file
        cannot be made (a full disk, no descriptor left) the partitions made are removed again and
        KAFKA_STORAGE_ERROR (``LogError``) is raised."""
        created = []
        try:
            for p in numbers:
                path = self._path(f"{name}-{p}")
                try:
                    created.append(self._new_log(path, name, p, topic_config, self.config, topic_id=topic_id,
                                                 clock_ms=self._clock))
                except BaseException:
                    shutil.rmtree(path, ignore_errors=True)
                    raise
            if then is not None:
                then()
            fsync_directory(self.log_dir)
        except OSError as e:
            for partition_log in created:          # closed first: their descriptors serve the removal
                partition_log.close()
            for partition_log in created:
                shutil.rmtree(partition_log.directory, ignore_errors=True)
            log.error("creating partitions of %s failed, none kept: %s", name, e)
            raise storage_error(e, f"creating partitions of topic {name!r}") from None
        for p, partition_log in zip(numbers, created):
            self._logs[(name, p)] = partition_log
        self._topics_changed()

    def delete_topic(self, name):
        """Delete every partition of ``name``; UNKNOWN_TOPIC_OR_PARTITION if there is no such topic."""
        with self._lock:
            self._check_open()
            doomed = [key for key in self._logs if key[0] == name]
            if not doomed:
                raise LogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            deleted = [self._logs.pop(key) for key in doomed]
            self._topics_changed()
            for partition_log in deleted:
                partition_log.delete()
            self.cleaner.forget(doomed)
            log.info("deleted topic %s (%s)", name, _count(len(deleted), "partition"))
            if self._topic_configs.pop(name, None) is not None:
                self._write_topics_file()
            self.checkpoint()
        for partition_log in deleted:
            self._changed(partition_log)

    def add_listener(self, listener):
        """``listener(partition_log)`` after every append to any partition and after a partition's deletion
        (outside the locks): how parked fetches learn that they may complete."""
        with self._lock:
            self._listeners.append(listener)

    def _new_log(self, *args, **kwargs):
        partition_log = PartitionLog(*args, schedule=self.flusher.schedule, flush_stats=self.flush_stats,
                                     on_full_disk=self.release_reserved_blocks, **kwargs)
        partition_log.add_listener(self._changed)
        return partition_log

    def release_reserved_blocks(self):
        """An append found the disk full: every partition frees the blocks its active segment reserved ahead of
        its appends (``kmem.broker.log.segment``), so that the client's retry finds that room."""
        with self._release_lock:
            now = time.monotonic()
            if now - self._released_at < RELEASE_INTERVAL_SECONDS:
                return
            self._released_at = now
        for partition_log in self._logs.copy().values():       # one step under the GIL
            partition_log.release_reserved_blocks()

    def _changed(self, partition_log):
        for listener in self._listeners:
            listener(partition_log)

    def add_partitions(self, name, count):
        """CreatePartitions: grow ``name`` to ``count`` partitions (they get the topic's id and settings).
        Raises ``LogError``: UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS when ``count`` is not larger."""
        with self._lock:
            self._check_open()
            info = self.topics().get(name)
            if info is None:
                raise LogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            self.check_partition_count(info, count)
            topic_config = self.config.topic_config(self._topic_configs.get(name))
            self._create_partitions(name, range(info.partitions, count), topic_config, info.topic_id)
            log.info("topic %s grown from %d to %d partitions", name, info.partitions, count)
            self.checkpoint()

    @staticmethod
    def check_partition_count(info, count):
        """INVALID_PARTITIONS (``LogError``) unless ``count`` is more than the topic has now."""
        if isinstance(count, bool) or not isinstance(count, int) or count <= info.partitions:
            raise LogError(ErrorCode.INVALID_PARTITIONS, f"topic {info.name!r} has {info.partitions} partitions: "
                           f"a new count must be larger, not {count!r}")

    def set_topic_configs(self, name, configs, *, validate_only=False):
        """AlterConfigs: ``configs`` (topic-level names) become the topic's whole set of overrides, applied
        to its partitions at once. Raises ``LogError``: UNKNOWN_TOPIC_OR_PARTITION, INVALID_CONFIG."""
        configs, topic_config = self._checked_topic_configs(configs)
        with self._lock:
            self._check_open()
            partition_logs = [log for (topic, _), log in self._logs.items() if topic == name]
            if not partition_logs:
                raise LogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            if validate_only:
                return
            if configs:
                self._topic_configs[name] = configs
            else:
                self._topic_configs.pop(name, None)
            self._topics_changed()
            self._write_topics_file()
            for partition_log in partition_logs:
                partition_log.config = topic_config

    def _checked_topic_configs(self, configs):
        """(the overrides as stored: None values dropped, booleans as Kafka spells them; the TopicConfig
        they make). INVALID_CONFIG (``LogError``) for a name or value kmem refuses."""
        configs = {k: str(v).lower() if isinstance(v, bool) else v for k, v in configs.items() if v is not None}
        try:
            return configs, self.config.topic_config(configs)
        except ConfigError as e:
            raise LogError(ErrorCode.INVALID_CONFIG, str(e)) from None

    def topics(self):
        """``{name: TopicInfo}`` of every topic (each ``configs`` read-only). Every Metadata request asks:
        the topics are gathered from the partitions once, and again only after topics or their configs change."""
        return dict(self._gathered()[0])

    def _gathered(self):
        """``({name: TopicInfo}, {topic id: name})``, kept until topics or their configs change."""
        gathered = self._topics
        if gathered is None:
            with self._lock:
                if self._topics is None:
                    topics = {}
                    for (topic, partition), partition_log in sorted(self._logs.items()):
                        topics[topic] = TopicInfo(topic, partition_log.topic_id, partition + 1,
                                                  MappingProxyType(dict(self._topic_configs.get(topic, {}))))
                    self._topics = topics, {p.topic_id: topic for (topic, _), p in self._logs.items()}
                gathered = self._topics
        return gathered

    def _topics_changed(self):
        """Under the lock, after partitions came or went or a topic's configs changed."""
        self._topics = None
        self._partition_counts.clear()

    def partition_count(self, topic):
        """The topic's partition count, 0 when it does not exist. The coordinators ask on every request:
        a topic's count is kept until partitions come or go (not an absent topic's: any name may be asked)."""
        count = self._partition_counts.get(topic)
        if count is None:
            with self._lock:
                count = 0
                while (topic, count) in self._logs:
                    count += 1
                if count:
                    self._partition_counts[topic] = count
        return count

    def topic_name(self, topic_id):
        """The name of the topic with ``topic_id`` (Fetch v13+ and Metadata v10+ name topics by id), or None."""
        return self._gathered()[1].get(topic_id)

    def get_partition(self, topic, partition):
        """The ``PartitionLog``, or None when the topic or partition does not exist."""
        return self._logs.get((topic, partition))

    def partitions(self):
        with self._lock:
            return dict(self._logs)

    def allocate_producer_id(self):
        """A producer id never handed out before by this log directory (InitProducerId)."""
        return self.producer_ids.allocate()

    # --- upkeep ---------------------------------------------------------------------------------------

    def maintain(self, now_ms=None):
        """Retention for every partition, then the checkpoints; returns the number of segments deleted."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            deleted = 0
            for partition_log in self._logs.values():
                try:
                    deleted += partition_log.delete_old_segments(now)
                except OSError as e:            # a file it could not delete: the other partitions' go on
                    log.error("%s: %s", partition_log.directory,
                              storage_error(e, f"retention of {partition_log.topic}-{partition_log.partition}"))
            self.checkpoint()
            return deleted

    def remove_expired_producers(self, now_ms=None):
        """Forget expired idempotent producers in every partition; call it every
        ``producer.id.expiration.check.interval.ms`` (Kafka's default: 10 minutes)."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            for partition_log in self._logs.values():
                partition_log.remove_expired_producers(now)

    def checkpoint(self):
        """Write the recovery-point, log-start-offset and replication-offset checkpoints. The log start
        offsets are those above their log's first segment's base offset only, as Kafka's
        ``checkpointLogStartOffsetsInDir`` writes them (a partition not listed starts at its first segment)."""
        with self._lock:
            logs = self._logs.items()
            checkpoints.write_offset_checkpoint(self._path(checkpoints.RECOVERY_POINT_CHECKPOINT),
                                                {k: v.recovery_point for k, v in logs})
            checkpoints.write_offset_checkpoint(self._path(checkpoints.LOG_START_OFFSET_CHECKPOINT),
                                                {k: v.log_start_offset for k, v in logs
                                                 if v.log_start_offset > v.segments[0].base_offset})
            checkpoints.write_offset_checkpoint(self._path(checkpoints.REPLICATION_OFFSET_CHECKPOINT),
                                                {k: v.high_watermark for k, v in logs})

    def _check_open(self):
        if self._closed:
            raise IllegalStateError(f"log manager of {self.log_dir} is closed")

    def close(self, broker_epoch=-1):
        """Flush and close every partition, write the checkpoints, then the clean-shutdown marker
        (``{"version":0,"brokerEpoch":<broker_epoch>}``, as Kafka's ``CleanShutdownFileHandler``)."""
        self.cleaner.stop()             # outside the lock: a pass in progress finishes first
        self.flusher.stop()             # the flushes of past rolls end first; each log's close flushes the rest
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed = False
            for partition_log in self._logs.values():
                try:
                    partition_log.close()
                except OSError as e:
                    log.error("closing %s failed: %s", partition_log.directory, e)
                    failed = True
            try:
                self.checkpoint()
                if not failed:          # else the next start recovers what could not be flushed
                    with replaced_atomically(self._path(checkpoints.CLEAN_SHUTDOWN), fsync=True) as marker:
                        marker.write(json.dumps({"version": 0, "brokerEpoch": broker_epoch},
                                                separators=(",", ":")).encode())
            except OSError as e:
                log.error("%s: no clean shutdown: %s", self.log_dir, e)
            finally:
                self._lock_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_topics_file(log_dir):
    """``{topic: {config: value}}`` of ``log_dir``'s topics file ({} without one); ``CorruptCheckpointError`` for
    a file that is not that."""
    path = os.path.join(log_dir, TOPICS_FILE)
    try:
        with open(path, "rb") as file:
            data = json.load(file)
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise checkpoints.CorruptCheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise checkpoints.CorruptCheckpointError(f"{path}: expected {{topic: {{config: value}}}}")
    return data

"""Cluster metadata: brokers, partition leaders, topic ids (Metadata v10+, for the consumer protocol of KIP-848,
whose assignments name topics by id), and connections to brokers by node id."""
import time

from kmem.consumer.errors import KafkaConnectionError
from kmem.consumer.fetcher import TopicPartition
from kmem.protocol import messages


class Metadata:
    """What the consumer knows of the cluster, refreshed on demand and every ``metadata.max.age.ms``."""

    def __init__(self, client, config):
        self._client = client
        self._bootstrap = config["bootstrap.servers"]
        self._allow_auto_create = config["allow.auto.create.topics"]
        self._max_age = config["metadata.max.age.ms"] / 1000.0
        self._retry_backoff = config["retry.backoff.ms"] / 1000.0
        self.brokers = {}           # node id -> (host, port)
        self.partitions = {}        # topic -> sorted partition ids
        self._leaders = {}          # TopicPartition -> node id
        self.topics = set()         # the topics we need to know
        self.every_topic = False    # ask for every topic (a subscription by regular expression)
        self.topic_names = {}       # topic id (uuid.UUID) -> name, from Metadata v10+
        self._need_update = True
        self._in_flight = False
        self._updated_at = 0.0
        self._failed_at = 0.0
        self.version = 0            # bumped by every update

    def leader(self, tp):
        return self._leaders.get(tp)

    def set_topics(self, topics):
        topics = set(topics)
        if not topics <= self.topics or not topics <= set(self.partitions):
            self._need_update = True
        self.topics = topics

    def request_update(self):
        self._need_update = True

    @property
    def has_brokers(self):
        return bool(self.brokers)

    def ensure_connected(self, node):
        """Start connecting to broker ``node`` if needed; True when requests may be queued to it."""
        if self._client.is_connected(node):
            return True
        address = self.brokers.get(node)
        if address is None or not self._client.can_connect(node, time.monotonic()):
            return False
        try:
            self._client.connect(node, address)
        except KafkaConnectionError:
            self.request_update()       # the client logged it
            return False
        return True

    def any_node(self):
        """A connection to send a cluster-wide request on (a broker, else a bootstrap server)."""
        for node in self.brokers:
            if self._client.is_connected(node):
                return node
        for node in self.brokers:
            if self.ensure_connected(node):
                return node
        now = time.monotonic()
        for i, address in enumerate(self._bootstrap):
            channel = f"bootstrap-{i}"
            if self._client.is_connected(channel):
                return channel
            if self._client.can_connect(channel, now):
                try:
                    self._client.connect(channel, address)
                    return channel
                except KafkaConnectionError:
                    pass                # the client logged it and backs off
        return None

    def poll(self, now):
        """Send a metadata request when one is due and none is out."""
        if self._in_flight or now - self._failed_at < self._retry_backoff:
            return
        if not (self._need_update or now - self._updated_at >= self._max_age or not self.brokers):
            return
        node = self.any_node()
        if node is None:
            self._failed_at = now
            return
        topics = None if self.every_topic else \
            [messages.MetadataRequest.MetadataRequestTopic(name=t) for t in sorted(self.topics)]
        request = messages.MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=self._allow_auto_create)
        self._in_flight = True
        self._need_update = False
        self._client.send(node, request, self._on_metadata)

    def _on_metadata(self, receive, body, error):
        self._in_flight = False
        if error is not None:
            self._need_update = True
            self._failed_at = time.monotonic()
            return
        self.brokers = {b.node_id: (b.host, b.port) for b in body.brokers}
        leaders = {}
        partitions = {}
        incomplete = False
        for topic in body.topics:
            if topic.error_code:
                incomplete = True       # e.g. LEADER_NOT_AVAILABLE while a topic is being created
                continue
            partitions[topic.name] = sorted(p.partition_index for p in topic.partitions)
            for p in topic.partitions:
                if p.error_code == 0 and p.leader_id >= 0:
                    leaders[TopicPartition(topic.name, p.partition_index)] = p.leader_id
                else:
                    incomplete = True
        self._leaders = leaders
        self.partitions = partitions
        self.topic_names = {topic.topic_id: topic.name for topic in body.topics
                            if topic.topic_id is not None and topic.topic_id.int}
        self._updated_at = time.monotonic()
        if incomplete:
            self._need_update = True
            self._failed_at = self._updated_at      # retry after the backoff
        self.version += 1
        for i in range(len(self._bootstrap)):       # brokers are known now: bootstrap connections go
            self._client.close(f"bootstrap-{i}")

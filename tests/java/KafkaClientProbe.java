import java.io.IOException;
import java.io.Reader;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.ListConsumerGroupsOptions;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.LogTruncationException;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.ConsumerGroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;

/**
 * Apache's Java clients (kafka-clients) against a kmem broker, driven by tests/test_broker_java_client.py:
 * one command a line on stdin, one JSON object a line on stdout, so one JVM serves a whole test module.
 *
 *   describe-ids BOOTSTRAP ID...                      AdminClient.describeTopics(TopicCollection.ofTopicIds(...))
 *   seek BOOTSTRAP TOPIC PARTITION OFFSET EPOCH COUNT  assign, seek with a leader epoch (KIP-320), read COUNT
 *   produce BOOTSTRAP TOPIC COMPRESSION COUNT          an idempotent producer (acks=all), COUNT records
 *   group-read BOOTSTRAP TOPIC GROUP COUNT             subscribe in a group, read COUNT records, commit
 *   member-start BOOTSTRAP TOPIC GROUP ASSIGNOR        a member polling on its own thread until member-stop: its id
 *                                                      (ASSIGNOR consumer:NAME: group.protocol=consumer, KIP-848,
 *                                                      with group.remote.assignor NAME)
 *   member-state ID / member-stop ID                   the partitions it owns and its rebalance callbacks so far
 *   txn-init BOOTSTRAP TXID TIMEOUT_MS                 a transactional producer after initTransactions: its id
 *   txn-begin ID / txn-commit ID / txn-abort ID / txn-close ID   its transaction calls, and close
 *   txn-send ID TOPIC PARTITION VALUE...               send and await each record: their offsets
 *   transform BOOTSTRAP TXID IN OUT GROUP COUNT OUTCOME  consume-transform-produce, KIP-447 (commit or abort)
 *   read BOOTSTRAP TOPIC PARTITIONS ISOLATION          every record up to the end offsets of that isolation level
 *   transactions BOOTSTRAP TXID...                     Admin.listTransactions and describeTransactions
 *   producers BOOTSTRAP TOPIC PARTITION                Admin.describeProducers
 *   abort-txn BOOTSTRAP TOPIC PARTITION PID EPOCH COORDINATOR_EPOCH   Admin.abortTransaction
 *   group-lag BOOTSTRAP GROUP                          a group's committed offsets, log end offsets and lag, by Admin
 *   stream BOOTSTRAP TOPIC GROUP MILLIS                a producer sending to partition 0 while a consumer reads
 *                                                      in a group, for MILLIS; then every record read back
 *   list-topics BOOTSTRAP                              Admin.listTopics: the topic names
 *   log-dirs BOOTSTRAP                                 Admin.describeLogDirs of every broker: each log directory's
 *                                                      error, total and usable bytes, and each replica's size
 *   describe-topics BOOTSTRAP LIMIT TOPIC...           Admin.describeTopics by name (DescribeTopicPartitions in
 *                                                      pages of LIMIT partitions): each topic's description or error
 *   scram-upsert BOOTSTRAP USER MECHANISM ITERATIONS PASSWORD   Admin.alterUserScramCredentials (KIP-554)
 *   scram-describe BOOTSTRAP USER...                   Admin.describeUserScramCredentials: each user's
 *                                                      [mechanism, iterations] or {"error"}
 *   groups-list BOOTSTRAP TYPES STATES                 Admin.listConsumerGroups with type and state filters
 *                                                      (comma-separated, "-" for none)
 *   groups-describe BOOTSTRAP GROUP...                 Admin.describeConsumerGroups: each group's type, state,
 *                                                      assignor and members with their assignments, or {"error"}
 *
 * BOOTSTRAP is host:port, or @FILE: a client properties file (bootstrap.servers and any other setting, e.g.
 * security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location) every client of the command uses.
 * Every command answers within its deadline; a failure is answered {"error": class, "message": ...}.
 */
public class KafkaClientProbe {
    static final Duration DEADLINE = Duration.ofSeconds(30);

    public static void main(String[] args) throws Exception {
        JsonLines.serve(KafkaClientProbe::run);
    }

    static Object run(String command, String[] a) throws Exception {
        switch (command) {
            case "describe-ids": return describeIds(a[0], Arrays.copyOfRange(a, 1, a.length));
            case "seek": return seek(a[0], a[1], Integer.parseInt(a[2]), Long.parseLong(a[3]),
                                     Integer.parseInt(a[4]), Integer.parseInt(a[5]));
            case "produce": return produce(a[0], a[1], a[2], Integer.parseInt(a[3]));
            case "produce-keyless": return produceKeyless(a[0], a[1], Integer.parseInt(a[2]),
                                                          Arrays.copyOfRange(a, 3, a.length));
            case "group-read": return groupRead(a[0], a[1], a[2], Integer.parseInt(a[3]));
            case "member-start": return Member.start(a[0], a[1], a[2], a[3]);
            case "member-state": return Member.MEMBERS.get(Integer.parseInt(a[0])).state();
            case "member-stop": return Member.MEMBERS.remove(Integer.parseInt(a[0])).stop();
            case "txn-init": return Txn.init(a[0], a[1], a[2]);
            case "txn-begin": return Txn.get(a[0]).call(p -> p.beginTransaction());
            case "txn-commit": return Txn.get(a[0]).call(p -> p.commitTransaction());
            case "txn-abort": return Txn.get(a[0]).call(p -> p.abortTransaction());
            case "txn-close": return Txn.PRODUCERS.remove(Integer.parseInt(a[0])).call(p -> p.close(DEADLINE));
            case "txn-send": return Txn.get(a[0]).send(a[1], Integer.parseInt(a[2]),
                                                       Arrays.copyOfRange(a, 3, a.length));
            case "transform": return transform(a[0], a[1], a[2], a[3], a[4], Integer.parseInt(a[5]),
                                               a[6].equals("commit"));
            case "read": return read(a[0], a[1], Integer.parseInt(a[2]), a[3]);
            case "transactions": return transactions(a[0], Arrays.copyOfRange(a, 1, a.length));
            case "producers": return producers(a[0], new TopicPartition(a[1], Integer.parseInt(a[2])));
            case "abort-txn": return abortTransaction(a[0], new TopicPartition(a[1], Integer.parseInt(a[2])),
                                                      Long.parseLong(a[3]), Short.parseShort(a[4]),
                                                      Integer.parseInt(a[5]));
            case "group-lag": return groupLag(a[0], a[1]);
            case "stream": return stream(a[0], a[1], a[2], Long.parseLong(a[3]));
            case "list-topics": return listTopics(a[0]);
            case "log-dirs": return logDirs(a[0]);
            case "groups-list": return listGroups(a[0], a[1], a[2]);
            case "groups-describe": return describeGroups(a[0], Arrays.copyOfRange(a, 1, a.length));
            case "describe-topics": return describeTopics(a[0], Integer.parseInt(a[1]),
                                                          Arrays.copyOfRange(a, 2, a.length));
            case "scram-upsert": return scramUpsert(a[0], a[1], ScramMechanism.fromMechanismName(a[2]),
                                                    Integer.parseInt(a[3]), a[4]);
            case "scram-describe": return scramDescribe(a[0], Arrays.copyOfRange(a, 1, a.length));
            default: throw new IllegalArgumentException("unknown command " + command);
        }
    }

    /** BOOTSTRAP is host:port, or @FILE: a client properties file (bootstrap.servers and any other setting, such
     *  as the security ones), so every command runs with a client configured as a test needs. */
    static Properties client(String bootstrap) {
        Properties p = new Properties();
        p.put("client.id", "kmem-java-probe");
        if (!bootstrap.startsWith("@")) {
            p.put("bootstrap.servers", bootstrap);
            return p;
        }
        try (Reader file = Files.newBufferedReader(Path.of(bootstrap.substring(1)))) {
            p.load(file);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return p;
    }

    /** A producer (acks=all) sends "stream-i" to partition 0 every 20 ms or so for MILLIS while a consumer of GROUP
     * polls; then it reads until it has every record acknowledged. What was sent, acknowledged and read (the
     * number of distinct records), and every error either client reported. */
    static Object stream(String bootstrap, String topic, String group, long millis) throws Exception {
        Properties pp = client(bootstrap);
        pp.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        pp.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        pp.put("acks", "all");
        Properties cp = consumer(bootstrap);
        cp.put("group.id", group);
        cp.put("auto.offset.reset", "earliest");
        List<Object> errors = Collections.synchronizedList(new ArrayList<>());
        TreeSet<String> acked = new TreeSet<>();
        TreeSet<String> read = new TreeSet<>();
        int sent = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp);
             KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            consumer.subscribe(List.of(topic));
            long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
            while (System.nanoTime() < end) {
                String value = "stream-" + sent++;
                producer.send(new ProducerRecord<>(topic, 0, null, value), (metadata, e) -> {
                    if (e != null) errors.add(e.toString());
                    else synchronized (acked) { acked.add(value); }
                });
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(20)))
                    read.add(record.value());
            }
            producer.flush();
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (System.nanoTime() < deadline) {
                synchronized (acked) {
                    if (read.containsAll(acked)) break;
                }
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100)))
                    read.add(record.value());
            }
            consumer.commitSync(DEADLINE);
        } catch (RuntimeException e) {
            errors.add(e.toString());
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("sent", sent);
        synchronized (acked) {
            answer.put("acked", acked.size());
            TreeSet<String> missing = new TreeSet<>(acked);
            missing.removeAll(read);
            answer.put("missing", missing.size());
        }
        answer.put("read", read.size());
        answer.put("errors", new ArrayList<>(errors));
        return answer;
    }

    static Object listTopics(String bootstrap) throws Exception {
        try (Admin admin = Admin.create(client(bootstrap))) {
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("topics", new ArrayList<>(new TreeSet<>(admin.listTopics().names().get())));
            return answer;
        }
    }

    /** Each broker's log directories: {broker id: {dir: {"error", "total", "usable", "replicas": {"topic-p":
     *  [size, offset lag, is future]}}}}; a byte count the broker did not send (before v4) is null. */
    static Object logDirs(String bootstrap) throws Exception {
        try (Admin admin = Admin.create(client(bootstrap))) {
            List<Integer> brokers = new ArrayList<>();
            for (Node node : admin.describeCluster().nodes().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS))
                brokers.add(node.id());
            Map<String, Object> answer = new LinkedHashMap<>();
            var described = admin.describeLogDirs(brokers).allDescriptions()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
            for (var broker : described.entrySet()) {
                Map<String, Object> dirs = new LinkedHashMap<>();
                for (var dir : broker.getValue().entrySet()) {
                    LogDirDescription description = dir.getValue();
                    Map<String, Object> replicas = new LinkedHashMap<>();
                    for (var replica : description.replicaInfos().entrySet())
                        replicas.put(replica.getKey().toString(), List.of(replica.getValue().size(),
                            replica.getValue().offsetLag(), replica.getValue().isFuture()));
                    Map<String, Object> entry = new LinkedHashMap<>();
                    ApiException error = description.error();
                    entry.put("error", error == null ? null : error.getClass().getSimpleName());
                    entry.put("total", bytes(description.totalBytes()));
                    entry.put("usable", bytes(description.usableBytes()));
                    entry.put("replicas", replicas);
                    dirs.put(dir.getKey(), entry);
                }
                answer.put(String.valueOf(broker.getKey()), dirs);
            }
            return answer;
        }
    }

    /** Each topic's {"id", "internal", "operations", "partitions": [[index, leader, replicas, isr, elr,
     *  last known elr]...]} or {"error"}, by name. */
    static Object describeTopics(String bootstrap, int limit, String[] names) throws Exception {
        Map<String, Object> answer = new LinkedHashMap<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            Map<String, KafkaFuture<TopicDescription>> found = admin.describeTopics(Arrays.asList(names),
                new DescribeTopicsOptions().partitionSizeLimitPerResponse(limit).includeAuthorizedOperations(true))
                .topicNameValues();
            for (String name : names) {
                try {
                    TopicDescription description = found.get(name).get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
                    Map<String, Object> topic = new LinkedHashMap<>();
                    topic.put("id", description.topicId().toString());
                    topic.put("internal", description.isInternal());
                    List<Object> operations = new ArrayList<>();
                    for (AclOperation operation : new TreeSet<>(description.authorizedOperations()))
                        operations.add(operation.name());
                    topic.put("operations", operations);
                    List<Object> partitions = new ArrayList<>();
                    for (TopicPartitionInfo partition : description.partitions())
                        partitions.add(List.of(partition.partition(), partition.leader().id(),
                            ids(partition.replicas()), ids(partition.isr()), ids(partition.elr()),
                            ids(partition.lastKnownElr())));
                    topic.put("partitions", partitions);
                    answer.put(name, topic);
                } catch (ExecutionException e) {
                    answer.put(name, JsonLines.error(e));
                }
            }
        }
        return answer;
    }

    static Object bytes(OptionalLong count) {
        return count.isPresent() ? count.getAsLong() : null;
    }

    static List<Object> ids(List<Node> nodes) {
        List<Object> ids = new ArrayList<>();
        for (Node node : nodes) ids.add(node.id());
        return ids;
    }

    /** USER's credential for MECHANISM from PASSWORD: the client salts it, the broker keeps the keys. */
    static Object scramUpsert(String bootstrap, String user, ScramMechanism mechanism, int iterations,
                              String password) throws Exception {
        try (Admin admin = Admin.create(client(bootstrap))) {
            admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(
                user, new ScramCredentialInfo(mechanism, iterations), password))).all().get();
            return new LinkedHashMap<String, Object>();
        }
    }

    static Object scramDescribe(String bootstrap, String[] users) throws Exception {
        try (Admin admin = Admin.create(client(bootstrap))) {
            var result = admin.describeUserScramCredentials(Arrays.asList(users));
            Map<String, Object> answer = new LinkedHashMap<>();
            for (String user : users) {
                try {
                    UserScramCredentialsDescription description = result.description(user).get();
                    List<Object> infos = new ArrayList<>();
                    for (ScramCredentialInfo info : description.credentialInfos())
                        infos.add(List.of(info.mechanism().mechanismName(), info.iterations()));
                    answer.put(user, infos);
                } catch (ExecutionException e) {
                    answer.put(user, JsonLines.error(e));
                }
            }
            return answer;
        }
    }

    static Properties consumer(String bootstrap) {
        Properties p = client(bootstrap);
        p.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        p.put("enable.auto.commit", "false");
        return p;
    }

    /** Each id's description ({"name", "partitions"}) or failure ({"error"}), by id. */
    static Object describeIds(String bootstrap, String[] ids) throws Exception {
        List<Uuid> topicIds = new ArrayList<>();
        for (String id : ids) topicIds.add(Uuid.fromString(id));
        Map<String, Object> answer = new LinkedHashMap<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            Map<Uuid, KafkaFuture<TopicDescription>> found =
                admin.describeTopics(TopicCollection.ofTopicIds(topicIds)).topicIdValues();
            for (Uuid id : topicIds) {
                try {
                    TopicDescription description = found.get(id).get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
                    Map<String, Object> topic = new LinkedHashMap<>();
                    topic.put("name", description.name());
                    topic.put("topic_id", description.topicId().toString());
                    topic.put("partitions", description.partitions().size());
                    answer.put(id.toString(), topic);
                } catch (ExecutionException e) {
                    answer.put(id.toString(), JsonLines.error(e));
                }
            }
        }
        return answer;
    }

    /** Seek to OFFSET of leader epoch EPOCH with no reset policy: the consumer validates the position with
     * OffsetForLeaderEpoch before it fetches; the offsets read, or the truncation it detected. */
    static Object seek(String bootstrap, String topic, int partition, long offset, int epoch, int count) {
        Properties p = consumer(bootstrap);
        p.put("auto.offset.reset", "none");
        TopicPartition tp = new TopicPartition(topic, partition);
        Map<String, Object> answer = new LinkedHashMap<>();
        List<Object> offsets = new ArrayList<>();
        answer.put("offsets", offsets);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
            consumer.assign(List.of(tp));
            consumer.seek(tp, new OffsetAndMetadata(offset, Optional.of(epoch), ""));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (offsets.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100)))
                    offsets.add(record.offset());
            }
        } catch (LogTruncationException e) {
            OffsetAndMetadata divergent = e.divergentOffsets().get(tp);
            answer.put("error", e.getClass().getSimpleName());
            answer.put("divergent_offset", divergent == null ? null : divergent.offset());
            answer.put("divergent_epoch", divergent == null ? null : divergent.leaderEpoch().orElse(-1));
        } catch (RuntimeException e) {
            answer.putAll(JsonLines.error(e));
        }
        return answer;
    }

    /** COUNT records "COMPRESSION-i" to partition 0 from an idempotent producer; their offsets. */
    static Object produce(String bootstrap, String topic, String compression, int count) throws Exception {
        Properties p = client(bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("compression.type", compression);
        p.put("linger.ms", "20");
        List<Object> offsets = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++)
                sent.add(producer.send(new ProducerRecord<>(topic, 0, "key-" + i, compression + "-" + i)));
            for (Future<RecordMetadata> metadata : sent)
                offsets.add(metadata.get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS).offset());
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("offsets", offsets);
        return answer;
    }

    /** COUNT records to partition 0 of TOPIC in one batch, those at the INDICES without a key; each one's
     *  outcome in order: {"offset"} or {"error": the exception's class, "message"}. */
    static Object produceKeyless(String bootstrap, String topic, int count, String[] indices) throws Exception {
        Properties p = client(bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("enable.idempotence", "false");
        p.put("retries", "0");
        p.put("linger.ms", "500");
        p.put("batch.size", "1048576");
        TreeSet<Integer> keyless = new TreeSet<>();
        for (String index : indices)
            keyless.add(Integer.parseInt(index));
        List<Object> outcomes = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++)
                sent.add(producer.send(new ProducerRecord<>(topic, 0, keyless.contains(i) ? null : "key-" + i,
                                                            "value-" + i)));
            for (Future<RecordMetadata> metadata : sent) {
                Map<String, Object> outcome = new LinkedHashMap<>();
                try {
                    outcome.put("offset", metadata.get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS).offset());
                } catch (ExecutionException e) {
                    outcome.put("error", e.getCause().getClass().getSimpleName());
                    outcome.put("message", e.getCause().getMessage());
                }
                outcomes.add(outcome);
            }
        }
        return outcomes;
    }

    /** Join GROUP on TOPIC (from the committed offsets, else the earliest), read COUNT values, commit them. */
    static Object groupRead(String bootstrap, String topic, String group, int count) {
        Properties p = consumer(bootstrap);
        p.put("group.id", group);
        p.put("auto.offset.reset", "earliest");
        List<Object> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (values.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100)))
                    values.add(record.value());
            }
            consumer.commitSync(DEADLINE);
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("values", values);
        return answer;
    }

    /** A group member (ASSIGNOR: a partition.assignment.strategy class) that polls on its own thread and
     * records each ConsumerRebalanceListener callback as [name, [partition...]] ("error" if poll threw). */
    static class Member implements ConsumerRebalanceListener, Runnable {
        static final Map<Integer, Member> MEMBERS = new ConcurrentHashMap<>();
        static int started;
        final KafkaConsumer<String, String> consumer;
        final String topic;
        final Thread thread = new Thread(this, "probe-member");
        final TreeSet<Integer> owned = new TreeSet<>();
        final List<Object> events = new ArrayList<>();
        volatile boolean stopping;

        Member(Properties p, String topic) {
            this.consumer = new KafkaConsumer<>(p);
            this.topic = topic;
        }

        static Object start(String bootstrap, String topic, String group, String assignor) {
            Properties p = consumer(bootstrap);
            p.put("group.id", group);
            p.put("auto.offset.reset", "earliest");
            if (assignor.startsWith("consumer:")) {
                p.put("group.protocol", "consumer");
                p.put("group.remote.assignor", assignor.substring("consumer:".length()));
            } else {
                p.put("partition.assignment.strategy", assignor);
                p.put("session.timeout.ms", "6000");
                p.put("heartbeat.interval.ms", "200");
            }
            Member member = new Member(p, topic);
            int id = ++started;
            MEMBERS.put(id, member);
            member.thread.start();
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("member", id);
            return answer;
        }

        public void run() {
            try {
                consumer.subscribe(List.of(topic), this);
                while (!stopping) consumer.poll(Duration.ofMillis(50));
            } catch (RuntimeException e) {
                synchronized (this) {
                    events.add(List.of("error", e.toString()));
                }
            } finally {
                consumer.close(DEADLINE);
            }
        }

        synchronized void record(String name, Collection<TopicPartition> partitions) {
            TreeSet<Integer> ids = new TreeSet<>();
            for (TopicPartition tp : partitions) ids.add(tp.partition());
            if (name.equals("assigned")) owned.addAll(ids);
            else owned.removeAll(ids);
            events.add(List.of(name, new ArrayList<>(ids)));
        }

        public void onPartitionsRevoked(Collection<TopicPartition> partitions) { record("revoked", partitions); }

        public void onPartitionsAssigned(Collection<TopicPartition> partitions) { record("assigned", partitions); }

        public void onPartitionsLost(Collection<TopicPartition> partitions) { record("lost", partitions); }

        synchronized Map<String, Object> state() {
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("owned", new ArrayList<>(owned));
            answer.put("events", new ArrayList<>(events));
            return answer;
        }

        Object stop() throws InterruptedException {
            stopping = true;
            thread.join(2 * DEADLINE.toMillis());
            return state();
        }
    }

    static Properties transactionalProducer(String bootstrap, String transactionalId) {
        Properties p = client(bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("transactional.id", transactionalId);
        p.put("max.block.ms", String.valueOf(DEADLINE.toMillis()));
        return p;
    }

    /** Transactional producers kept between commands (a test drives their calls one at a time). */
    static class Txn {
        static final Map<Integer, Txn> PRODUCERS = new ConcurrentHashMap<>();
        static int started;
        final KafkaProducer<String, String> producer;

        interface Call { void run(KafkaProducer<String, String> producer) throws Exception; }

        Txn(KafkaProducer<String, String> producer) { this.producer = producer; }

        static Object init(String bootstrap, String transactionalId, String timeoutMs) {
            Properties p = transactionalProducer(bootstrap, transactionalId);
            p.put("transaction.timeout.ms", timeoutMs);
            KafkaProducer<String, String> producer = new KafkaProducer<>(p);
            int id = ++started;
            PRODUCERS.put(id, new Txn(producer));
            Map<String, Object> answer = new LinkedHashMap<>();
            try {
                producer.initTransactions();
                answer.put("producer", id);
            } catch (RuntimeException e) {
                PRODUCERS.remove(id).producer.close(Duration.ZERO);
                answer.putAll(JsonLines.error(e));
            }
            return answer;
        }

        static Txn get(String id) { return PRODUCERS.get(Integer.parseInt(id)); }

        Object call(Call call) throws Exception {
            Map<String, Object> answer = new LinkedHashMap<>();
            try {
                call.run(producer);
                answer.put("ok", true);
            } catch (RuntimeException e) {
                answer.putAll(JsonLines.error(e));
            }
            return answer;
        }

        Object send(String topic, int partition, String[] values) throws Exception {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            List<Object> offsets = new ArrayList<>();
            Map<String, Object> answer = new LinkedHashMap<>();
            try {
                for (String value : values)
                    sent.add(producer.send(new ProducerRecord<>(topic, partition, null, value)));
                for (Future<RecordMetadata> metadata : sent)
                    offsets.add(metadata.get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS).offset());
                answer.put("offsets", offsets);
            } catch (RuntimeException | ExecutionException e) {
                answer.putAll(JsonLines.error(e));
            }
            return answer;
        }
    }

    /** Consume-transform-produce (KIP-447): a read_committed member of GROUP reads COUNT records of IN, a
     * transactional producer writes "out-VALUE" to OUT partition 0 and sends the consumer's positions with
     * sendOffsetsToTransaction(offsets, consumer.groupMetadata()), then commits or aborts. */
    static Object transform(String bootstrap, String transactionalId, String in, String out, String group, int count,
                            boolean commit) {
        Properties c = consumer(bootstrap);
        c.put("group.id", group);
        c.put("auto.offset.reset", "earliest");
        c.put("isolation.level", "read_committed");
        Map<String, Object> answer = new LinkedHashMap<>();
        List<Object> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c);
             KafkaProducer<String, String> producer = new KafkaProducer<>(transactionalProducer(bootstrap,
                                                                                               transactionalId))) {
            producer.initTransactions();
            consumer.subscribe(List.of(in));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (values.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100)))
                    values.add(record.value());
            }
            producer.beginTransaction();
            for (Object value : values) producer.send(new ProducerRecord<>(out, 0, null, "out-" + value));
            Map<TopicPartition, OffsetAndMetadata> offsets = new LinkedHashMap<>();
            for (TopicPartition tp : consumer.assignment())
                offsets.put(tp, new OffsetAndMetadata(consumer.position(tp)));
            producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
            producer.flush();           // abortTransaction drops unsent records: these are in the log
            if (commit) producer.commitTransaction();
            else producer.abortTransaction();
            answer.put("values", values);
            answer.put("generation", consumer.groupMetadata().generationId());
            answer.put("member", consumer.groupMetadata().memberId());
        } catch (RuntimeException e) {
            answer.putAll(JsonLines.error(e));
        }
        return answer;
    }

    /** Every record of TOPIC's partitions 0..PARTITIONS-1 from the beginning up to their end offsets at
     * ISOLATION (read_committed: the last stable offsets), as [partition, offset, value]. */
    static Object read(String bootstrap, String topic, int partitions, String isolation) {
        Properties c = consumer(bootstrap);
        c.put("isolation.level", isolation);
        List<TopicPartition> tps = new ArrayList<>();
        for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(topic, i));
        Map<String, Object> answer = new LinkedHashMap<>();
        List<Object> records = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps, DEADLINE);
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (System.nanoTime() < deadline && tps.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100)))
                    records.add(List.of(record.partition(), record.offset(), String.valueOf(record.value())));
            }
            answer.put("records", records);
            List<Object> positions = new ArrayList<>();
            for (TopicPartition tp : tps) positions.add(consumer.position(tp));
            answer.put("positions", positions);
        } catch (RuntimeException e) {
            answer.putAll(JsonLines.error(e));
        }
        return answer;
    }

    /** listTransactions() as [id, producer id, state], and describeTransactions(TXID...) by id. */
    static Object transactions(String bootstrap, String[] ids) throws Exception {
        Map<String, Object> answer = new LinkedHashMap<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            List<Object> listed = new ArrayList<>();
            for (TransactionListing listing : admin.listTransactions().all().get(DEADLINE.toMillis(),
                                                                                 TimeUnit.MILLISECONDS))
                listed.add(List.of(listing.transactionalId(), listing.producerId(), listing.state().toString()));
            answer.put("listed", listed);
            Map<String, Object> described = new LinkedHashMap<>();
            if (ids.length > 0) {
                Map<String, TransactionDescription> found = admin.describeTransactions(List.of(ids)).all()
                    .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
                for (Map.Entry<String, TransactionDescription> entry : found.entrySet()) {
                    TransactionDescription d = entry.getValue();
                    Map<String, Object> one = new LinkedHashMap<>();
                    one.put("state", d.state().toString());
                    one.put("producer_id", d.producerId());
                    one.put("producer_epoch", (int) d.producerEpoch());
                    one.put("timeout_ms", d.transactionTimeoutMs());
                    one.put("started", d.transactionStartTimeMs().isPresent());
                    List<Object> partitions = new ArrayList<>();
                    for (TopicPartition tp : d.topicPartitions()) partitions.add(tp.toString());
                    partitions.sort(null);
                    one.put("partitions", partitions);
                    described.put(entry.getKey(), one);
                }
            }
            answer.put("described", described);
        }
        return answer;
    }

    /** describeProducers of one partition: each active producer's id, epoch, coordinator epoch (-1: none) and
     * open transaction's first offset (-1: none). */
    static Object producers(String bootstrap, TopicPartition tp) throws Exception {
        List<Object> producers = new ArrayList<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            PartitionProducerState state = admin.describeProducers(List.of(tp)).partitionResult(tp)
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
            for (ProducerState producer : state.activeProducers()) {
                Map<String, Object> one = new LinkedHashMap<>();
                one.put("producer_id", producer.producerId());
                one.put("producer_epoch", producer.producerEpoch());
                one.put("coordinator_epoch", producer.coordinatorEpoch().orElse(-1));
                one.put("transaction_start", producer.currentTransactionStartOffset().orElse(-1));
                producers.add(one);
            }
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("producers", producers);
        return answer;
    }

    /** {"topic-partition": [committed offset, log end offset, lag]} of each partition GROUP committed, by the
     * Admin calls kafka-consumer-groups.sh makes: listConsumerGroupOffsets, then listOffsets latest. */
    static Object groupLag(String bootstrap, String group) throws Exception {
        Map<String, Object> answer = new LinkedHashMap<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(group)
                .partitionsToOffsetAndMetadata().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
            Map<TopicPartition, OffsetSpec> latest = new LinkedHashMap<>();
            for (TopicPartition tp : committed.keySet()) latest.put(tp, OffsetSpec.latest());
            Map<TopicPartition, ListOffsetsResultInfo> ends = admin.listOffsets(latest).all()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
            for (Map.Entry<TopicPartition, OffsetAndMetadata> entry : committed.entrySet()) {
                long offset = entry.getValue().offset(), end = ends.get(entry.getKey()).offset();
                answer.put(entry.getKey().toString(), List.of(offset, end, end - offset));
            }
        }
        return answer;
    }

    /** Admin.abortTransaction of a hanging transaction (what kafka-transactions.sh abort sends). */
    static Object abortTransaction(String bootstrap, TopicPartition tp, long producerId, short epoch,
                                   int coordinatorEpoch) throws Exception {
        try (Admin admin = Admin.create(client(bootstrap))) {
            admin.abortTransaction(new AbortTransactionSpec(tp, producerId, epoch, coordinatorEpoch)).all()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("ok", true);
        return answer;
    }

    /** Admin.listConsumerGroups with kafka-consumer-groups.sh's --type and --state filters (comma-separated,
     * "-" for none): [{"group_id", "type", "state"}] sorted by id. */
    static Object listGroups(String bootstrap, String types, String states) throws Exception {
        ListConsumerGroupsOptions options = new ListConsumerGroupsOptions();
        if (!types.equals("-")) {
            options.withTypes(Arrays.stream(types.split(",")).map(GroupType::parse)
                .collect(Collectors.toSet()));
        }
        if (!states.equals("-")) {
            options.inStates(Arrays.stream(states.split(",")).map(ConsumerGroupState::parse)
                .collect(Collectors.toSet()));
        }
        List<Object> groups = new ArrayList<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            Collection<ConsumerGroupListing> listed = admin.listConsumerGroups(options).all()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
            for (ConsumerGroupListing listing : listed) {
                Map<String, Object> one = new LinkedHashMap<>();
                one.put("group_id", listing.groupId());
                one.put("type", listing.type().map(GroupType::toString).orElse(null));
                one.put("state", listing.state().map(ConsumerGroupState::toString).orElse(null));
                groups.add(one);
            }
        }
        groups.sort((x, y) -> ((String) ((Map<?, ?>) x).get("group_id"))
            .compareTo((String) ((Map<?, ?>) y).get("group_id")));
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("groups", groups);
        return answer;
    }

    static List<String> sortedNames(Collection<TopicPartition> partitions) {
        return partitions.stream().map(TopicPartition::toString).sorted()
            .collect(Collectors.toList());
    }

    /** Admin.describeConsumerGroups (ConsumerGroupDescribe, falling back to DescribeGroups for a classic group, as
     * kafka-consumer-groups.sh --describe --members): {group: {"type", "state", "assignor", "coordinator",
     * "members": [{"member_id", "instance_id", "client_id", "host", "assigned", "target"}]}}, or {group: {"error"}}. */
    static Object describeGroups(String bootstrap, String[] groups) throws Exception {
        Map<String, Object> answer = new LinkedHashMap<>();
        try (Admin admin = Admin.create(client(bootstrap))) {
            Map<String, KafkaFuture<ConsumerGroupDescription>> described =
                admin.describeConsumerGroups(Arrays.asList(groups)).describedGroups();
            for (Map.Entry<String, KafkaFuture<ConsumerGroupDescription>> entry : described.entrySet()) {
                Map<String, Object> one = new LinkedHashMap<>();
                try {
                    ConsumerGroupDescription group = entry.getValue().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
                    one.put("type", group.type().toString());
                    one.put("state", group.state().toString());
                    one.put("assignor", group.partitionAssignor());
                    one.put("coordinator", group.coordinator().id());
                    List<Object> members = new ArrayList<>();
                    for (MemberDescription member : group.members()) {
                        Map<String, Object> m = new LinkedHashMap<>();
                        m.put("member_id", member.consumerId());
                        m.put("instance_id", member.groupInstanceId().orElse(null));
                        m.put("client_id", member.clientId());
                        m.put("host", member.host());
                        m.put("assigned", sortedNames(member.assignment().topicPartitions()));
                        m.put("target", member.targetAssignment()
                            .map(t -> (Object) sortedNames(t.topicPartitions())).orElse(null));
                        members.add(m);
                    }
                    one.put("members", members);
                } catch (ExecutionException e) {
                    one.put("error", e.getCause().getClass().getSimpleName());
                }
                answer.put(entry.getKey(), one);
            }
        }
        return answer;
    }
}

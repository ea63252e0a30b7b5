import java.lang.reflect.Constructor;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

import org.apache.flink.api.connector.sink2.Committer.CommitRequest;
import org.apache.flink.connector.kafka.sink.KafkaCommittable;
import org.apache.flink.connector.kafka.sink.internal.FlinkKafkaInternalProducer;
import org.apache.flink.connector.kafka.sink.internal.KafkaCommitter;
import org.apache.flink.connector.kafka.sink.internal.ProducerPoolImpl;
import org.apache.flink.connector.kafka.sink.internal.TransactionAbortStrategyContextImpl;
import org.apache.flink.connector.kafka.sink.internal.TransactionAbortStrategyImpl;
import org.apache.flink.connector.kafka.sink.internal.TransactionalIdFactory;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Apache Flink's exactly-once Kafka sink (flink-connector-kafka) against a kmem broker, driven by
 * tests/test_broker_flink_txn.py: one command a line on stdin, one JSON object a line on stdout.
 *
 * Each step is Flink's own code, called as a KafkaSink with DeliveryGuarantee.EXACTLY_ONCE calls it:
 *
 *   write BOOTSTRAP PREFIX CHECKPOINT TIMEOUT_MS TOPIC VALUE...
 *       the writer of subtask 0 (its producers' transaction.timeout.ms: TIMEOUT_MS) opens the transaction of
 *       CHECKPOINT (ExactlyOnceKafkaWriter.startTransaction: ProducerPoolImpl.getTransactionalProducer with the
 *       id TransactionalIdFactory names, which calls initTransactions, then beginTransaction) and sends the
 *       values to partition 0 of TOPIC: its id
 *   flush WRITER
 *       KafkaWriter.flush (the sink's records are in the log, the transaction still open)
 *   precommit WRITER
 *       the checkpoint barrier: KafkaWriter.flush, then ExactlyOnceKafkaWriter.prepareCommit
 *       (KafkaCommittable.of, precommitTransaction); answers the committable as the checkpoint stores it
 *       (KafkaCommittableSerializer, hex) and its transactional id, producer id and epoch
 *   fail WRITER
 *       the task dies: its producer is closed at once (FlinkKafkaInternalProducer.close), nothing aborted
 *   commit BOOTSTRAP PREFIX COMMITTABLE...
 *       after a restart, a new KafkaCommitter commits the committables restored from the checkpoint: each
 *       has no producer, so the committer makes one (FlinkKafkaInternalProducer), resumeTransaction(producer
 *       id, epoch), commitTransaction; answers what the committer signalled for each request: "committed"
 *       (nothing), "retry", "already-committed", or "failed-known"/"failed-unknown" with the exception
 *   abort-lingering BOOTSTRAP STRATEGY PREFIX START_CHECKPOINT TOPIC PRECOMMITTED_ID...
 *       the restarted writer's ExactlyOnceKafkaWriter.abortLingeringTransactions: TransactionAbortStrategyImpl
 *       STRATEGY (PROBING, LISTING) with its context for subtask 0 of 1 (the ids of the restored committables
 *       are the committer's), aborting with the writer's aborter (a pooled producer set to the id:
 *       initTransactions, flush, getEpoch); answers [id, epoch] for each id it aborted
 *
 * The committer's and the aborter's producers have transaction.timeout.ms TIMEOUT_MS (below). A failure is
 * answered {"error", "message"}.
 */
public class FlinkTxnProbe {
    static final int SUBTASK = 0, PARALLELISM = 1;
    // Flink's documentation asks users for a transaction.timeout.ms longer than any restart, within the broker's
    // transaction.max.timeout.ms (Kafka's default: 15 min)
    static final String TIMEOUT_MS = "600000";
    static final Map<Integer, Writer> WRITERS = new HashMap<>();
    static int writers, commits;

    public static void main(String[] args) throws Exception {
        JsonLines.serve(FlinkTxnProbe::run);
    }

    static Object run(String command, String[] a) throws Exception {
        switch (command) {
            case "write": return Writer.start(a[0], a[1], Long.parseLong(a[2]), a[3], a[4],
                                              Arrays.copyOfRange(a, 5, a.length));
            case "flush": return WRITERS.get(Integer.parseInt(a[0])).flush();
            case "precommit": return WRITERS.get(Integer.parseInt(a[0])).precommit();
            case "fail": return WRITERS.remove(Integer.parseInt(a[0])).fail();
            case "commit": return commit(a[0], a[1], Arrays.copyOfRange(a, 2, a.length));
            case "abort-lingering": return abortLingering(a[0], TransactionAbortStrategyImpl.valueOf(a[1]), a[2],
                                                          Long.parseLong(a[3]), a[4],
                                                          Set.of(Arrays.copyOfRange(a, 5, a.length)));
            default: throw new IllegalArgumentException("unknown command " + command);
        }
    }

    /** The producer configuration KafkaSinkBuilder gives its producers (byte arrays), with timeoutMs. */
    static Properties sinkConfig(String bootstrap, String timeoutMs) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        p.put("transaction.timeout.ms", timeoutMs);
        p.put("max.block.ms", "30000");
        return p;
    }

    /** KafkaCommittableSerializer (package-private): the form a committable takes in Flink's checkpoint. */
    @SuppressWarnings("unchecked")
    static SimpleVersionedSerializer<KafkaCommittable> checkpointFormat() throws Exception {
        Constructor<?> constructor =
            Class.forName("org.apache.flink.connector.kafka.sink.KafkaCommittableSerializer").getDeclaredConstructor();
        constructor.setAccessible(true);
        return (SimpleVersionedSerializer<KafkaCommittable>) constructor.newInstance();
    }

    /** One subtask's writer: its producer pool and the producer of its open transaction. */
    static class Writer {
        final ProducerPoolImpl pool;
        final FlinkKafkaInternalProducer<byte[], byte[]> producer;

        Writer(ProducerPoolImpl pool, FlinkKafkaInternalProducer<byte[], byte[]> producer) {
            this.pool = pool;
            this.producer = producer;
        }

        static Object start(String bootstrap, String prefix, long checkpointId, String timeoutMs, String topic,
                            String[] values) {
            ProducerPoolImpl pool = new ProducerPoolImpl(sinkConfig(bootstrap, timeoutMs), producer -> { }, List.of());
            String transactionalId = TransactionalIdFactory.buildTransactionalId(prefix, SUBTASK, checkpointId);
            FlinkKafkaInternalProducer<byte[], byte[]> producer =
                pool.getTransactionalProducer(transactionalId, checkpointId);
            producer.beginTransaction();
            for (String value : values)
                producer.send(new ProducerRecord<>(topic, 0, null, value.getBytes(StandardCharsets.UTF_8)));
            int id = ++writers;
            WRITERS.put(id, new Writer(pool, producer));
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("writer", id);
            answer.put("transactional_id", transactionalId);
            return answer;
        }

        Object flush() {
            producer.flush();
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("ok", true);
            return answer;
        }

        Object precommit() throws Exception {
            producer.flush();
            if (!producer.hasRecordsInTransaction()) throw new IllegalStateException("nothing to pre-commit");
            KafkaCommittable committable = KafkaCommittable.of(producer);
            producer.precommitTransaction();
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("committable", HexFormat.of().formatHex(checkpointFormat().serialize(committable)));
            answer.put("transactional_id", committable.getTransactionalId());
            answer.put("producer_id", committable.getProducerId());
            answer.put("epoch", (int) committable.getEpoch());
            return answer;
        }

        Object fail() {
            producer.close();
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("ok", true);
            return answer;
        }
    }

    /** What KafkaCommitter signalled for one request (no signal: committed). */
    static class Request implements CommitRequest<KafkaCommittable> {
        final KafkaCommittable committable;
        List<Object> outcome = List.of("committed");

        Request(KafkaCommittable committable) { this.committable = committable; }

        public KafkaCommittable getCommittable() { return committable; }
        public int getNumberOfRetries() { return 0; }
        public void signalFailedWithKnownReason(Throwable t) { outcome = List.of("failed-known", t.toString()); }
        public void signalFailedWithUnknownReason(Throwable t) { outcome = List.of("failed-unknown", t.toString()); }
        public void retryLater() { outcome = List.of("retry"); }
        public void updateAndRetryLater(KafkaCommittable committable) { outcome = List.of("retry"); }
        public void signalAlreadyCommitted() { outcome = List.of("already-committed"); }
    }

    static Object commit(String bootstrap, String prefix, String[] committables) throws Exception {
        SimpleVersionedSerializer<KafkaCommittable> format = checkpointFormat();
        List<Request> requests = new ArrayList<>();
        for (String hex : committables)
            requests.add(new Request(format.deserialize(format.getVersion(), HexFormat.of().parseHex(hex))));
        // a new committer per restart: a new attempt number, so a new backchannel to the writer
        try (KafkaCommitter committer = new KafkaCommitter(sinkConfig(bootstrap, TIMEOUT_MS), prefix, SUBTASK,
                                                           ++commits, false, FlinkKafkaInternalProducer::new)) {
            committer.commit(new ArrayList<>(requests));
        }
        List<Object> outcomes = new ArrayList<>();
        for (Request request : requests) outcomes.add(request.outcome);
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("outcomes", outcomes);
        return answer;
    }

    static Object abortLingering(String bootstrap, TransactionAbortStrategyImpl strategy, String prefix,
                                 long startCheckpointId, String topic, Set<String> precommitted) throws Exception {
        Properties config = sinkConfig(bootstrap, TIMEOUT_MS);
        List<Object> aborted = new ArrayList<>();
        try (ProducerPoolImpl pool = new ProducerPoolImpl(config, producer -> { }, List.of());
             Admin admin = Admin.create(config)) {
            TransactionAbortStrategyImpl.TransactionAborter aborter = transactionalId -> {
                FlinkKafkaInternalProducer<byte[], byte[]> producer =
                    pool.getTransactionalProducer(transactionalId, startCheckpointId);
                producer.flush();
                short epoch = producer.getEpoch();
                pool.recycle(producer);
                aborted.add(List.of(transactionalId, (int) epoch));
                return epoch;
            };
            strategy.abortTransactions(new TransactionAbortStrategyContextImpl(
                () -> List.of(topic), SUBTASK, PARALLELISM, new int[] {SUBTASK}, PARALLELISM, List.of(prefix),
                startCheckpointId, aborter, () -> admin, precommitted));
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("aborted", aborted);
        return answer;
    }
}

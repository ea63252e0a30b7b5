import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
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
 *   member-state ID / member-stop ID                   the partitions it owns and its rebalance callbacks so far
 *
 * Every command answers within its deadline; a failure is answered {"error": class, "message": ...}.
 */
public class KafkaClientProbe {
    static final Duration DEADLINE = Duration.ofSeconds(30);

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split(" ");
            Object answer;
            try {
                answer = run(words[0], Arrays.copyOfRange(words, 1, words.length));
            } catch (Throwable e) {
                answer = error(e);
            }
            out.println(json(answer));
        }
    }

    static Object run(String command, String[] a) throws Exception {
        switch (command) {
            case "describe-ids": return describeIds(a[0], Arrays.copyOfRange(a, 1, a.length));
            case "seek": return seek(a[0], a[1], Integer.parseInt(a[2]), Long.parseLong(a[3]),
                                     Integer.parseInt(a[4]), Integer.parseInt(a[5]));
            case "produce": return produce(a[0], a[1], a[2], Integer.parseInt(a[3]));
            case "group-read": return groupRead(a[0], a[1], a[2], Integer.parseInt(a[3]));
            case "member-start": return Member.start(a[0], a[1], a[2], a[3]);
            case "member-state": return Member.MEMBERS.get(Integer.parseInt(a[0])).state();
            case "member-stop": return Member.MEMBERS.remove(Integer.parseInt(a[0])).stop();
            default: throw new IllegalArgumentException("unknown command " + command);
        }
    }

    static Map<String, Object> error(Throwable e) {
        Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("error", cause.getClass().getSimpleName());
        StringBuilder message = new StringBuilder(String.valueOf(cause.getMessage()));
        for (Throwable inner = cause.getCause(); inner != null; inner = inner.getCause())
            message.append(" <- ").append(inner);
        answer.put("message", message.toString());
        return answer;
    }

    static Properties client(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "kmem-java-probe");
        return p;
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
                    answer.put(id.toString(), error(e));
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
            answer.putAll(error(e));
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
            p.put("partition.assignment.strategy", assignor);
            p.put("session.timeout.ms", "6000");
            p.put("heartbeat.interval.ms", "200");
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

    static String json(Object value) {
        if (value == null) return "null";
        if (value instanceof Number || value instanceof Boolean) return value.toString();
        if (value instanceof Map) {
            StringBuilder text = new StringBuilder("{");
            Iterator<? extends Map.Entry<?, ?>> entries = ((Map<?, ?>) value).entrySet().iterator();
            while (entries.hasNext()) {
                Map.Entry<?, ?> entry = entries.next();
                text.append(json(String.valueOf(entry.getKey()))).append(": ").append(json(entry.getValue()));
                if (entries.hasNext()) text.append(", ");
            }
            return text.append("}").toString();
        }
        if (value instanceof List) {
            StringBuilder text = new StringBuilder("[");
            Iterator<?> items = ((List<?>) value).iterator();
            while (items.hasNext()) {
                text.append(json(items.next()));
                if (items.hasNext()) text.append(", ");
            }
            return text.append("]").toString();
        }
        StringBuilder text = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') text.append('\\').append(c);
            else if (c < 0x20) text.append(String.format("\\u%04x", (int) c));
            else text.append(c);
        }
        return text.append('"').toString();
    }
}

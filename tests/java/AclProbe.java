import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.resource.ResourceType;

/**
 * Apache's Java clients as a user of kmem broker over SASL_PLAINTEXT with PLAIN (password: the user's name and
 * "-secret"), for the ACL tests (tests/test_broker_acls_clients.py). Commands (one a line, a JSON answer each):
 * create USER BOOTSTRAP TYPE NAME PATTERN PRINCIPAL OPERATION PERMISSION: AdminClient.createAcls, "ok";
 * describe USER BOOTSTRAP: every ACL as "TYPE:PATTERN:NAME:PRINCIPAL:HOST:OPERATION:PERMISSION";
 * delete USER BOOTSTRAP PRINCIPAL: deleteAcls of the principal's ACLs, the deleted ones as describe lists them;
 * produce USER BOOTSTRAP TOPIC: one record sent, "ok"; transactional USER BOOTSTRAP ID: initTransactions, "ok";
 * consume USER BOOTSTRAP TOPIC GROUP: a subscribed poll in the group, "ok";
 * quota-alter USER BOOTSTRAP ENTITY-TYPE NAME KEY VALUE: alterClientQuotas of one key (NAME "<default>": the
 * default entity; VALUE "remove": removed), "ok"; quota-describe USER BOOTSTRAP: describeClientQuotas of every
 * entity, each as "type=name,...:key=value,..." (sorted). A failure answers its exception.
 */
public final class AclProbe {
    static final Duration DEADLINE = Duration.ofSeconds(30);

    public static void main(String[] argv) throws Exception {
        JsonLines.serve(AclProbe::run);
    }

    static Object run(String command, String[] a) throws Exception {
        switch (command) {
            case "create": return create(a[0], a[1], new AclBinding(
                new ResourcePattern(ResourceType.valueOf(a[2]), a[3], PatternType.valueOf(a[4])),
                new AccessControlEntry(a[5], "*", AclOperation.valueOf(a[6]), AclPermissionType.valueOf(a[7]))));
            case "describe": return describe(a[0], a[1]);
            case "delete": return delete(a[0], a[1], a[2]);
            case "produce": return produce(a[0], a[1], a[2], null);
            case "transactional": return produce(a[0], a[1], null, a[2]);
            case "consume": return consume(a[0], a[1], a[2], a[3]);
            case "quota-alter": return alterQuota(a[0], a[1], a[2], a[3], a[4], a[5]);
            case "quota-describe": return describeQuotas(a[0], a[1]);
            default: throw new IllegalArgumentException("unknown command " + command);
        }
    }

    static Properties client(String user, String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", "PLAIN");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username=\""
            + user + "\" password=\"" + user + "-secret\";");
        return p;
    }

    static Object create(String user, String bootstrap, AclBinding binding) throws Exception {
        try (Admin admin = Admin.create(client(user, bootstrap))) {
            admin.createAcls(List.of(binding)).all().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
        }
        return "ok";
    }

    static List<String> listed(Collection<AclBinding> bindings) {
        List<String> answer = new ArrayList<>();
        for (AclBinding b : bindings)
            answer.add(b.pattern().resourceType() + ":" + b.pattern().patternType() + ":" + b.pattern().name() + ":"
                + b.entry().principal() + ":" + b.entry().host() + ":" + b.entry().operation() + ":"
                + b.entry().permissionType());
        answer.sort(null);
        return answer;
    }

    static Object describe(String user, String bootstrap) throws Exception {
        try (Admin admin = Admin.create(client(user, bootstrap))) {
            return listed(admin.describeAcls(AclBindingFilter.ANY).values()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS));
        }
    }

    static Object delete(String user, String bootstrap, String principal) throws Exception {
        AclBindingFilter filter = new AclBindingFilter(ResourcePatternFilter.ANY,
            new AccessControlEntryFilter(principal, null, AclOperation.ANY, AclPermissionType.ANY));
        try (Admin admin = Admin.create(client(user, bootstrap))) {
            return listed(admin.deleteAcls(List.of(filter)).all().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS));
        }
    }

    static Object produce(String user, String bootstrap, String topic, String transactionalId) throws Exception {
        Properties p = client(user, bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("max.block.ms", "20000");
        if (transactionalId != null) p.put("transactional.id", transactionalId);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            if (transactionalId != null) producer.initTransactions();
            else producer.send(new ProducerRecord<>(topic, "from java")).get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
        }
        return "ok";
    }

    static Object consume(String user, String bootstrap, String topic, String group) {
        Properties p = client(user, bootstrap);
        p.put("group.id", group);
        p.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
            consumer.subscribe(List.of(topic));
            long end = System.nanoTime() + DEADLINE.toNanos();
            while (consumer.assignment().isEmpty() && System.nanoTime() < end) consumer.poll(Duration.ofMillis(200));
            return consumer.assignment().isEmpty() ? "no assignment" : "ok";
        }
    }

    static Object alterQuota(String user, String bootstrap, String type, String name, String key, String value)
            throws Exception {
        Map<String, String> entity = new java.util.HashMap<>();
        entity.put(type, name.equals("<default>") ? null : name);
        ClientQuotaAlteration.Op op = new ClientQuotaAlteration.Op(key,
            value.equals("remove") ? null : Double.valueOf(value));
        try (Admin admin = Admin.create(client(user, bootstrap))) {
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(new ClientQuotaEntity(entity), List.of(op))))
                .all().get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS);
        }
        return "ok";
    }

    static Object describeQuotas(String user, String bootstrap) throws Exception {
        try (Admin admin = Admin.create(client(user, bootstrap))) {
            List<String> answer = new ArrayList<>();
            admin.describeClientQuotas(ClientQuotaFilter.all()).entities()
                .get(DEADLINE.toMillis(), TimeUnit.MILLISECONDS).forEach((entity, values) -> {
                    List<String> names = new ArrayList<>(), quotas = new ArrayList<>();
                    entity.entries().forEach((t, n) -> names.add(t + "=" + (n == null ? "<default>" : n)));
                    values.forEach((k, v) -> quotas.add(k + "=" + v));
                    names.sort(null);
                    quotas.sort(null);
                    answer.add(String.join(",", names) + ":" + String.join(",", quotas));
                });
            answer.sort(null);
            return answer;
        }
    }
}

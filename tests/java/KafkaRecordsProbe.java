import java.io.File;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.AbstractLegacyRecordBatch;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.common.record.FileLogInputStream.FileChannelRecordBatch;
import org.apache.kafka.common.record.FileRecords;
import org.apache.kafka.common.record.Record;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.utils.Utils;

/**
 * A log segment as Apache's kafka-clients reads it (FileRecords, its batches and records: what Kafka's
 * kafka-dump-log.sh iterates), driven by tests/test_dump_log.py: one command a line on stdin, one JSON object a
 * line on stdout.
 *
 *   read PATH    {"size", "validBytes", "batches": [{batch fields, "records": [{record fields}]}]}
 *
 * The values are Kafka's own getters, unformatted; the test compares kmem dump-log's fields with them.
 */
public class KafkaRecordsProbe {
    public static void main(String[] args) throws Exception {
        JsonLines.serve(KafkaRecordsProbe::run);
    }

    static Object run(String command, String[] args) throws Exception {
        if (!command.equals("read"))
            throw new IllegalArgumentException("unknown command " + command);
        List<Object> batches = new ArrayList<>();
        long validBytes = 0;
        try (FileRecords records = FileRecords.open(new File(args[0]), false)) {
            for (FileChannelRecordBatch batch : records.batches()) {
                Map<String, Object> fields = new LinkedHashMap<>();
                fields.put("magic", (int) batch.magic());
                fields.put("baseOffset", batch.baseOffset());
                fields.put("lastOffset", batch.lastOffset());
                fields.put("count", batch.countOrNull());
                fields.put("baseSequence", batch.baseSequence());
                fields.put("lastSequence", batch.lastSequence());
                fields.put("producerId", batch.producerId());
                fields.put("producerEpoch", (int) batch.producerEpoch());
                fields.put("partitionLeaderEpoch", batch.partitionLeaderEpoch());
                fields.put("isTransactional", batch.isTransactional());
                fields.put("isControl", batch.isControlBatch());
                fields.put("deleteHorizonMs", batch.deleteHorizonMs().toString());
                fields.put("position", validBytes);
                fields.put("timestampType", batch.timestampType().toString());
                fields.put("maxTimestamp", batch.maxTimestamp());
                fields.put("size", batch.sizeInBytes());
                fields.put("compresscodec", batch.compressionType().name);
                fields.put("crc", batch.checksum());
                fields.put("isvalid", batch.isValid());
                fields.put("records", records(batch));
                batches.add(fields);
                validBytes += batch.sizeInBytes();
            }
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("size", records.sizeInBytes());
            answer.put("validBytes", validBytes);
            answer.put("batches", batches);
            return answer;
        }
    }

    static List<Object> records(FileChannelRecordBatch batch) {
        List<Object> found = new ArrayList<>();
        for (Record record : batch) {
            Map<String, Object> fields = new LinkedHashMap<>();
            fields.put("offset", record.offset());
            fields.put("timestamp", record.timestamp());
            fields.put("keySize", record.keySize());
            fields.put("valueSize", record.valueSize());
            if (batch.magic() >= RecordBatch.MAGIC_VALUE_V2) {
                fields.put("sequence", record.sequence());
                List<Object> keys = new ArrayList<>();
                for (Header header : record.headers())
                    keys.add(header.key());
                fields.put("headerKeys", keys);
            }
            if (record instanceof AbstractLegacyRecordBatch) {
                fields.put("isValid", ((AbstractLegacyRecordBatch) record).isValid());
                fields.put("crc", ((AbstractLegacyRecordBatch) record).checksum());
            }
            if (batch.isControlBatch()) {
                EndTransactionMarker marker = EndTransactionMarker.deserialize(record);
                fields.put("endTxnMarker", marker.controlType().toString());
                fields.put("coordinatorEpoch", marker.coordinatorEpoch());
            } else {
                fields.put("key", text(record.hasKey() ? record.key() : null));
                fields.put("payload", text(record.hasValue() ? record.value() : null));
            }
            found.add(fields);
        }
        return found;
    }

    static String text(ByteBuffer data) {
        return data == null ? null : new String(Utils.toArray(data), java.nio.charset.StandardCharsets.UTF_8);
    }
}

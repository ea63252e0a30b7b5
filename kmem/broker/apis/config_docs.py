"""What each setting means, as DescribeConfigs v3+ returns it when asked for documentation: Kafka's
documentation of its topic configs (``TopicConfig``) and broker configs, in kmem's words, with what kmem
does differently where it does (``kmem.broker.log.config`` says which settings have no effect here)."""

KEPT_ONLY = " kmem broker keeps this setting but does not act on it"

TOPIC_DOCS = {
    "segment.bytes": "The size of a segment file of the log. Retention deletes whole segments, so larger "
                     "segments mean fewer files but coarser retention.",
    "segment.ms": "After this time a new segment is rolled even if the current one is not full, so that "
                  "retention can delete old data.",
    "segment.jitter.ms": "The largest random jitter subtracted from the scheduled segment roll time, so that "
                         "many segments do not roll at the same moment.",
    "segment.index.bytes": "The size of the index mapping offsets to file positions. The index file is "
                           "allocated at this size and shrunk only when the segment rolls; it rarely needs "
                           "changing.",
    "retention.ms": "The longest time a log keeps its old segments before deleting them, under the 'delete' "
                    "cleanup policy: how soon consumers must read the data. -1 sets no time limit. It is "
                    "independent of segment.ms and segment.bytes, and rolls a new segment once the condition "
                    "is met.",
    "retention.bytes": "The largest size a partition's log may grow to before old segments are deleted, under "
                       "the 'delete' cleanup policy. -1 (the default) sets no size limit. It applies per "
                       "partition (multiply by the partition count for the topic), is independent of "
                       "segment.ms and segment.bytes, and 0 rolls a new segment.",
    "max.message.bytes": "The largest record batch the broker accepts (after compression, when compressed). "
                         "In the current message format records always travel in batches; in older formats an "
                         "uncompressed record is not batched and the limit applies to each record. Consumers "
                         "older than 0.10.2 need a fetch size at least this large.",
    "index.interval.bytes": "How often an entry is added to the offset index: about every this many bytes of "
                            "records (4096 by default). More entries let reads start closer to the offset "
                            "wanted but make the index larger.",
    "message.timestamp.type": "Whether a record's timestamp is its create time (given by the producer) or the "
                              "broker's log append time: CreateTime or LogAppendTime.",
    "message.downconversion.enable": "Whether the broker converts records to an older message format for "
                                     "consumers that need it. When false, such fetches are answered "
                                     "UNSUPPORTED_VERSION. It does not apply to replication to followers.",
    "compression.type": "The final compression codec of the topic's data: gzip, snappy, lz4 or zstd, "
                        "'uncompressed' for none, or 'producer' to keep the codec each producer used.",
    "cleanup.policy": "What happens to old segments: 'delete' (the default) discards them once their "
                      "retention time or size is reached; 'compact' keeps the latest value of each key; both "
                      "may be listed (comma-separated): the log cleaner compacts, retention deletes.",
    "min.insync.replicas": "With acks=all (-1), the fewest replicas that must acknowledge a write for it to "
                           "succeed; when fewer are in sync the producer gets NotEnoughReplicas or "
                           "NotEnoughReplicasAfterAppend. kmem broker is the only replica: only 1 is accepted.",
    "message.timestamp.before.max.ms": "How far before the broker's time a record's timestamp may be. On a "
                                       "CreateTime topic, records with older timestamps are refused; ignored "
                                       "under LogAppendTime. kmem broker checks each batch's first and largest "
                                       "timestamp.",
    "message.timestamp.after.max.ms": "How far after the broker's time a record's timestamp may be. On a "
                                      "CreateTime topic, records with later timestamps are refused; ignored "
                                      "under LogAppendTime. kmem broker checks each batch's first and largest "
                                      "timestamp.",
    "message.timestamp.difference.max.ms": "[Deprecated: use message.timestamp.before.max.ms and "
                                           "message.timestamp.after.max.ms] The largest difference allowed "
                                           "between the broker's time and a record's timestamp, either way, "
                                           "while those two are at their default. On a CreateTime topic, "
                                           "records beyond it are refused; ignored under LogAppendTime.",
    "compression.gzip.level": "The compression level used when compression.type is gzip." + KEPT_ONLY
                              + ": it recompresses at its default level.",
    "compression.lz4.level": "The compression level used when compression.type is lz4." + KEPT_ONLY
                             + ": it recompresses at its default level.",
    "compression.zstd.level": "The compression level used when compression.type is zstd." + KEPT_ONLY
                              + ": it recompresses at its default level.",
    "delete.retention.ms": "How long delete tombstones are kept on a compacted topic; also how long a consumer "
                           "reading from offset 0 has to finish to see a consistent final state.",
    "min.compaction.lag.ms": "The shortest time a record stays uncompacted in the log, on compacted topics.",
    "max.compaction.lag.ms": "The longest time a record may stay ineligible for compaction, on compacted topics.",
    "min.cleanable.dirty.ratio": "How much of a compacted log must be uncompacted ('dirty') before the log "
                                 "cleaner compacts it (0.5: half), which bounds the space wasted by duplicates. "
                                 "With min.compaction.lag.ms or max.compaction.lag.ms set, a log is eligible "
                                 "once the ratio is reached and it has held dirty records for at least "
                                 "min.compaction.lag.ms, or once it has held them for max.compaction.lag.ms.",
    "file.delete.delay.ms": "How long to wait before a deleted segment's files are removed from the file system."
                            + KEPT_ONLY + ": it removes them at once.",
    "flush.messages": "Force an fsync of the log after this many records (1: after each). Replication and the "
                      "operating system's background flushing are the recommended way to durability." + KEPT_ONLY
                      + ": it fsyncs when a segment rolls and at shutdown.",
    "flush.ms": "Force an fsync of the log when this many milliseconds passed since the last one. Replication "
                "and the operating system's background flushing are the recommended way to durability."
                + KEPT_ONLY + ": it fsyncs when a segment rolls and at shutdown.",
    "preallocate": "Whether a new segment's file is allocated on disk at its full size when it is created."
                   + KEPT_ONLY + ": segment files grow as they are written.",
    "message.format.version": "[Deprecated] The message format version the broker appends records in, as an "
                              "inter-broker protocol version such as 0.10.0, 1.1, 2.8 or 3.0. The value is "
                              "ignored (taken as 3.0) when inter.broker.protocol.version is 3.0 or later, as "
                              "on kmem broker, which always writes the current format.",
    "unclean.leader.election.enable": "Whether a replica outside the in-sync set may become leader as a last "
                                      "resort, at the risk of losing data." + KEPT_ONLY
                                      + " (it is the only replica).",
    "leader.replication.throttled.replicas": "The replicas whose replication is throttled on the leader side: "
                                             "a list of partitionId:brokerId, or '*' for all replicas of the "
                                             "topic." + KEPT_ONLY + " (it is the only replica).",
    "follower.replication.throttled.replicas": "The replicas whose replication is throttled on the follower "
                                               "side: a list of partitionId:brokerId, or '*' for all replicas "
                                               "of the topic." + KEPT_ONLY + " (it is the only replica).",
    "remote.storage.enable": "Whether the topic uses tiered storage; once enabled it cannot be disabled yet. "
                             "kmem broker has no tiered storage: only false is accepted.",
    "local.retention.ms": "With tiered storage, how long a local segment is kept before it is deleted; -2 (the "
                          "default) takes retention.ms, and the effective value must not exceed it." + KEPT_ONLY
                          + " (no tiered storage).",
    "local.retention.bytes": "With tiered storage, the largest size a partition's local segments may grow to "
                             "before the oldest are deleted; -2 (the default) takes retention.bytes, and the "
                             "effective value must not exceed it." + KEPT_ONLY + " (no tiered storage).",
    "remote.log.copy.disable": "With tiered storage, makes the topic's tiered data read-only: nothing more is "
                               "uploaded, and data expires by retention.ms and retention.bytes alone." + KEPT_ONLY
                               + " (no tiered storage).",
    "remote.log.delete.on.disable": "With tiered storage, whether the topic's tiered data is deleted when tiered "
                                    "storage is disabled on it; needed to set remote.storage.enable from true to "
                                    "false." + KEPT_ONLY + " (no tiered storage).",
}

BROKER_DOCS = {
    "node.id": "The id of this broker (Kafka's node id in KRaft mode), as clients see it in metadata.",
    "num.partitions": "The number of partitions a topic gets when created without a count.",
    "auto.create.topics.enable": "Whether a topic that does not exist is created when a client asks for it.",
    "producer.id.expiration.ms": "How long a partition keeps an idempotent producer's state after its last "
                                 "write before forgetting it (not while a transaction of it is open). A "
                                 "producer may be forgotten sooner when retention deletes its last write.",
    "producer.id.expiration.check.interval.ms": "How often producers past producer.id.expiration.ms are "
                                                "forgotten.",
    "log.segment.bytes": "The largest size of a segment file (the default of segment.bytes).",
    "log.roll.ms": "The longest time before a new segment is rolled, in milliseconds; when unset, "
                   "log.roll.hours applies (the default of segment.ms).",
    "log.roll.hours": "The longest time before a new segment is rolled, in hours; log.roll.ms takes "
                      "precedence.",
    "log.roll.jitter.ms": "The largest random jitter subtracted from the segment roll time, in milliseconds "
                          "(the default of segment.jitter.ms).",
    "log.retention.ms": "How long a log file is kept before it is deleted, in milliseconds; -1 sets no time "
                        "limit; when unset, log.retention.minutes applies (the default of retention.ms).",
    "log.retention.minutes": "How long a log file is kept before it is deleted, in minutes; log.retention.ms "
                             "takes precedence; when unset, log.retention.hours applies.",
    "log.retention.hours": "How long a log file is kept before it is deleted, in hours; log.retention.ms and "
                           "log.retention.minutes take precedence.",
    "log.retention.bytes": "The largest size of a partition's log before old segments are deleted (the default "
                           "of retention.bytes).",
    "message.max.bytes": "The largest record batch the broker accepts, after compression (the default of the "
                         "topic-level max.message.bytes).",
    "log.message.timestamp.type": "Whether records carry their create time or the broker's log append time: "
                                  "CreateTime or LogAppendTime (the default of message.timestamp.type).",
    "log.message.downconversion.enable": "Whether records are converted to an older message format for "
                                         "consumers that need it; when false such fetches are answered "
                                         "UNSUPPORTED_VERSION (the default of message.downconversion.enable).",
    "log.index.interval.bytes": "How many bytes of records between two entries of the offset index (the "
                                "default of index.interval.bytes).",
    "log.index.size.max.bytes": "The largest size of an offset index, in bytes (the default of "
                                "segment.index.bytes).",
    "compression.type": "The final compression codec of topics: gzip, snappy, lz4, zstd, 'uncompressed', or "
                        "'producer' to keep each producer's codec.",
    "log.cleanup.policy": "The default cleanup policy of topics: 'delete' (retention deletes old segments), "
                          "'compact' (the log cleaner keeps the latest record of each key) or both.",
    "log.cleaner.enable": "Whether the log cleaner runs (compacted topics are not cleaned without it).",
    "log.cleaner.threads": "The cleaner threads: kmem broker has one.",
    "log.cleaner.dedupe.buffer.size": "The memory of the cleaner's key map, in bytes (24 per key): a pass covers "
                                      "as many keys as it holds, more keys take more passes.",
    "log.cleaner.io.buffer.size": "The cleaner's read and write buffer, in bytes.",
    "log.cleaner.io.buffer.load.factor": "How full the cleaner fills its key map before a pass stops mapping.",
    "log.cleaner.io.max.bytes.per.second": "The cleaner's read and write rate limit, in bytes per second.",
    "log.cleaner.backoff.ms": "How long the cleaner waits when no log needs cleaning.",
    "log.cleaner.min.cleanable.ratio": "The default of min.cleanable.dirty.ratio.",
    "log.cleaner.delete.retention.ms": "The default of delete.retention.ms.",
    "log.cleaner.min.compaction.lag.ms": "The default of min.compaction.lag.ms.",
    "log.cleaner.max.compaction.lag.ms": "The default of max.compaction.lag.ms.",
    "min.insync.replicas": "With acks=all, the fewest replicas that must acknowledge a write; kmem broker is "
                           "the only replica, so only 1 is accepted.",
    "producer.ledger.ids": "kmem's own setting: how many producer ids a partition's ledger file holds before it "
                           "becomes a snapshot.",
    "producer.state.cache.entries": "kmem's own setting: how many producers per partition keep their last five "
                                    "batches in memory.",
    "max.request.partition.size.limit": "The most partitions one DescribeTopicPartitions response describes "
                                        "(KIP-966): a client asking for more gets a cursor to the rest.",
}

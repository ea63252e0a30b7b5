"""``kmem dump-log``: Kafka's ``kafka-dump-log.sh`` (``kafka.tools.DumpLogSegments``), offline on the files of a
log directory, with its options and output.

By file suffix: ``.log`` segments (v2 batches, v0/v1 message sets, transaction markers) and KRaft ``.checkpoint``
snapshots, ``.index`` and ``.timeindex`` with the checks Kafka's tool makes against their segment, producer
state ``.snapshot`` files and ``.txnindex`` aborted-transaction indexes; any other file is ignored. The
decoding is kmem's own (``kmem.records``, ``kmem.broker.log``, ``kmem.ledger``, the coordinators' record
schemas). Where Kafka's tool would stop with a stack trace (a corrupt batch header, a corrupt index), this
one reports the file in one line on stderr and goes on with the next file.
"""
import argparse
import os
import sys

from kmem.admin.commands import CommandError, whole_number
from kmem.errors import CorruptRecordError, KmemError

NAME = "dump-log"
HELP = "decode log segments, indexes and producer snapshots offline (kafka-dump-log)"
DESCRIPTION = """\
Decode Kafka log files offline, as kafka-dump-log.sh does: .log segments (and KRaft .checkpoint snapshots),
.index and .timeindex (checked against their segment), producer state .snapshot and .txnindex files; any
other file is ignored. No broker is needed; the files are only read."""
EXIT_CODES = """\
exit codes:
  0  every file was read; what its checks found is in the output as Kafka's tool reports it (index
     mismatches, non-consecutive offsets, "Found N invalid bytes at the end of" a damaged segment)
  1  a file is missing, unreadable or corrupt where Kafka's tool stops (a batch header, an index failing
     --index-sanity-check, a producer snapshot): one line on stderr each, the other files are still read
  2  bad arguments"""
DONE, FILE_ERROR, BAD_ARGUMENTS = 0, 1, 2
INT32_MAX = (1 << 31) - 1
TIMESTAMP_TYPE_NAMES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
CONTROL_TYPE_NAMES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER", 4: "SNAPSHOT_FOOTER",
                      5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}      # Kafka's ControlRecordType
BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"                   # Kafka's BootstrapDirectory


def add_command(commands):
    """Register ``kmem dump-log`` on the ``kmem`` command's subparsers (it takes no broker options)."""
    parser = commands.add_parser(NAME, help=HELP, description=DESCRIPTION, epilog=EXIT_CODES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", required=True, metavar="FILE1,FILE2,...",
                        help="REQUIRED: the comma separated list of data and index log files to be dumped")
    parser.add_argument("--print-data-log", action="store_true",
                        help="print the records' keys and values (UTF-8, as Kafka's StringDecoder); set by the "
                             "decoder options")
    parser.add_argument("--deep-iteration", action="store_true",
                        help="print each record, not only each batch; set by --print-data-log")
    parser.add_argument("--verify-index-only", action="store_true",
                        help="check an index against its segment without printing its entries")
    parser.add_argument("--index-sanity-check", action="store_true",
                        help="only run the check a broker runs on an index at startup to decide whether to "
                             "rebuild it")
    parser.add_argument("--max-message-size", type=whole_number(1, INT32_MAX), default=5 * 1024 * 1024, metavar="SIZE",
                        help="size of the largest batch, read at each index entry (default: 5242880)")
    parser.add_argument("--max-bytes", type=whole_number(1, INT32_MAX), default=INT32_MAX, metavar="SIZE",
                        help="read only the batches within the first SIZE bytes of each .log file")
    parser.add_argument("--skip-record-metadata", action="store_true",
                        help="do not print each record's offset, timestamp, sizes, sequence and headers")
    decoders = parser.add_mutually_exclusive_group()
    decoders.add_argument("--offsets-decoder", action="store_true",
                          help="decode the records as the __consumer_offsets topic's (offset commits and group "
                               "metadata, as JSON)")
    decoders.add_argument("--transaction-log-decoder", action="store_true",
                          help="decode the records as the __transaction_state topic's (transaction metadata)")
    parser.set_defaults(run=run)


def run(args):
    """Dump every file of ``--files``; the exit code."""
    files = [name for name in args.files.split(",") if name]
    if not files:
        print(f"kmem {NAME}: error: --files names no file", file=sys.stderr)
        return BAD_ARGUMENTS
    dump = Dump(args)
    try:
        for path in files:
            dump.file(path)
        dump.report()
        sys.stdout.flush()          # here, so a closed stdout is caught below
    except BrokenPipeError:         # stdout closed early (| head): what was asked for is out
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # no second error at exit's flush
        return DONE
    return FILE_ERROR if dump.failed else DONE


def base_offset_of(path):
    """The base offset a segment file's name starts with (``00000000000000000042.index``: 42)."""
    stem = os.path.basename(path).split(".")[0]
    if not stem.isdigit():
        raise CommandError(f"{path}: not a segment file: its name does not start with a base offset", FILE_ERROR)
    return int(stem)


def segment_of(path, suffix=".log"):
    """The file of the same segment as ``path`` with ``suffix``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, name.split(".")[0] + suffix)


def java_bool(value):
    return "true" if value else "false"


def java_optional_long(value):
    """Java's ``OptionalLong.toString``, which Kafka's tool prints."""
    return "OptionalLong.empty" if value is None else f"OptionalLong[{value}]"


def utf8(data):
    """Kafka's StringDecoder: the bytes as UTF-8, malformed sequences replaced."""
    return None if data is None else bytes(data).decode("utf-8", "replace")


class Dump:
    """One run over ``--files``: what is printed per file, and the checks' findings reported at the end."""

    def __init__(self, args):
        self.args = args
        self.print_data = args.print_data_log or args.offsets_decoder or args.transaction_log_decoder
        self.deep = args.deep_iteration or self.print_data
        if args.offsets_decoder:
            from kmem.admin.coordinator_records import parse_offsets_record as parse
            self.parse = parse
        elif args.transaction_log_decoder:
            from kmem.admin.coordinator_records import parse_transaction_record as parse
            self.parse = parse
        else:
            self.parse = lambda record: (utf8(record.key), utf8(record.value))
        # per file (absolute path), in the order found
        self.index_mismatches, self.non_consecutive = {}, {}
        self.time_mismatches, self.out_of_order, self.not_found = {}, {}, {}
        self.failed = False

    def file(self, path):
        print(f"Dumping {path}")
        dumpers = {".log": self.log, ".checkpoint": self.checkpoint, ".index": self.index,
                   ".timeindex": self.time_index, ".snapshot": self.producer_snapshot, ".txnindex": self.txn_index}
        name = os.path.basename(path)
        dumper = dumpers.get(name[name.rfind("."):] if "." in name else None)
        if dumper is None:
            print(f"Ignoring unknown file {path}", file=sys.stderr)
            return
        try:
            os.stat(path)
            dumper(path)
        except BrokenPipeError:     # stdout closed: the run ends (``run``)
            raise
        except OSError as exc:
            self.error(f"{exc.filename or path}: {exc.strerror or exc}")
        except (CommandError, KmemError) as exc:
            self.error(str(exc))

    def error(self, message):
        sys.stdout.flush()          # the error follows what was printed of the file
        print(f"kmem {NAME}: error: {message}", file=sys.stderr)
        self.failed = True

    # -- segments ---------------------------------------------------------------------------------------------

    def log(self, path):
        print(f"Log starting offset: {base_offset_of(path)}")
        self.batches(path)

    def checkpoint(self, path):
        """A KRaft snapshot (``<end offset>-<epoch>.checkpoint``): record batches, as a segment."""
        name = os.path.basename(path)
        if name == BOOTSTRAP_CHECKPOINT:
            print("KRaft bootstrap snapshot")
        else:
            offset, _, epoch = name[:-len(".checkpoint")].partition("-")
            if not (offset.isdigit() and epoch.isdigit()):
                raise CommandError(f"{path}: not a KRaft snapshot: its name is not <offset>-<epoch>.checkpoint",
                                   FILE_ERROR)
            print(f"Snapshot end offset: {int(offset)}, epoch: {int(epoch)}")
        self.batches(path)

    def batches(self, path):
        from kmem.records import FileRecords

        max_bytes = self.args.max_bytes
        with FileRecords(path, 0, max_bytes) as records:
            valid_bytes, last_offset = 0, None
            try:
                for batch in records.batches():
                    print(batch_line(batch))
                    if self.deep:
                        last_offset = self.records(path, batch, last_offset)
                    valid_bytes += batch.size_in_bytes
            except CorruptRecordError as exc:
                self.error(f"{path}: {exc}")
            trailing = records.size_in_bytes - valid_bytes
            if trailing > 0 and max_bytes == INT32_MAX:
                print(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}")

    def records(self, path, batch, last_offset):
        """Print a batch's records; returns the last offset seen, for the non-consecutive offsets check."""
        metadata = not self.args.skip_record_metadata
        timestamp_type = TIMESTAMP_TYPE_NAMES[batch.timestamp_type]
        for record, entry in records_and_entries(batch):
            if last_offset is not None and record.offset != last_offset + 1:
                self.non_consecutive.setdefault(os.path.abspath(path), []).append((last_offset, record.offset))
            last_offset = record.offset
            line, prefix = "", "| "
            if metadata:
                line += (f"{prefix}offset: {record.offset} {timestamp_type}: {record.timestamp} "
                         f"keySize: {size_of(record.key)} valueSize: {size_of(record.value)}")
                prefix = " "
                if batch.magic >= 2:
                    line += (f" sequence: {batch.sequence_of(record.offset)} "
                             f"headerKeys: [{','.join(key for key, _ in record.headers)}]")
                else:
                    # Kafka's tool prints this closing brace (a typo in its format); kept for its readers
                    line += f" isValid: {java_bool(entry.is_valid())} crc: {entry.crc}}}"
                if batch.is_control_batch:
                    line += control_text(batch)
            if self.print_data and not batch.is_control_batch:
                key, payload = self.parse(record)
                if key is not None:
                    line += f"{prefix}key: {key}"
                if payload is not None:
                    line += f" payload: {payload}"
            print(line)
        return last_offset

    # -- indexes ----------------------------------------------------------------------------------------------

    def index(self, path):
        from kmem.broker.log.index import OffsetIndex
        from kmem.records import FileRecords

        base = base_offset_of(path)
        with FileRecords(segment_of(path)) as records:
            index = OffsetIndex(path, base, 0, writable=False, read_only=True)
            if index.entries == 0:
                print(f"{path} is empty.")
                return
            if self.args.index_sanity_check:
                index.sanity_check(records.size_in_bytes)
                print(f"{path} passed sanity check.")
                return
            for i, (relative, position) in enumerate(index.iter_entries()):
                offset = base + relative
                if offset == base and i > 0:    # the zeros of a preallocated file a crash left behind
                    return
                batch = first_batch_at(records, position, self.args.max_message_size)
                log_offset = -1 if batch is None else batch.last_offset
                if log_offset != offset:
                    self.index_mismatches.setdefault(os.path.abspath(path), []).append((offset, log_offset))
                if not self.args.verify_index_only:
                    print(f"offset: {offset} position: {position}")

    def time_index(self, path):
        from kmem.broker.log.index import NO_TIMESTAMP, OffsetIndex, TimeIndex
        from kmem.records import FileRecords

        base = base_offset_of(path)
        with FileRecords(segment_of(path)) as records:
            index_path = segment_of(path, ".index")
            offsets = OffsetIndex(index_path, base, 0, writable=False, read_only=True) \
                if os.path.exists(index_path) else None
            times = TimeIndex(path, base, 0, writable=False, read_only=True)
            if self.args.index_sanity_check:
                next_offset = base
                for batch in records.batches():
                    next_offset = batch.next_offset
                times.sanity_check(next_offset)
                print(f"{path} passed sanity check.")
                return
            where = os.path.abspath(path)
            previous = NO_TIMESTAMP
            for i, (timestamp, relative) in enumerate(times.iter_entries()):
                offset = base + relative
                if offset == base and i > 0:
                    return
                position = offsets.lookup(offset)[1] if offsets is not None else 0
                batch = first_batch_reaching(records, position, offset)
                if batch is None or batch.last_offset != offset:
                    self.not_found.setdefault(where, []).append((offset, -1 if batch is None else batch.last_offset))
                else:
                    max_timestamp = max([NO_TIMESTAMP, *(record.timestamp for record in batch)])
                    if max_timestamp != timestamp:
                        self.time_mismatches.setdefault(where, []).append((timestamp, max_timestamp))
                    if previous >= timestamp:
                        self.out_of_order.setdefault(where, []).append((timestamp, previous))
                if not self.args.verify_index_only:
                    print(f"timestamp: {timestamp} offset: {offset}")
                previous = timestamp

    def txn_index(self, path):
        from kmem.broker.log.txn_index import CURRENT_VERSION, TransactionIndex

        for txn in TransactionIndex(path, base_offset_of(path)).entries():
            print(f"version: {CURRENT_VERSION} producerId: {txn.producer_id} firstOffset: {txn.first_offset} "
                  f"lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}")

    # -- producer state -----------------------------------------------------------------------------------------

    def producer_snapshot(self, path):
        from kmem.broker.log.producer_state import ProducerState
        from kmem.ledger import read_snapshot

        for entry in read_snapshot(path):
            state = ProducerState.from_entry(entry)
            txn = state.current_txn_first_offset
            line = (f"producerId: {state.producer_id} producerEpoch: {state.epoch} "
                    f"coordinatorEpoch: {state.coordinator_epoch} "
                    f"currentTxnFirstOffset: {java_optional_long(txn if txn >= 0 else None)} "
                    f"lastTimestamp: {state.timestamp} ")
            if state.batches:
                batch = state.batches[0]
                line += (f"firstSequence: {batch.first_seq} lastSequence: {batch.last_seq} "
                         f"lastOffset: {batch.last_offset} offsetDelta: {batch.offset_delta} "
                         f"timestamp: {batch.timestamp}")
            print(line)

    # -- the checks' findings ---------------------------------------------------------------------------------

    def report(self):
        """What the checks found, on stderr, in Kafka's words."""
        def pairs(found, title, line):
            for path, items in found.items():
                print(title.format(path), file=sys.stderr)
                for item in items:
                    print(line.format(*item), file=sys.stderr)

        pairs(self.index_mismatches, "Mismatches in :{}", "  Index offset: {}, log offset: {}")
        pairs(self.time_mismatches, "Found timestamp mismatch in :{}", "  Index timestamp: {}, log timestamp: {}")
        pairs(self.out_of_order, "Found out of order timestamp in :{}",
              "  Index timestamp: {}, Previously indexed timestamp: {}")
        pairs(self.not_found, "The following indexed offsets are not found in the log.",
              "Indexed offset: {}, found log offset: {}")
        pairs(self.non_consecutive, "Non-consecutive offsets in {}", "  {} is followed by {}")


def batch_line(batch):
    """Kafka's line for a batch (v2) or a shallow v0/v1 entry."""
    from kmem.broker.log.cleaner import DELETE_HORIZON_FLAG
    from kmem.records.codecs import codec_name

    if batch.magic >= 2:
        horizon = batch.base_timestamp if batch.attributes & DELETE_HORIZON_FLAG else None
        head = (f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} count: {batch.records_count} "
                f"baseSequence: {batch.base_sequence} lastSequence: {batch.last_sequence} "
                f"producerId: {batch.producer_id} producerEpoch: {batch.producer_epoch} "
                f"partitionLeaderEpoch: {batch.partition_leader_epoch} "
                f"isTransactional: {java_bool(batch.is_transactional)} isControl: {java_bool(batch.is_control_batch)} "
                f"deleteHorizonMs: {java_optional_long(horizon)}")
    else:
        head = f"offset: {batch.last_offset}"
    return (f"{head} position: {batch.file_position} {TIMESTAMP_TYPE_NAMES[batch.timestamp_type]}: "
            f"{batch.max_timestamp} size: {batch.size_in_bytes} magic: {batch.magic} "
            f"compresscodec: {codec_name(batch.compression)} crc: {batch.crc} isvalid: {java_bool(batch.is_valid())}")


def records_and_entries(batch):
    """``(record, entry)`` of a batch: the entry of a v0/v1 record is its own message (with its CRC), None in v2."""
    if batch.magic >= 2:
        return ((record, None) for record in batch)
    if not batch.is_compressed:
        return ((record, batch) for record in batch)
    return zip(batch, batch.inner_entries())


def size_of(data):
    return -1 if data is None else len(data)


def control_text(batch):
    """What Kafka's tool prints of a control record: the transaction marker, else its control type."""
    kind = batch.control_type
    if kind is None:            # an empty control batch (its marker cleaned away) prints nothing
        return ""
    if kind in (0, 1):
        return f" endTxnMarker: {CONTROL_TYPE_NAMES[kind]} coordinatorEpoch: {batch.coordinator_epoch}"
    return f" controlType: {CONTROL_TYPE_NAMES.get(kind, 'UNKNOWN')}({int(kind)})"


def first_batch_at(records, position, max_size):
    """The batch starting at ``position`` if it is complete within ``max_size`` bytes, else None."""
    if position > records.size_in_bytes:
        return None
    try:
        return next(iter(records.slice(position, max_size)), None)
    except CorruptRecordError:
        return None


def first_batch_reaching(records, position, offset):
    """The first batch from ``position`` on whose last offset is at least ``offset``, or None."""
    if position > records.size_in_bytes:
        return None
    try:
        return next((batch for batch in records.batches(position) if batch.last_offset >= offset), None)
    except CorruptRecordError:
        return None

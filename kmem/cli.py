"""The ``kmem`` command line: ``kmem broker`` (a single-node Kafka broker) and ``kmem pipeline`` (Spark
jobs over Kafka log directories; ``kmem pipeline demo``, run by ``make run``, puts a generated sample
log directory through every job on embedded local Spark and checks the outputs against each other)."""
import argparse
import gc
import importlib.util
import json
import logging
import os
import sys

DESCRIPTION = """\
kmem broker runs a Kafka broker (no JVM) on a log directory; kmem pipeline runs Spark jobs over Kafka
log directories; kmem handover kraft hands a stopped broker's log directory over to a Kafka KRaft node; kmem console serves
a web console over a broker. 'kmem COMMAND --help' tells more."""

BROKER_DESCRIPTION = """\
Run a single-node Kafka broker on a log directory until SIGTERM or SIGINT (Ctrl-C), for any Kafka
client. It logs "listening on HOST:PORT" for each listener when ready; the log directory is Kafka 3.9's.

Settings take Kafka's names: from a server.properties file (--config), then --override. The listeners
come from the file's listeners (several at once, each with its security protocol; a controller
listener is ignored), else 127.0.0.1:9092; --host and --port replace the address of one listener."""

BROKER_EXIT_CODES = """\
exit codes:
  0  stopped by SIGTERM or SIGINT, checkpoints written
  2  not started: a bad setting, log directory or port (one line says which)"""

EXIT_CODES = """\
exit codes:
  0  done: every segment was processed (demo: every check passed)
  1  partial success: the job ran, but the segments or partitions listed could not be processed
     (demo: a check failed)
  2  nothing done: bad argument, missing input directory, refused output directory, no Java runtime
  3  nothing to do: no Kafka log segments under the input directory (a warning says so)"""

DONE, PARTIAL, FAILED, NOTHING_TO_DO = 0, 1, 2, 3
# kmem.admin.commands: Kafka's tools
ADMIN_COMMANDS = ("topics", "groups", "produce", "consume", "configs", "offsets", "transactions", "dump-log")
# what kmem pipeline imports, the spark extra of pyproject.toml
SPARK_EXTRA = ("pyspark", "pyarrow", "matplotlib", "tqdm")


def main(argv=None):
    import kmem
    from kmem.errors import KmemError

    parser = _parser(kmem.__version__)
    args = parser.parse_args(argv)
    if args.command in ("broker", "scram", "handover", "console", *ADMIN_COMMANDS):
        return args.run(args)
    _log_warnings_to_stderr()
    missing = [name for name in SPARK_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        print(f"kmem: error: kmem pipeline needs the spark extra ({', '.join(SPARK_EXTRA)}), and "
              f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: pip install 'kmem[spark]'",
              file=sys.stderr)
        return FAILED
    try:
        return PIPELINE_JOBS[args.job](args)
    except KmemError as exc:        # checked before Spark starts: one line, no traceback
        print(f"kmem: error: {exc}", file=sys.stderr)
        return FAILED


def _parser(version):
    from kmem.admin.commands import add_commands as add_admin_commands
    from kmem.admin.handover import add_command as add_handover_command
    from kmem.console import add_command as add_console_command

    def parser_of(add, name, **kwargs):
        return add(name, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    parser = argparse.ArgumentParser(prog="kmem", description=DESCRIPTION,
                                     epilog=f"kmem broker's {BROKER_EXIT_CODES}\n\nkmem pipeline's {EXIT_CODES}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kmem {version}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_broker_command(commands)
    add_scram_command(commands)
    add_admin_commands(commands)
    add_handover_command(commands)
    add_console_command(commands)
    pipeline = parser_of(commands.add_parser, "pipeline", help="Spark jobs over Kafka log directories",
                         description="Spark jobs over Kafka log directories (<topic>-<partition>/<20-digit "
                                     "offset>.log), on embedded local Spark or on the cluster given by --master. "
                                     "Spark needs a Java 17+ runtime.")
    jobs = pipeline.add_subparsers(dest="job", required=True)

    def job(name, help_text):
        sub = parser_of(jobs.add_parser, name, help=help_text, description=help_text)
        sub.add_argument("--master", help="Spark master URL, e.g. spark://HOST:7077 (default: local[*], embedded; "
                                             "in a driver started by spark-submit, its --master)")
        sub.add_argument("--no-progress", action="store_true", help="no progress bar")
        return sub

    demo = job("demo", "generate a sample log directory and run every job on it")
    demo.add_argument("--output", default="out/demo",
                      help="where the sample and the results go: a new or empty directory, or a previous "
                           "demo output (only the demo's own files are replaced)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batches-per-partition", type=_positive, default=40)

    report = job("report", "counts, bytes, formats and producer-id cardinality per partition")
    report.add_argument("input", help="Kafka log directory")
    report.add_argument("--output", help="directory for report.json and report.png (apart from the input)")
    report.add_argument("--json", action="store_true", help="print the result as JSON")

    ledger = job("ledger", "rebuild producer state and write a kmem ledger per partition")
    ledger.add_argument("input", help="Kafka log directory")
    ledger.add_argument("output", help="directory for one ledger per partition: a new or empty directory apart from "
                                       "the input, or a previous ledger output (only its ledgers are replaced)")
    ledger.add_argument("--json", action="store_true", help="print the result as JSON")

    convert = job("convert", "down-convert every segment to an older message format")
    convert.add_argument("input", help="Kafka log directory")
    convert.add_argument("output", help="directory for the converted segments: a new or empty directory apart from "
                                        "the input, or a previous convert output (only its partitions are replaced)")
    convert.add_argument("--to-magic", type=int, choices=(0, 1), default=1, help="message format to write")
    convert.add_argument("--chunk-size", type=_positive, default=128 << 10, help="bytes converted at a time per task")
    convert.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def _log_warnings_to_stderr():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kmem: warning: %(message)s"))
    logger = logging.getLogger("kmem")
    logger.addHandler(handler)
    logger.propagate = False


def _session(args):
    from kmem.spark import get_session
    from kmem.spark.session import quiet_jvm_start

    with quiet_jvm_start():
        spark = get_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _progress(spark, args, description):
    import contextlib

    from kmem.spark.progress import stage_progress

    return contextlib.nullcontext() if args.no_progress else stage_progress(spark, description)


def _has_segments(args):
    """Checked before Spark starts: raises for a missing directory, warns when it holds no segments."""
    from kmem.spark.segments import list_segments

    return bool(list_segments(args.input))


def _run_report(args):
    from kmem.spark import jobs
    from kmem.spark.outputs import check_apart

    if args.output is not None:
        check_apart(args.output, args.input, "report output", may_hold=True)
    if not _has_segments(args):
        return NOTHING_TO_DO
    spark = _session(args)
    with _progress(spark, args, "report"):
        result = jobs.report(spark, args.input, args.output)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return _outcome(len(result["corrupt_segments"]), "segments could not be read to the end (CORRUPT above)")


def _run_ledger(args):
    from kmem.spark import jobs
    from kmem.spark.outputs import prepare_partition_output

    if not _has_segments(args):
        return NOTHING_TO_DO
    prepare_partition_output(args.output, "ledger", args.input)     # before Spark starts
    spark = _session(args)
    with _progress(spark, args, "ledger"):
        result = jobs.ledger(spark, args.input, args.output)
    failed = [p for p in result["partitions"] if p["error"]]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for p in result["partitions"]:
            name = f"{p['topic']}-{p['partition']}"
            if p["error"]:
                print(f"FAILED {name}: {p['error']}")
            else:
                print(f"{name:<24}{p['producer_ids']:>6} producer ids  {p['snapshot'] or '(no producers)'}")
        print(f"wrote {len(result['partitions']) - len(failed)} of {len(result['partitions'])} ledgers "
              f"under {os.path.abspath(args.output)}")
    return _outcome(len(failed), f"of {len(result['partitions'])} partitions have no ledger (FAILED above)")


def _run_convert(args):
    from kmem.spark import jobs
    from kmem.spark.outputs import prepare_partition_output

    if not _has_segments(args):
        return NOTHING_TO_DO
    prepare_partition_output(args.output, "convert", args.input)    # before Spark starts
    spark = _session(args)
    with _progress(spark, args, f"convert to v{args.to_magic}"):
        result = jobs.convert(spark, args.input, args.output, args.to_magic, args.chunk_size)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for error in result["errors"]:
            print(f"NOT CONVERTED {error['topic']}-{error['partition']}/{error['segment']}: {error['error']}")
        totals = result["totals"]
        print(f"converted {result['segments']} of {result['segments_found']} segments to magic {args.to_magic}: "
              f"{totals['records_converted']} records, {totals['input_bytes']} bytes in, "
              f"{totals['output_bytes']} bytes out, under {os.path.abspath(args.output)}")
    return _outcome(len(result["errors"]), f"of {result['segments_found']} segments were not converted "
                                           "(NOT CONVERTED above)")


def _outcome(failures, what):
    if not failures:
        return DONE
    print(f"partial success: {failures} {what}", file=sys.stderr)
    return PARTIAL


def _run_demo(args):
    from kmem.spark import demo

    demo.prepare_output(args.output)        # refuse a directory it did not write before Spark starts
    spark = _session(args)
    result = demo.run_demo(spark, args.output, seed=args.seed, batches_per_partition=args.batches_per_partition,
                           progress=lambda name: _progress(spark, args, name))
    print_report(result["report"])
    for check, passed in result["checks"].items():
        print(f"  [{'ok' if passed else 'FAILED'}] {check}")
    print(f"outputs in {os.path.abspath(args.output)} (report.json, report.png, ledger/, converted-v1/)")
    return DONE if all(result["checks"].values()) else PARTIAL


PIPELINE_JOBS = {"demo": _run_demo, "report": _run_report, "ledger": _run_ledger, "convert": _run_convert}


def add_broker_command(commands):
    """``kmem broker``: a single-node Kafka broker serving a log directory until SIGTERM or SIGINT."""
    broker = commands.add_parser("broker", help="run a single-node Kafka broker on a log directory",
                                 description=BROKER_DESCRIPTION, epilog=BROKER_EXIT_CODES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    broker.add_argument("--log-dir", help="the broker's log directory, created if missing (default: log.dirs of "
                                          "--config)")
    broker.add_argument("--port", type=int, help="port to listen on (default: the port of --config's listeners, "
                                                 "else 9092; 0: any free port)")
    broker.add_argument("--host", help="address to listen on (default: the host of --config's listeners, else "
                                       "127.0.0.1; 0.0.0.0: every interface)")
    broker.add_argument("--config", metavar="FILE", help="a server.properties file (settings kmem does not use are "
                                                         "listed and ignored)")
    broker.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting under Kafka's name, e.g. num.partitions=3; repeatable")
    broker.add_argument("--jaas", metavar="FILE",
                        help="a JAAS file (KafkaServer { ... };) for the SASL listeners, as Kafka's "
                             "-Djava.security.auth.login.config=FILE (also read from KAFKA_OPTS); sasl.jaas.config "
                             "settings win over it")
    broker.set_defaults(run=_run_broker)


SCRAM_DESCRIPTION = """\
Add (or replace) SCRAM users of a kmem broker's log directory before it starts, as Kafka's
'kafka-storage format --add-scram' does: their salted credentials (never the password) go to the
log directory's scram-credentials.json; a broker started on it authenticates them with SCRAM-SHA-256
or SCRAM-SHA-512 on a SASL listener (sasl.enabled.mechanisms). The broker must be stopped (while it
runs, its admin API manages users: AlterUserScramCredentials, KIP-554, as kafka-configs sends it)."""


SCRAM_EXIT_CODES = """\
exit codes:
  0  the users were added
  2  nothing added: a bad --add-scram, log directory, or a broker running on it (one line says which)"""


def add_scram_command(commands):
    """``kmem scram``: SCRAM users for a log directory, with kafka-storage's ``--add-scram`` syntax."""
    scram = commands.add_parser("scram", help="add SCRAM users to a log directory before the broker starts",
                                description=SCRAM_DESCRIPTION, epilog=SCRAM_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    scram.add_argument("--log-dir", required=True, help="the broker's log directory, created if missing")
    scram.add_argument("--add-scram", "-S", action="append", required=True, metavar="CREDENTIAL",
                       help="SCRAM-SHA-256=[name=alice,password=alice-secret] (also iterations=N, or salt=... and "
                            "saltedpassword=... in base64); repeatable")
    scram.set_defaults(run=_run_scram)


def _run_scram(args):
    import fcntl

    from kmem.broker.log.manager import LOCK_FILE
    from kmem.broker.security import ScramCredentialStore, parse_add_scram
    from kmem.errors import KmemError

    try:
        users = [parse_add_scram(value) for value in args.add_scram]
        if os.path.lexists(args.log_dir) and not os.path.isdir(args.log_dir):
            print(f"kmem scram: log directory {args.log_dir} is not a directory", file=sys.stderr)
            return FAILED
        os.makedirs(args.log_dir, exist_ok=True)
        with open(os.path.join(args.log_dir, LOCK_FILE), "ab") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"kmem scram: log directory {args.log_dir} is in use by a running broker: stop it first",
                      file=sys.stderr)
                return FAILED
            store = ScramCredentialStore(args.log_dir)
            for mechanism, user, credential in users:
                store.add(mechanism, user, credential)
    except (KmemError, OSError) as e:
        print(f"kmem scram: {e}", file=sys.stderr)
        return FAILED
    for mechanism, user, credential in users:
        print(f"added {mechanism} user {user} ({credential.iterations} iterations) to {store.path}")
    return 0


def _broker_settings(args):
    """``(log_dir, properties, host, port)`` from --config, --override, --log-dir, --host and --port."""
    from kmem.broker.security import JAAS_FILE_SETTING
    from kmem.broker.settings import is_known_setting, log_dir_of, read_properties_file
    from kmem.errors import ConfigError

    log_dirs = ("log.dirs", "log.dir")
    properties = read_properties_file(args.config) if args.config else {}
    ignored = sorted(name for name in properties if not is_known_setting(name) and name not in log_dirs)
    if ignored:
        logging.getLogger("kmem.broker").warning("%s: ignoring settings kmem broker does not use: %s", args.config,
                                                 ", ".join(ignored))
    properties = {name: value for name, value in properties.items() if name not in ignored}
    for override in args.override:
        name, sep, value = override.partition("=")
        if not sep:
            raise ConfigError(f"--override takes key=value, not {override!r}")
        properties[name.strip()] = value.strip()
    jaas = args.jaas or _jaas_file_of_kafka_opts(os.environ.get("KAFKA_OPTS", ""))
    if jaas:
        properties[JAAS_FILE_SETTING] = jaas
    log_dir = args.log_dir or log_dir_of(properties)
    if not log_dir:
        raise ConfigError("--log-dir (or log.dirs in --config) is required")
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise ConfigError(f"log directory {log_dir} is not a directory")
    properties = {name: value for name, value in properties.items() if name not in log_dirs}
    port = args.port if args.port is not None or "listeners" in properties else DEFAULT_BROKER_PORT
    return log_dir, properties, args.host, port


DEFAULT_BROKER_PORT = 9092     # Kafka's
SIGNAL_CHECK_SECONDS = 0.5


def _jaas_file_of_kafka_opts(kafka_opts):
    """The JAAS file a Kafka start script's ``KAFKA_OPTS`` names (``-Djava.security.auth.login.config=FILE``; the
    last one, as the JVM takes it), or None."""
    import shlex

    from kmem.broker.security import JAAS_FILE_SETTING

    prefix = f"-D{JAAS_FILE_SETTING}="
    try:
        words = shlex.split(kafka_opts)
    except ValueError:
        words = kafka_opts.split()
    files = [word[len(prefix):] for word in words if word.startswith(prefix)]
    return files[-1] if files else None


def _run_broker(args):
    import errno
    import signal
    import threading

    from kmem.broker import Broker
    from kmem.errors import KmemError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("kmem.broker")
    # Taken before the listeners open: a client (or a test) that saw "listening on" may stop the broker at once,
    # and a signal during start-up stops it once started, with its checkpoints written.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    broker = None
    try:
        log_dir, properties, host, port = _broker_settings(args)
        broker = Broker(log_dir, port, host=host, properties=properties)
        broker.start()
    except OSError as e:
        if e.errno != errno.EADDRINUSE or broker is None:
            print(f"kmem broker: {e}", file=sys.stderr)
            return FAILED
        print(f"kmem broker: cannot listen on {e.filename}: the address is in use (another broker?): stop it, or "
              "choose another port with --port", file=sys.stderr)
        return FAILED
    except KmemError as e:
        print(f"kmem broker: {e}", file=sys.stderr)
        return FAILED
    # This process is the broker: what starting it allocated (modules, generated codecs) lives as long as
    # it does, so the garbage collector's full passes skip it (a pass over it took 10-30 ms of latency
    # with a thousand clients connected).
    gc.freeze()
    # Short waits: a signal the kernel gives another of the broker's threads does not interrupt this one's wait,
    # and Python runs its handler only once this thread is back in the interpreter.
    while not stop.wait(SIGNAL_CHECK_SECONDS):
        pass
    log.info("shutting down")
    broker.close()
    return 0


def print_report(result, stream=None):
    """The report as a table, its first column as wide as the longest topic-partition name."""
    stream = stream or sys.stdout
    names = [f"{p['topic']}-{p['partition']}" for p in result["partitions"]]
    width = max([len("partition"), *map(len, names)]) + 2
    print(f"{'partition':<{width}}{'records':>9}{'batches':>9}{'bytes':>11}{'unread':>8}{'pids':>6}{'bloom m/k':>14}"
          "  formats", file=stream)
    for name, p in zip(names, result["partitions"]):
        shape = p["bloom_shape"]
        formats = ", ".join(f"{kind}:{count}" for kind, count in sorted(p["batches_by_format"].items()))
        bloom = f"{shape['bits']}/{shape['hash_functions']}"
        print(f"{name:<{width}}{p['records']:>9}{p['batches']:>9}{p['bytes']:>11}"
              f"{p['unread_bytes']:>8}{p['producer_ids']:>6}{bloom:>14}  {formats}", file=stream)
    totals = result["totals"]
    print(f"{'total':<{width}}{totals['records']:>9}{totals['batches']:>9}{totals['bytes']:>11}"
          f"{totals['unread_bytes']:>8}{totals['producer_ids']:>6}", file=stream)
    for corrupt in result["corrupt_segments"]:
        print(f"CORRUPT {corrupt['topic']}-{corrupt['partition']}/{corrupt['segment']}: {corrupt['unread_bytes']} "
              f"bytes unread from byte {corrupt['position']}: {corrupt['error']}", file=stream)


if __name__ == "__main__":
    sys.exit(main())

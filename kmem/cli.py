"""``kmem`` command line. ``kmem pipeline demo`` is the main job: a generated sample log directory run
through every pipeline job on embedded local Spark, with the outputs checked against each other."""
import argparse
import json
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kmem", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    pipeline = commands.add_parser("pipeline", help="Spark jobs over Kafka log directories")
    jobs = pipeline.add_subparsers(dest="job", required=True)

    def job(name, help_text):
        sub = jobs.add_parser(name, help=help_text)
        sub.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
        sub.add_argument("--no-progress", action="store_true", help="no progress bar")
        return sub

    demo = job("demo", "generate a sample log directory and run every job on it")
    demo.add_argument("--output", default="out/demo", help="where the sample and the results go")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batches-per-partition", type=int, default=40)

    report = job("report", "counts, bytes, formats and producer-id cardinality per partition")
    report.add_argument("input")
    report.add_argument("--output", help="directory for report.json and report.png")

    ledger = job("ledger", "rebuild producer state and write a kmem ledger per partition")
    ledger.add_argument("input")
    ledger.add_argument("output")

    convert = job("convert", "down-convert every segment to an older message format")
    convert.add_argument("input")
    convert.add_argument("output")
    convert.add_argument("--to-magic", type=int, choices=(0, 1), default=1)
    convert.add_argument("--chunk-size", type=int, default=128 << 10, help="bytes converted at a time per task")

    add_broker_command(commands)

    args = parser.parse_args(argv)
    if args.command == "broker":
        return args.run(args)
    return PIPELINE_JOBS[args.job](args)


def _session(args):
    from kmem.spark import get_session

    spark = get_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _progress(spark, args, description):
    import contextlib

    from kmem.spark.progress import stage_progress

    return contextlib.nullcontext() if args.no_progress else stage_progress(spark, description)


def _run_report(args):
    from kmem.spark import jobs

    spark = _session(args)
    with _progress(spark, args, "report"):
        result = jobs.report(spark, args.input, args.output)
    print_report(result)
    return 1 if result["corrupt_segments"] else 0


def _run_ledger(args):
    from kmem.spark import jobs

    spark = _session(args)
    with _progress(spark, args, "ledger"):
        result = jobs.ledger(spark, args.input, args.output)
    print(json.dumps(result, indent=2))
    return 1 if any(p["error"] for p in result["partitions"]) else 0


def _run_convert(args):
    from kmem.spark import jobs

    spark = _session(args)
    with _progress(spark, args, f"convert to v{args.to_magic}"):
        result = jobs.convert(spark, args.input, args.output, args.to_magic, args.chunk_size)
    print(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


def _run_demo(args):
    from kmem.spark import demo

    spark = _session(args)
    result = demo.run_demo(spark, args.output, seed=args.seed, batches_per_partition=args.batches_per_partition,
                           progress=lambda name: _progress(spark, args, name))
    print_report(result["report"])
    for check, passed in result["checks"].items():
        print(f"  [{'ok' if passed else 'FAILED'}] {check}")
    print(f"outputs in {os.path.abspath(args.output)} (report.json, report.png, ledger/, converted-v1/)")
    return 0 if all(result["checks"].values()) else 1


PIPELINE_JOBS = {"demo": _run_demo, "report": _run_report, "ledger": _run_ledger, "convert": _run_convert}


def add_broker_command(commands):
    """``kmem broker``: a single-node Kafka broker serving a log directory until SIGTERM or SIGINT."""
    broker = commands.add_parser("broker", help="run a single-node Kafka broker on a log directory")
    broker.add_argument("--log-dir", help="the broker's log directory (default: log.dirs of --config)")
    broker.add_argument("--port", type=int, default=9092)
    broker.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    broker.add_argument("--config", help="a server.properties file (settings kmem does not know are ignored)")
    broker.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting under Kafka's name; repeatable")
    broker.set_defaults(run=_run_broker)


def _run_broker(args):
    import logging
    import signal
    import threading

    from kmem.broker import Broker
    from kmem.broker.settings import KNOWN_SETTINGS, read_properties_file
    from kmem.errors import ConfigError, KmemError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("kmem.broker")
    try:
        properties = read_properties_file(args.config) if args.config else {}
        log_dir = args.log_dir or properties.get("log.dirs", properties.get("log.dir", "")).split(",")[0]
        ignored = sorted(name for name in properties if name not in KNOWN_SETTINGS)
        if ignored:
            log.warning("%s: ignoring settings kmem broker does not use: %s", args.config, ", ".join(ignored))
        properties = {name: value for name, value in properties.items() if name in KNOWN_SETTINGS}
        for override in args.override:
            name, sep, value = override.partition("=")
            if not sep:
                raise ConfigError(f"--override takes key=value, not {override!r}")
            properties[name.strip()] = value.strip()
        if not log_dir:
            raise ConfigError("--log-dir (or log.dirs in --config) is required")
        broker = Broker(log_dir, args.port, host=args.host, properties=properties)
        broker.start()
    except (KmemError, OSError) as e:
        print(f"kmem broker: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    log.info("shutting down")
    broker.close()
    return 0


def print_report(result, stream=None):
    stream = stream or sys.stdout
    header = f"{'partition':<16}{'records':>9}{'batches':>9}{'bytes':>11}{'pids':>6}{'bloom m/k':>14}  formats"
    print(header, file=stream)
    for p in result["partitions"]:
        shape = p["bloom_shape"]
        formats = ", ".join(f"{name}:{count}" for name, count in sorted(p["batches_by_format"].items()))
        print(f"{p['topic'] + '-' + str(p['partition']):<16}{p['records']:>9}{p['batches']:>9}{p['bytes']:>11}"
              f"{p['producer_ids']:>6}{str(shape['bits']) + '/' + str(shape['hash_functions']):>14}  {formats}",
              file=stream)
    totals = result["totals"]
    print(f"{'total':<16}{totals['records']:>9}{totals['batches']:>9}{totals['bytes']:>11}{totals['producer_ids']:>6}",
          file=stream)
    for corrupt in result["corrupt_segments"]:
        print(f"CORRUPT {corrupt['topic']}-{corrupt['partition']}/{corrupt['segment']}: {corrupt['error']}",
              file=stream)


if __name__ == "__main__":
    sys.exit(main())

"""``kmem topics``, ``kmem groups``, ``kmem produce`` and ``kmem consume``: Kafka's ``kafka-topics.sh``,
``kafka-consumer-groups.sh``, ``kafka-console-producer.sh`` and ``kafka-console-consumer.sh`` as kmem commands,
with their options and output, talking to any Kafka broker over the protocol (``AdminClient``).

What they share lives here: ``--bootstrap-server`` and ``--command-config`` (Kafka's client properties, the
security ones included: TLS and SASL PLAIN/SCRAM as kmem's consumer speaks them), the one-line errors and the
exit codes.
"""
import argparse
import logging
import os
import sys

ADMIN_EXIT_CODES = """\
exit codes:
  0  done
  1  the broker refused or reported an error (an unknown topic or group, a topic that exists, a failed
     SASL authentication, ...)
  2  bad arguments or --command-config (nothing was sent)
  3  no broker reachable at --bootstrap-server, or no answer within request.timeout.ms"""

DONE, REFUSED, BAD_ARGUMENTS, UNREACHABLE = 0, 1, 2, 3

# the client properties of --command-config the tools honour (Kafka's names and AdminClient defaults), beside
# the security settings kmem's consumer reads (kmem.consumer.config)
CLIENT_DEFAULTS = {"client.id": "kmem-admin", "request.timeout.ms": 30000, "socket.connection.setup.timeout.ms": 10000}
SECURITY_PREFIXES = ("ssl.", "sasl.")


def whole_number(low, high):
    """An argparse type: a whole number from ``low`` to ``high`` (the range of the field it goes into)."""
    def parse(text):
        if not text.strip().isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, not {text!r}")
        return int(text)
    return parse


class CommandError(Exception):
    """A one-line error of a command, with its exit code."""

    def __init__(self, message, exit_code=REFUSED):
        super().__init__(message)
        self.exit_code = exit_code


def add_commands(commands):
    """Register the tools (``kmem topics``, ``groups``, ``produce``, ``consume``, ``configs``, ``offsets``,
    ``transactions``, ``dump-log``) on the ``kmem`` command's subparsers."""
    from kmem.admin import configs, consume, dump_log, groups, offsets, produce, topics, transactions

    for module in (topics, groups, produce, consume, configs, offsets, transactions):
        parser = commands.add_parser(module.NAME, help=module.HELP, description=module.DESCRIPTION,
                                     epilog=ADMIN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                            help="the broker(s) to connect to: HOST:PORT, or several separated by commas")
        parser.add_argument("--command-config", metavar="FILE",
                            help="client properties (Kafka's names): client.id, request.timeout.ms, "
                                 "socket.connection.setup.timeout.ms, security.protocol (PLAINTEXT, SSL, "
                                 "SASL_PLAINTEXT, SASL_SSL), ssl.truststore.location and ssl.keystore.location "
                                 "(PEM), sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), sasl.jaas.config")
        module.add_arguments(parser)
        parser.set_defaults(run=lambda args, module=module: run(module, args))
    dump_log.add_command(commands)      # offline: no broker options


def run(module, args):
    """Run a command: its exit code, with an error as one line on stderr."""
    from kmem.admin.client import AdminClient, AdminError, MalformedResponseError, RequestTimedOutError
    from kmem.consumer.errors import KafkaConnectionError
    from kmem.errors import KmemError, SaslAuthenticationError

    prefix = f"kmem {module.NAME}: error:"
    try:
        module.check_arguments(args)
        config = args.client_config = client_config(args.command_config)
        client = AdminClient(args.bootstrap_server, client_id=config["client.id"],
                             request_timeout_ms=config["request.timeout.ms"],
                             connect_timeout_ms=config["socket.connection.setup.timeout.ms"],
                             ssl_context=config["ssl_context"], sasl=config["sasl"])
    except CommandError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return exc.exit_code
    except KmemError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return BAD_ARGUMENTS
    # the network client's own warnings (a failed connect) would repeat the one error line
    network_log = logging.getLogger("kmem.consumer.client")
    level = network_log.level
    network_log.setLevel(logging.ERROR)
    try:
        with client:
            exit_code = module.execute(client, args) or DONE
        sys.stdout.flush()          # here, so a closed stdout is caught below
        return exit_code
    except CommandError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return exc.exit_code
    except RequestTimedOutError as exc:
        print(f"{prefix} {exc}: is it a Kafka broker? if it is busy, give it longer with request.timeout.ms in "
              "--command-config", file=sys.stderr)
        return UNREACHABLE
    except SaslAuthenticationError as exc:
        print(f"{prefix} {exc}: check the user and password of --command-config", file=sys.stderr)
        return REFUSED
    except KafkaConnectionError as exc:
        print(f"{prefix} {exc}: check --bootstrap-server and that the broker is running", file=sys.stderr)
        return UNREACHABLE
    except (AdminError, MalformedResponseError) as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return REFUSED
    except KmemError as exc:        # anything else kmem refused (a value a message cannot carry): one line too
        print(f"{prefix} {exc}", file=sys.stderr)
        return REFUSED
    except BrokenPipeError:         # stdout closed early (| head): what was asked for is out
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # no second error at exit's flush
        return DONE
    finally:
        network_log.setLevel(level)


def client_config(path):
    """The client settings of a --command-config file, Kafka's defaults for the rest, with ``ssl_context`` and
    ``sasl`` for the connections; refuses what the tools cannot honour in one line (``CommandError``, exit 2)."""
    from kmem.broker.settings import read_properties_file
    from kmem.consumer import config as consumer_config
    from kmem.errors import ConfigError

    config = dict(CLIENT_DEFAULTS, ssl_context=None, sasl=None, security_properties={})
    if path is None:
        return config
    properties = read_properties_file(path)
    security = {name: value for name, value in properties.items()
                if name == "security.protocol" or name.startswith(SECURITY_PREFIXES)}
    config["security_properties"] = security        # as given: for kmem's consumer (kmem console's browser)
    try:
        security = consumer_config.security(security)
        config["ssl_context"] = consumer_config.ssl_context(security)
        config["sasl"] = consumer_config.sasl_settings(security)
    except ConfigError as exc:
        raise CommandError(f"{path}: {exc}", BAD_ARGUMENTS) from None
    for name in ("request.timeout.ms", "socket.connection.setup.timeout.ms"):
        if name in properties:
            try:
                config[name] = int(properties[name])
            except ValueError:
                config[name] = 0
            if config[name] <= 0:
                raise CommandError(f"{path}: {name} must be a positive number of milliseconds, "
                                   f"not {properties[name]!r}", BAD_ARGUMENTS)
    config["client.id"] = properties.get("client.id", config["client.id"])
    return config


def tool_properties(pairs, defaults):
    """``defaults`` updated with --property's ``KEY=VALUE`` pairs (Kafka's console tools' ``--property``); an
    unknown key or a pair without ``=`` is a ``CommandError`` (exit 2)."""
    properties = dict(defaults)
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in defaults:
            raise CommandError(f"--property takes KEY=VALUE with KEY one of {', '.join(defaults)}, not {pair!r}",
                               BAD_ARGUMENTS)
        properties[name] = value
    return properties


def print_table(header, rows, widths=None):
    """Rows under a header, each column as wide as its widest cell (a minimum from ``widths``), as
    Kafka's tools left-align them; the last column is not padded."""
    widths = [max([len(str(cell)) for cell in column] + [(widths or {}).get(i, 0)])
              for i, column in enumerate(zip(header, *rows))]
    for row in [header, *rows]:
        cells = [f"{str(cell):<{width}}" for cell, width in zip(row[:-1], widths)]
        print(" ".join([*cells, str(row[-1])]))

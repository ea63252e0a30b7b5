"""The JAAS configuration Kafka's ``sasl.jaas.config`` holds (``JaasConfig``): one or more login module
entries ``<class> <flag> key="value" ...;``."""
import re

from kmem.errors import ConfigError

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_FLAGS = ("required", "requisite", "sufficient", "optional")
_TOKEN = re.compile(r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<semicolon>;)|(?P<equals>=)|(?P<word>[^\s=;"]+))', re.S)


def _tokens(setting, text):
    pos, tokens = 0, []
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ConfigError(f"{setting}: cannot read the JAAS configuration after {text[:pos]!r}")
        kind = match.lastgroup
        value = match[kind]
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        tokens.append((kind, value))
        pos = match.end()
    return tokens


def parse_jaas_config(setting, text):
    """``[(login module class, {option: value})]`` of a ``sasl.jaas.config`` value; ``ConfigError`` (naming
    ``setting``, never a value: they hold passwords) when it is malformed."""
    tokens = _tokens(setting, str(text))
    modules, i = [], 0
    while i < len(tokens):
        if i + 1 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][1] not in _FLAGS:
            raise ConfigError(f"{setting}: a JAAS login module must read '<class> required key=\"value\" ...;'")
        module, i, options = tokens[i][1], i + 2, {}
        while i < len(tokens) and tokens[i][0] != "semicolon":
            if i + 2 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "equals" \
                    or tokens[i + 2][0] not in ("word", "quoted"):
                raise ConfigError(f"{setting}: the options of {module} must read key=\"value\"")
            options[tokens[i][1]] = tokens[i + 2][1]
            i += 3
        if i >= len(tokens):
            raise ConfigError(f"{setting}: the JAAS login module {module} must end with ';'")
        modules.append((module, options))
        i += 1
    if not modules:
        raise ConfigError(f"{setting} is empty")
    return modules


def plain_users(setting, text):
    """``{user: password}`` of the ``user_<name>="<password>"`` options of the PlainLoginModule entry."""
    for module, options in parse_jaas_config(setting, text):
        if module == PLAIN_LOGIN_MODULE:
            return {name[len("user_"):]: value for name, value in options.items() if name.startswith("user_")}
    raise ConfigError(f"{setting} has no {PLAIN_LOGIN_MODULE} entry")

"""The JAAS configuration Kafka's ``sasl.jaas.config`` holds (``JaasConfig``): one or more login module
entries ``<class> <flag> key="value" ...;``; and a JAAS file (what ``-Djava.security.auth.login.config`` names):
contexts ``<name> { <entries> };``, with ``//`` and ``/* */`` comments."""
import os
import re

from kmem.errors import ConfigError

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
SERVER_CONTEXT = "KafkaServer"       # Kafka's JaasContext.GLOBAL_CONTEXT_NAME_SERVER
_FLAGS = ("required", "requisite", "sufficient", "optional")
_TOKEN = re.compile(r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<semicolon>;)|(?P<equals>=)|(?P<word>[^\s=;"]+))', re.S)
_FILE_TOKEN = re.compile(r'\s*(?:(?P<comment>//[^\n]*|/\*.*?\*/)|(?P<quoted>"(?:[^"\\]|\\.)*")'
                         r'|(?P<open>\{)|(?P<close>\})|(?P<semicolon>;)|(?P<equals>=)|(?P<word>[^\s=;"{}/]+))', re.S)


def _tokens(setting, text, pattern=_TOKEN):
    """``[(kind, value)]``; a place that cannot be read is named by its line, never by what it holds."""
    pos, tokens = 0, []
    text = text.rstrip()
    while pos < len(text):
        match = pattern.match(text, pos)
        if match is None:
            line = text.count("\n", 0, pos) + 1
            raise ConfigError(f"{setting}: cannot read the JAAS configuration at line {line} (an unclosed quote or "
                              "comment?)")
        kind = match.lastgroup
        value = match[kind]
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if kind != "comment":
            tokens.append((kind, value))
        pos = match.end()
    return tokens


def parse_jaas_config(setting, text):
    """``[(login module class, {option: value})]`` of a ``sasl.jaas.config`` value; ``ConfigError`` (naming
    ``setting``, never a value: they hold passwords) when it is malformed."""
    return _modules(setting, _tokens(setting, str(text)))


def _modules(setting, tokens):
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


def parse_jaas_file(path):
    """``{context name: [(login module class, {option: value})]}`` of a JAAS file (``KafkaServer { ... };``, as
    Java's ``ConfigFile`` reads it); ``ConfigError`` naming the file (never a value) when it is unreadable or
    malformed."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the JAAS file {path}: {getattr(e, 'strerror', None) or e}") from None
    tokens, contexts, i = _tokens(f"JAAS file {path}", text, _FILE_TOKEN), {}, 0
    while i < len(tokens):
        if i + 1 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "open":
            raise ConfigError(f"JAAS file {path}: a context must read '<name> {{ <login module entries> }};'")
        name, i = tokens[i][1], i + 2
        end = next((j for j in range(i, len(tokens)) if tokens[j][0] in ("open", "close")), len(tokens))
        if end + 1 >= len(tokens) or tokens[end][0] != "close" or tokens[end + 1][0] != "semicolon":
            raise ConfigError(f"JAAS file {path}: the context {name} must end with '}};'")
        if name in contexts:
            raise ConfigError(f"JAAS file {path}: the context {name} is defined twice")
        contexts[name] = _modules(f"JAAS file {path}, context {name}", tokens[i:end])
        i = end + 2
    return contexts


def server_context(path, contexts, listener_name):
    """``(context name, login modules)`` of a listener in a JAAS file's ``contexts``, as Kafka's
    ``JaasContext.loadServerContext`` finds them: the context ``<listener name, lower case>.KafkaServer``, else
    ``KafkaServer``."""
    for name in (f"{listener_name.lower()}.{SERVER_CONTEXT}", SERVER_CONTEXT):
        if name in contexts:
            return name, contexts[name]
    raise ConfigError(f"JAAS file {path}: could not find a '{SERVER_CONTEXT}' or "
                      f"'{listener_name.lower()}.{SERVER_CONTEXT}' entry")


def plain_users(setting, text):
    """``{user: password}`` of the ``user_<name>="<password>"`` options of the PlainLoginModule entry."""
    return plain_module_users(setting, parse_jaas_config(setting, text))


def plain_module_users(where, modules):
    """``{user: password}`` of the PlainLoginModule entry among ``modules`` (``[(class, options)]``)."""
    for module, options in modules:
        if module == PLAIN_LOGIN_MODULE:
            return {name[len("user_"):]: value for name, value in options.items() if name.startswith("user_")}
    raise ConfigError(f"{where} has no {PLAIN_LOGIN_MODULE} entry")

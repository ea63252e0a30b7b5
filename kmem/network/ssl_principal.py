"""The principal of an SSL connection with a client certificate, as Kafka's ``DefaultKafkaPrincipalBuilder`` makes
it: ``User:<name>``, the name being the certificate's subject (its RFC 2253 form, as Java's ``X500Principal.getName()``
writes it: ``CN=alice,OU=eng,O=Example,C=US``) mapped by ``ssl.principal.mapping.rules`` (Kafka's
``SslPrincipalMapper``, KIP-371). ``User:ANONYMOUS`` without a certificate.

The rules, comma-separated, are tried in order; the first that matches names the principal:

- ``DEFAULT``: the distinguished name as it is;
- ``RULE:pattern/replacement/`` (``/L`` or ``/U`` after it: in lower or upper case): when the regular expression
  matches the whole name, the name with the pattern replaced (``$1`` is the first group; ``\\/`` a slash).

A name that no rule matches ends the connection (Kafka's ``NoMatchingRule``).
"""
import re

from kmem.errors import ConfigError, SslAuthenticationError

ANONYMOUS = "User:ANONYMOUS"
DEFAULT_RULES = "DEFAULT"       # Kafka's ssl.principal.mapping.rules default
# Kafka's RULE_PATTERN and its splitter: DEFAULT, RULE:pattern/replacement/[LU], or anything else (refused)
_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")
_PARSER = re.compile(_RULE)
# RFC 2253's keywords (the only ones X500Principal.getName() writes) by OpenSSL's long names
_KEYWORDS = {"commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
             "organizationName": "O", "organizationalUnitName": "OU", "domainComponent": "DC", "userId": "UID",
             "streetAddress": "STREET"}
EMAIL_ADDRESS_OID = "1.2.840.113549.1.9.1"      # written as its OID and its DER IA5String in hex, as Java does
_SPECIAL = re.compile(r'([,+"\\<>;])')
_BACK_REFERENCE = re.compile(r"\\(.)|\$(\d+)|\$\{([A-Za-z][A-Za-z0-9]*)\}|(\$)", re.S)


def _escape(value):
    """An attribute value as RFC 2253 writes it."""
    value = _SPECIAL.sub(r"\\\1", value)
    if value.startswith(("#", " ")):
        value = "\\" + value
    if value.endswith(" ") and not value.endswith("\\ "):
        value = value[:-1] + "\\ "
    return value


def _der_ia5_hex(value):
    data = value.encode("ascii", "replace")
    length = bytes([len(data)]) if len(data) < 128 else bytes([0x81, len(data)])
    return "#" + (b"\x16" + length + data).hex()


def distinguished_name(peer_cert):
    """The subject of ``peer_cert`` (``ssl.SSLSocket.getpeercert()``'s dict) in RFC 2253 form: its most specific
    attribute first."""
    rdns = []
    for rdn in reversed(peer_cert["subject"]):
        attributes = []
        for name, value in rdn:
            if name in _KEYWORDS:
                attributes.append(f"{_KEYWORDS[name]}={_escape(value)}")
            elif name == "emailAddress":
                attributes.append(f"{EMAIL_ADDRESS_OID}={_der_ia5_hex(value)}")
            else:
                attributes.append(f"{name}={_escape(value)}")
        rdns.append("+".join(attributes))
    return ",".join(rdns)


class _Rule:
    def __init__(self, pattern=None, replacement=None, case=""):
        self.pattern = pattern
        self.replacement = replacement
        self.case = case

    def apply(self, name):
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        result = self.pattern.sub(self._replace, name)
        return result.lower() if self.case == "L" else result.upper() if self.case == "U" else result

    def _replace(self, match):
        """Java's replacement syntax: ``$n`` (as many digits as name a group; a group the pattern lacks is literal,
        as Kafka escapes it), ``${name}``, ``\\x`` for x."""
        groups = self.pattern.groups

        def one(reference):
            escaped, number, named, _ = reference.groups()
            if escaped is not None:
                return escaped
            if named is not None:
                return match.group(named) or ""
            digits = number
            while len(digits) > 1 and int(digits) > groups:
                digits = digits[:-1]
            if int(digits) > groups:
                return reference.group(0)
            return (match.group(int(digits)) or "") + number[len(digits):]
        return _BACK_REFERENCE.sub(one, self.replacement)

    def check(self, text):
        for escaped, number, named, bare in _BACK_REFERENCE.findall(self.replacement):
            if bare or (named and named not in self.pattern.groupindex):
                raise ConfigError(f"ssl.principal.mapping.rules: illegal group reference in {text!r}")


class SslPrincipalMapper:
    """``principal(peer_cert)``: the connection's principal (see the module docstring). ``ConfigError`` for rules
    Kafka would not read, and for a pattern Python's ``re`` cannot compile (Java's named groups, ``(?<name>``,
    are written ``(?P<name>`` here)."""

    def __init__(self, rules=DEFAULT_RULES):
        self.rules = []
        text = DEFAULT_RULES if rules is None else str(rules)
        for rule in (match.group(1) for match in _SPLITTER.finditer(text.strip())):
            parsed = _PARSER.match(rule)
            if parsed.end() != len(rule):
                raise ConfigError(f"ssl.principal.mapping.rules: invalid rule {rule!r}, unmatched "
                                  f"{rule[parsed.end():]!r}")
            if parsed.group(1) is not None:
                self.rules.append(_Rule())
            elif parsed.group(2) is not None:
                try:
                    pattern = re.compile(parsed.group(2))
                except re.error as e:
                    raise ConfigError(f"ssl.principal.mapping.rules: invalid pattern in {rule!r}: {e}") from None
                self.rules.append(_Rule(pattern, parsed.group(3), parsed.group(4)))
                self.rules[-1].check(rule)
            # an empty rule is ignored, as Kafka ignores it

    def principal(self, peer_cert):
        """``User:<name>`` of a client certificate (``getpeercert()``'s dict), ``User:ANONYMOUS`` without one."""
        if not peer_cert:
            return ANONYMOUS
        return f"User:{self.name(distinguished_name(peer_cert))}"

    def name(self, distinguished_name):
        """The name the first matching rule makes of ``distinguished_name``; ``SslAuthenticationError`` when none
        matches."""
        for rule in self.rules:
            mapped = rule.apply(distinguished_name)
            if mapped is not None:
                return mapped
        raise SslAuthenticationError(f"no ssl.principal.mapping.rules rule applies to {distinguished_name}")

"""Authorization as Kafka's ``StandardAuthorizer`` decides it (KIP-11, KIP-290 prefixed ACLs, KIP-679).

``authorizer.class.name`` turns it on (``org.apache.kafka.metadata.authorizer.StandardAuthorizer``, or the
ZooKeeper-era ``kafka.security.authorizer.AclAuthorizer``); ``super.users`` (``User:a;User:b``) may do anything;
``allow.everyone.if.no.acl.found`` (default false) allows an action on a resource that no ACL names.

A binding names a resource pattern (type, name, LITERAL or PREFIXED; the LITERAL name ``*`` is every name) and
an entry (principal ``User:name`` or ``User:*``, host ``*`` or an address, operation, ALLOW or DENY). An action is
allowed when an ALLOW binding matches and no DENY does; READ, WRITE, DELETE and ALTER allowed imply DESCRIBE,
ALTER_CONFIGS implies DESCRIBE_CONFIGS (for ALLOW only: a DENY denies its own operation, or ALL).

The index, per resource type: a dict of LITERAL names and a sorted list of PREFIXED names, searched by bisection
(as ``StandardAuthorizerData`` walks its sorted set), so a check costs a few dict and bisect steps whatever the
number of ACLs. The ACLs persist in the log directory, ``acls.json``, one entry per ACL with the fields (and the
id) of Kafka's ``AccessControlEntryRecord``, replaced atomically, so the KRaft hand-over can turn each into that
record. Denials are logged on ``kmem.authorizer`` at INFO in Kafka's authorizer-log form.
"""
import bisect
import dataclasses
import enum
import logging
import os
import threading
import uuid

from kmem.durable import read_json, write_json
from kmem.errors import ConfigError

audit_log = logging.getLogger("kmem.authorizer")

ACLS_FILE = "acls.json"
VERSION = 1
AUTHORIZER_SETTINGS = ("authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found")
AUTHORIZER_CLASSES = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "kafka.security.authorizer.AclAuthorizer")
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"          # Kafka's only CLUSTER resource name


class ResourceType(enum.IntEnum):       # org.apache.kafka.common.resource.ResourceType
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):        # org.apache.kafka.common.resource.PatternType
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):          # org.apache.kafka.common.acl.AclOperation
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):         # org.apache.kafka.common.acl.AclPermissionType
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Kafka's SecurityUtils.resourceTypeName, for the audit log
_RESOURCE_TYPE_NAMES = {ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
                        ResourceType.TRANSACTIONAL_ID: "TransactionalId",
                        ResourceType.DELEGATION_TOKEN: "DelegationToken", ResourceType.USER: "User"}
_IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                               Operation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


def _enum(kind, code):
    try:
        return kind(code)
    except ValueError:
        return kind.UNKNOWN             # Kafka's fromCode: an unknown code is UNKNOWN


@dataclasses.dataclass(frozen=True)
class AclBinding:
    """One ACL (Kafka's ``AclBinding``, flattened as ``StandardAcl``)."""
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type, name, pattern_type, principal, host, operation, permission):
        """A binding from the wire's codes (unknown codes become UNKNOWN)."""
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                   _enum(Operation, operation), _enum(Permission, permission))

    def validation_error(self):
        """Why Kafka refuses to create this binding (``AclControlManager.validateNewAcl``, ``AclApis``), or None."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            return f"Invalid resourceType {self.resource_type.name}"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"Invalid patternType {self.pattern_type.name}"
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            return f"Invalid operation {self.operation.name}"
        if self.permission not in (Permission.DENY, Permission.ALLOW):
            return f"Invalid permissionType {self.permission.name}"
        if not self.name:
            return "Resource name should not be empty"
        if self.resource_type == ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        kind, colon, who = (self.principal or "").partition(":")
        if not colon or not kind or not who:
            return f"Could not parse principal from `{self.principal}` (no colon is found)"
        return None

    def __str__(self):
        return (f"StandardAcl(resourceType={self.resource_type.name}, resourceName={self.name}, "
                f"patternType={self.pattern_type.name}, principal={self.principal}, host={self.host}, "
                f"operation={self.operation.name}, permissionType={self.permission.name})")


@dataclasses.dataclass(frozen=True)
class AclBindingFilter:
    """Kafka's ``AclBindingFilter``: None fields and ANY codes match anything; pattern type MATCH matches the
    LITERAL and PREFIXED bindings that apply to ``name`` (the wildcard ``*`` included)."""
    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type, name, pattern_type, principal, host, operation, permission):
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                   _enum(Operation, operation), _enum(Permission, permission))

    def validation_error(self):
        """``AclControlManager.validateFilter``: a filter with an UNKNOWN field matches nothing, it is refused."""
        if self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN:
            return "Unknown patternFilter."
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            return "Unknown entryFilter."
        return None

    def matches(self, acl):
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != acl.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type in (PatternType.ANY, acl.pattern_type):
                if self.name != acl.name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:
                if acl.name not in (self.name, WILDCARD):
                    return False
            elif not self.name.startswith(acl.name):
                return False
        return ((self.principal is None or self.principal == acl.principal)
                and (self.host is None or self.host == acl.host)
                and self.operation in (Operation.ANY, acl.operation)
                and self.permission in (Permission.ANY, acl.permission))


# plain ints for the checks (an enum member is a class attribute lookup each time)
_ALL, _DESCRIBE, _DESCRIBE_CONFIGS = int(Operation.ALL), int(Operation.DESCRIBE), int(Operation.DESCRIBE_CONFIGS)
_ALLOW, _DENY = int(Permission.ALLOW), int(Permission.DENY)


def _applies(acl, operation, principal, host):
    """ALLOW or DENY when ``acl`` (on the resource) applies to the action, else None (``findResult``)."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD and acl.host != host:
        return None
    if acl.operation != _ALL and acl.operation != operation:
        if acl.permission != _ALLOW:
            return None         # a DENY denies its own operation only
        if operation == _DESCRIBE:
            if acl.operation not in _IMPLIES_DESCRIBE:
                return None
        elif operation != _DESCRIBE_CONFIGS or acl.operation not in _IMPLIES_DESCRIBE_CONFIGS:
            return None
    return acl.permission


class _TypeIndex:
    """The ACLs of one resource type: LITERAL ones by name, PREFIXED ones by name with the names sorted.

    Readers on other threads take no lock: a name's ACLs are a tuple replaced whole, and the sorted names a list
    replaced whole, so a reader sees the old or the new one."""
    __slots__ = ("literal", "prefixed", "prefixes")

    def __init__(self):
        self.literal = {}           # name -> tuple of AclBinding (the wildcard under "*")
        self.prefixed = {}          # prefix -> tuple of AclBinding
        self.prefixes = []          # sorted keys of prefixed

    def add(self, acls):
        for acl in acls:
            table = self.literal if acl.pattern_type == PatternType.LITERAL else self.prefixed
            table[acl.name] = table.get(acl.name, ()) + (acl,)
        if any(acl.pattern_type == PatternType.PREFIXED for acl in acls):
            self.prefixes = sorted(self.prefixed)

    def remove(self, acls):
        for acl in acls:
            table = self.literal if acl.pattern_type == PatternType.LITERAL else self.prefixed
            left = tuple(a for a in table.get(acl.name, ()) if a != acl)
            if left:
                table[acl.name] = left
            else:
                table.pop(acl.name, None)
        if any(acl.pattern_type == PatternType.PREFIXED for acl in acls):
            self.prefixes = sorted(self.prefixed)

    def matching(self, name):
        """Every tuple of ACLs whose pattern applies to ``name``: the literal name, the wildcard, the prefixes."""
        found = self.literal.get(name)
        if found:
            yield found
        if name != WILDCARD:
            found = self.literal.get(WILDCARD)
            if found:
                yield found
        prefixes = self.prefixes            # one list throughout: a writer replaces it whole
        key, high = name, len(prefixes)
        while high:
            index = bisect.bisect_right(prefixes, key, 0, high)
            if not index:
                return
            candidate = prefixes[index - 1]
            high = index - 1
            if name.startswith(candidate):
                found = self.prefixed.get(candidate)
                if found:
                    yield found
                key = candidate
            else:
                # the prefixes of name left are prefixes of what name and candidate share: look at most there
                shared = 0
                for a, b in zip(name, candidate):
                    if a != b:
                        break
                    shared += 1
                key = name[:shared]


@dataclasses.dataclass(frozen=True)
class AuthorizerConfig:
    """``super.users`` and ``allow.everyone.if.no.acl.found``, for an ``authorizer.class.name`` that is set."""
    super_users: frozenset = frozenset()
    allow_if_no_acl: bool = False

    @classmethod
    def from_settings(cls, merged):
        """The configuration of the authorizer ``authorizer.class.name`` names; None when it is not set (or empty):
        no authorizer, every request is allowed."""
        name = str(merged.get("authorizer.class.name", "")).strip()
        if not name:
            return None
        if name not in AUTHORIZER_CLASSES:
            raise ConfigError(f"authorizer.class.name = {name!r}: kmem broker's authorizer is Kafka's "
                              f"{AUTHORIZER_CLASSES[0]} (or {AUTHORIZER_CLASSES[1]})")
        users = [user.strip() for user in str(merged.get("super.users", "")).split(";") if user.strip()]
        bad = [user for user in users if ":" not in user]
        if bad:
            raise ConfigError(f"super.users must list principals such as User:admin, separated by ';', not {bad[0]!r}")
        allow = merged.get("allow.everyone.if.no.acl.found", False)
        if isinstance(allow, str):
            if allow.strip().lower() not in ("true", "false"):
                raise ConfigError(f"allow.everyone.if.no.acl.found must be true or false, not {allow!r}")
            allow = allow.strip().lower() == "true"
        return cls(frozenset(users), bool(allow))


class StandardAuthorizer:
    """The broker's authorizer: ``authorize(principal, host, operation, resource_type, name, api=...)``, the
    bindings (``acls(filter)``, ``create(bindings)``, ``delete(filters)``), kept in ``log_dir``."""

    def __init__(self, log_dir, config=AuthorizerConfig()):
        self.path = os.path.join(os.fspath(log_dir), ACLS_FILE)
        self.super_users = config.super_users
        self.allow_if_no_acl = config.allow_if_no_acl
        self._lock = threading.Lock()           # writers; readers go without it (see _TypeIndex.add)
        self._by_id = {}                        # AccessControlEntryRecord id -> AclBinding
        self._ids = {}                          # AclBinding -> id
        self._index = {resource_type: _TypeIndex() for resource_type in ResourceType}
        self._insert(self._read())

    # -- decisions

    def is_super_user(self, principal):
        return principal in self.super_users

    def authorize(self, principal, host, operation, resource_type, name, *, api="", count=1, log_if_denied=True):
        """True when ``principal`` from ``host`` may do ``operation`` on the resource (``StandardAuthorizerData.
        authorize``). A denial is logged at INFO when ``log_if_denied`` (the resource was asked for by name), an
        allowed action at DEBUG."""
        if principal in self.super_users:
            if audit_log.isEnabledFor(logging.DEBUG):
                self._audit(logging.DEBUG, "Allowed", principal, host, operation, resource_type, name, api, count,
                            "SuperUser")
            return True
        allow = deny = None
        found = False
        for acls in self._index[resource_type].matching(name):
            found = True
            for acl in acls:
                result = _applies(acl, operation, principal, host)
                if result == _DENY:
                    deny = acl
                    break
                if result == _ALLOW:
                    allow = acl
            if deny is not None:
                break
        allowed = deny is None and (allow is not None or (not found and self.allow_if_no_acl))
        level = logging.DEBUG if allowed else logging.INFO if log_if_denied else None
        if level is not None and audit_log.isEnabledFor(level):
            acl = deny or allow
            rule = f"MatchingAcl(acl={acl})" if acl is not None else "DefaultAllow" if allowed else "DefaultDeny"
            self._audit(level, "Allowed" if allowed else "Denied", principal, host, operation, resource_type, name,
                        api, count, rule)
        return allowed

    @staticmethod
    def _audit(level, result, principal, host, operation, resource_type, name, api, count, rule):
        """Kafka's authorizer log line (``StandardAuthorizerData.buildAuditMessage``)."""
        audit_log.log(level, "Principal = %s is %s operation = %s from host = %s on resource = %s:LITERAL:%s for "
                      "request = %s with resourceRefCount = %d based on rule %s", principal, result,
                      Operation(operation).name, host, _RESOURCE_TYPE_NAMES[resource_type], name, api, count, rule)

    def authorize_by_resource_type(self, principal, host, operation, resource_type, *, api=""):
        """True when some resource of ``resource_type`` allows ``operation`` to ``principal`` and no DENY covers it
        (Kafka's ``Authorizer.authorizeByResourceType``, KIP-679: WRITE on any topic implies IDEMPOTENT_WRITE)."""
        # a made-up name first, as Kafka's: super users, the wildcard and allow.everyone.if.no.acl.found
        if self.authorize(principal, host, operation, resource_type, "hardcode", api=api, log_if_denied=False):
            return True
        allowed = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        denied = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        wildcard_allowed = False
        for acl in list(self._by_id.values()):
            if acl.resource_type != resource_type or acl.operation not in (operation, Operation.ALL):
                continue
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                continue
            if acl.permission == Permission.DENY:
                if acl.pattern_type == PatternType.LITERAL and acl.name == WILDCARD:
                    return False
                denied[acl.pattern_type].add(acl.name)
            elif acl.pattern_type == PatternType.LITERAL and acl.name == WILDCARD:
                wildcard_allowed = True
            else:
                allowed[acl.pattern_type].add(acl.name)
        if wildcard_allowed:
            return True
        for pattern_type, names in allowed.items():
            for name in names:
                if pattern_type == PatternType.LITERAL and name in denied[PatternType.LITERAL]:
                    continue
                if not any(name[:length] in denied[PatternType.PREFIXED] for length in range(1, len(name) + 1)):
                    return True
        return False

    # -- the bindings

    def acls(self, acl_filter):
        """The bindings ``acl_filter`` matches."""
        return [acl for acl in list(self._by_id.values()) if acl_filter.matches(acl)]

    def entries(self):
        """``[(id, binding)]`` of every binding, the ids those of Kafka's ``AccessControlEntryRecord``."""
        return list(self._by_id.items())

    def create(self, bindings):
        """Add the (valid) ``bindings``, on disk before this returns; one already present is kept as it is."""
        with self._lock:
            new = [acl for acl in dict.fromkeys(bindings) if acl not in self._ids]
            if not new:
                return
            added = [(str(uuid.uuid4()), acl) for acl in new]
            self._write([*self._by_id.items(), *added])
            self._insert(added)

    def delete(self, filters):
        """Remove every binding each filter matches; the list of removed bindings per filter."""
        with self._lock:
            matched = [[acl for acl in self._by_id.values() if acl_filter.matches(acl)] for acl_filter in filters]
            gone = {acl for acls in matched for acl in acls}
            if gone:
                self._write([(acl_id, acl) for acl_id, acl in self._by_id.items() if acl not in gone])
                for acl in gone:
                    del self._by_id[self._ids.pop(acl)]
                for resource_type, index in self._index.items():
                    index.remove([acl for acl in gone if acl.resource_type == resource_type])
            return matched

    def _insert(self, entries):
        for acl_id, acl in entries:
            self._by_id[acl_id] = acl
            self._ids[acl] = acl_id
        for resource_type, index in self._index.items():
            index.add([acl for _, acl in entries if acl.resource_type == resource_type])

    # -- the file: AccessControlEntryRecord's fields, by name

    def _write(self, entries):
        write_json(self.path, VERSION, "acls", [
            {"id": acl_id, "resourceType": int(acl.resource_type), "resourceName": acl.name,
             "patternType": int(acl.pattern_type), "principal": acl.principal, "host": acl.host,
             "operation": int(acl.operation), "permissionType": int(acl.permission)} for acl_id, acl in entries])

    def _read(self):
        acls = read_json(self.path, VERSION, "acls", "ACLs")
        try:
            entries = []
            for entry in acls or []:
                acl = AclBinding.of(entry["resourceType"], entry["resourceName"], entry["patternType"],
                                    entry["principal"], entry["host"], entry["operation"], entry["permissionType"])
                error = acl.validation_error()
                if error is not None:
                    raise ConfigError(f"{self.path}: ACL {entry['id']}: {error}")
                entries.append((str(entry["id"]), acl))
            return entries
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{self.path}: malformed ACLs ({type(e).__name__}: {e})") from None

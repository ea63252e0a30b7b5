"""Client quotas as Kafka 3.9 keeps and enforces them: ``ClientQuotaStore`` and ``ClientQuotaManager``.

``ClientQuotaStore`` holds the quota configuration of each entity (KIP-55: a user, a client id, a user and a
client id, each name possibly ``<default>``, held as None as Kafka does; KIP-612: an IP): ``producer_byte_rate``
and ``consumer_byte_rate`` (KIP-13, whole bytes per second), ``request_percentage`` (KIP-124) and
``controller_mutation_rate`` (KIP-599) for users and client ids, ``connection_creation_rate`` for IPs. It answers
DescribeClientQuotas and AlterClientQuotas as Kafka's ``ClientQuotasImage.describe`` and
``ClientQuotaControlManager.alterClientQuotas`` do, and persists in the log directory as ``client_quotas.json``
(one entry per entity, the fields of Kafka's ``QuotaRecord``), replaced atomically with fsync.

``ClientQuotaManager`` enforces the two byte rates and ``request_percentage`` (Kafka's ``ClientQuotaManager``
and ``ClientRequestQuotaManager``): a client's quota is that of the most specific of KIP-55's eight levels that
sets it, and clients whose quota comes from the same entity share one rate (Kafka's
``DefaultQuotaCallback.quotaMetricTags``). The rate is Kafka's ``Rate`` over a ``SampledStat``:
``quota.window.num`` samples of ``quota.window.size.seconds``. A request that takes a rate over its quota is
throttled for ``(rate - quota) / quota * window`` (``QuotaUtils.throttleTime``); for request time at most one
window (``QuotaUtils.boundedThrottleTime``). Request time is recorded as Kafka records it: the handling time in
percent of one thread over a second (``nanosToPercentage``), so ``request_percentage`` 50 is half a thread.

``ControllerMutationQuotaManager`` enforces ``controller_mutation_rate`` (KIP-599): the partitions a client
creates or deletes (CreateTopics, CreatePartitions, DeleteTopics) draw on a token bucket of ``quota`` tokens a
second holding at most ``quota * quota.window.num * quota.window.size.seconds`` (Kafka's ``TokenBucket``).
From CreateTopics v6, CreatePartitions v3 and DeleteTopics v5 the quota is strict: a mutation asked for while the
bucket is below zero is refused with THROTTLING_QUOTA_EXCEEDED (the one that takes it below zero passes); older
versions are permissive: every mutation passes. Either way the response is throttled until the bucket is back
at zero.
"""
import ipaddress
import math
import os
import threading
import time

from kmem.broker.codes import ErrorCode
from kmem.durable import read_json, write_json
from kmem.errors import ConfigError
from kmem.network.quotas import SampledRate, normalised_ip

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE = "request_percentage", "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
# Kafka's QuotaConfigs: each key and whether it takes whole numbers (LONG, INT) or any (DOUBLE)
CLIENT_KEYS = {PRODUCER_BYTE_RATE: True, CONSUMER_BYTE_RATE: True, REQUEST_PERCENTAGE: False,
               CONTROLLER_MUTATION_RATE: False}
IP_KEYS = {CONNECTION_CREATION_RATE: True}
LONG_MAX = 2**63 - 1
QUOTAS_FILE = "client_quotas.json"
VERSION = 1
PURGE_MIN_RATES = 1024          # rates kept before the idle ones are looked for
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2       # DescribeClientQuotas' match types
NANOS_TO_PERCENTAGE = 100 / 1e9     # Kafka's NanosToPercentagePerSecond: request time in percent of a thread

# KIP-55's precedence, most specific first: (user part, client-id part), where "name" is the client's own
# name, None the <default> entity, and a missing part an entity without that type
PRECEDENCE = (("name", "name"), ("name", None), ("name", ...), (None, "name"), (None, None), (None, ...),
              (..., "name"), (..., None))


class QuotaRequestError(Exception):
    """A request Kafka answers with ``code`` and ``message`` (INVALID_REQUEST, UNSUPPORTED_VERSION)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def entity_key(pairs):
    """The entity of ``(type, name)`` pairs as a hashable, ordered key."""
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


def entity_error(pairs):
    """None, or Kafka's error of an AlterClientQuotas entity (``validateEntity``, ``configKeysForEntityType``)."""
    if not pairs:
        return "Invalid empty client quota entity"
    seen = {}
    for entity_type, name in pairs:
        if entity_type in seen:
            return f"Invalid empty client quota entity, duplicate entity entry {entity_type}"
        if entity_type not in (USER, CLIENT_ID, IP):
            return f"Unhandled client quota entity type: {entity_type}"
        if name == "":
            return f"Empty {entity_type} not supported"
        seen[entity_type] = name
    if IP in seen:
        if len(seen) > 1:
            return "Invalid empty client quota entity"
        if seen[IP] is not None and not _is_ip(seen[IP]):
            return f"{seen[IP]} is not a valid IP or resolvable host."
    return None


def _is_ip(name):
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def value_error(keys, key, value):
    """None, or Kafka's error of a quota value (``validateQuotaKeyValue``), plus KIP-546's range: a quota is a
    finite number of at least 0."""
    whole = keys.get(key)
    if whole is None:
        return f"Invalid configuration key {key}"
    if not math.isfinite(value) or value < 0:
        return f"Configuration {key} must be a non-negative number, not {value}"
    if whole and (value > LONG_MAX or abs(math.floor(value + 1e-6) - value) > 1e-6):
        return f"Configuration {key} must be a Long value"
    return None


class ClientQuotaStore:
    """The quota configuration of every entity, in memory and in ``<log_dir>/client_quotas.json``.

    Readers on other threads take no lock: ``quotas`` is a dict replaced whole by each alteration."""

    def __init__(self, log_dir):
        self.path = os.path.join(os.fspath(log_dir), QUOTAS_FILE)
        self._lock = threading.Lock()
        self.quotas = self._read()          # entity key -> {quota key: value}
        self._ip_rates = None, {}           # (quotas indexed, {address or None: connection_creation_rate})

    # -- DescribeClientQuotas (ClientQuotasImage.describe)

    def describe(self, components, strict):
        """``[(entity key, values)]`` matching the filter; ``QuotaRequestError`` for a filter Kafka refuses."""
        exact, specified = {}, set()
        for entity_type, match_type, match in components:
            if not entity_type:
                raise QuotaRequestError(ErrorCode.INVALID_REQUEST, "Invalid empty entity type.")
            if entity_type in exact or entity_type in specified:
                raise QuotaRequestError(ErrorCode.INVALID_REQUEST,
                                        f"Entity type {entity_type} cannot appear more than once in the filter.")
            if entity_type not in (USER, CLIENT_ID, IP):
                raise QuotaRequestError(ErrorCode.UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
            if match_type == MATCH_EXACT:
                if match is None:
                    raise QuotaRequestError(ErrorCode.INVALID_REQUEST,
                                            "Request specified MATCH_TYPE_EXACT, but set match string to null.")
                exact[entity_type] = match
            elif match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
                if match is not None:
                    name = "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else "MATCH_TYPE_SPECIFIED"
                    raise QuotaRequestError(ErrorCode.INVALID_REQUEST,
                                            f"Request specified {name}, but also specified a match string.")
                if match_type == MATCH_DEFAULT:
                    exact[entity_type] = None
                else:
                    specified.add(entity_type)
            else:
                raise QuotaRequestError(ErrorCode.INVALID_REQUEST, f"Unknown match type {match_type}")
        types = exact.keys() | specified
        if IP in types and types & {USER, CLIENT_ID}:
            raise QuotaRequestError(ErrorCode.INVALID_REQUEST, "Invalid entity filter component combination. IP "
                                    "filter component should not be used with user or clientId filter component.")
        if strict and not types:
            return []
        matched = []
        for key, values in self.quotas.items():
            entity = dict(key)
            if any(entity_type not in entity or entity[entity_type] != name for entity_type, name in exact.items()):
                continue
            if any(entity_type not in entity for entity_type in specified):
                continue
            if strict and len(entity) != len(types):
                continue
            matched.append((key, dict(values)))
        return matched

    # -- AlterClientQuotas (ClientQuotaControlManager.alterClientQuotas)

    def alter(self, entries, validate_only=False):
        """Apply ``entries`` (``(pairs, [(key, value, remove)])``) in one write; the (code, message) of each. An
        entry Kafka refuses changes nothing; the others are written together (OSError: none is)."""
        results, changes, seen = [], {}, set()
        for pairs, ops in entries:
            error = entity_error(pairs)
            key = entity_key(pairs) if error is None else None
            if error is None and key in seen:
                error = f"Ignoring duplicate entity {dict(pairs)}"
            seen.add(key)
            if error is None:
                keys = IP_KEYS if key[0][0] == IP else CLIENT_KEYS
                names = [op[0] for op in ops]
                duplicate = next((name for name in names if names.count(name) > 1), None)
                if duplicate is not None:
                    error = f"Duplicate quota key {duplicate} not updating quota for this entity"
                else:
                    error = next((e for name, value, remove in ops if not remove
                                  for e in [value_error(keys, name, value)] if e), None)
            if error is not None:
                results.append((ErrorCode.INVALID_REQUEST, error))
                continue
            changes[key] = ops
            results.append((ErrorCode.NONE, None))
        if validate_only or not changes:
            return results
        with self._lock:
            quotas = {key: dict(values) for key, values in self.quotas.items()}
            for key, ops in changes.items():
                values = quotas.setdefault(key, {})
                for name, value, remove in ops:
                    if remove:
                        values.pop(name, None)
                    else:
                        values[name] = float(value)
                if not values:
                    del quotas[key]
            self._write(quotas)
            self.quotas = quotas
        return results

    # -- the file: QuotaRecord's fields, by name

    def _write(self, quotas):
        write_json(self.path, VERSION, "quotas", [
            {"entity": [{"entityType": entity_type, "entityName": name} for entity_type, name in key],
             "values": values} for key, values in quotas.items()])

    def _read(self):
        stored = read_json(self.path, VERSION, "quotas", "client quotas")
        try:
            quotas = {}
            for entry in stored or []:
                pairs = [(part["entityType"], part["entityName"]) for part in entry["entity"]]
                error = entity_error(pairs)
                keys = IP_KEYS if pairs and pairs[0][0] == IP else CLIENT_KEYS
                error = error or next((e for name, value in entry["values"].items()
                                       for e in [value_error(keys, name, float(value))] if e), None)
                if error is not None:
                    raise ConfigError(f"{self.path}: {error}")
                quotas[entity_key(pairs)] = {name: float(value) for name, value in entry["values"].items()}
            return quotas
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ConfigError(f"{self.path}: malformed client quotas ({type(e).__name__}: {e})") from None

    def connection_rate(self, ip):
        """The ``connection_creation_rate`` of connections from ``ip`` (as ``normalised_ip`` writes it): its own
        entity's, however the entity wrote the address, else the default IP's (Kafka's ``connectionRateForIp``);
        None without either."""
        quotas, by_address = self._ip_rates
        if quotas is not self.quotas:       # altered since: index the IP entities by address again
            quotas = self.quotas
            by_address = {None if name is None else normalised_ip(name): values[CONNECTION_CREATION_RATE]
                          for ((entity_type, name), *rest), values in quotas.items()
                          if entity_type == IP and not rest and CONNECTION_CREATION_RATE in values}
            self._ip_rates = quotas, by_address
        rate = by_address.get(ip)
        return by_address.get(None) if rate is None else rate

    # -- KIP-55's precedence

    def resolve(self, user, client_id, quota_key):
        """``(quota, (user tag, client-id tag))``: the quota of the most specific entity that sets ``quota_key``
        for this client, and the tags of the rate it shares (Kafka's ``quotaMetricTags``); (None, None) without
        one."""
        quotas = self.quotas
        for user_part, client_part in PRECEDENCE:
            pairs = []
            if user_part is not ...:
                pairs.append((USER, user if user_part == "name" else None))
            if client_part is not ...:
                pairs.append((CLIENT_ID, client_id if client_part == "name" else None))
            value = quotas.get(entity_key(pairs), {}).get(quota_key)
            if value is not None:
                return value, (user if user_part is not ... else "", client_id if client_part is not ... else "")
        return None, None


def _user(principal):
    return principal.partition(":")[2]


class _PerClient:
    """The per-client state of a quota manager (a rate, a token bucket), keyed by the tags of the entity whose
    quota it shares; idle entries are forgotten, as Kafka expires its idle quota sensors."""

    def __init__(self, store, quota_key, samples, window_seconds, clock):
        self.store = store
        self.quota_key = quota_key
        self.samples = samples
        self.window = float(window_seconds)
        self.clock = clock
        self._states = {}           # (user tag, client-id tag) -> state
        self._next_purge = PURGE_MIN_RATES
        self._lock = threading.Lock()

    def enabled(self):
        return bool(self.store.quotas)

    def _state(self, tags, now, create):
        """The state of ``tags``, made by ``create()`` when missing; under ``self._lock``."""
        state = self._states.get(tags)
        if state is None:
            if len(self._states) >= self._next_purge:
                # a fresh state measures the same as an idle one: clients that come and go leave nothing behind
                self._states = {t: s for t, s in self._states.items() if not s.expired(now)}
                self._next_purge = max(PURGE_MIN_RATES, 2 * len(self._states))
            state = self._states[tags] = create()
        return state


class ClientQuotaManager(_PerClient):
    """Kafka's ``ClientQuotaManager`` for one rate key: ``producer_byte_rate`` or ``consumer_byte_rate`` (bytes),
    ``request_percentage`` (``record_time``; throttles of at most one window, as ``ClientRequestQuotaManager``)."""

    def __init__(self, store, quota_key, samples=11, window_seconds=1, clock=time.monotonic):
        super().__init__(store, quota_key, samples, window_seconds, clock)
        self.max_throttle_ms = self.window * 1000 if quota_key == REQUEST_PERCENTAGE else math.inf

    def record(self, principal, client_id, value, now=None):
        """Record ``value`` (bytes, or percent-seconds of request time) for the client; its throttle time in ms
        (0 within its quota)."""
        quota, tags = self.store.resolve(_user(principal), client_id or "", self.quota_key)
        if quota is None:
            return 0
        now = self.clock() if now is None else now
        with self._lock:
            rate = self._state(tags, now, lambda: SampledRate(self.samples, self.window))
            rate.record(value, now)
            measured = rate.measure(now)
            if measured <= quota:
                return 0
            if quota == 0:
                throttle = self.samples * self.window * 1000
            else:
                throttle = (measured - quota) / quota * rate.window_size(now) * 1000
            return round(min(throttle, self.max_throttle_ms))

    def record_time(self, principal, client_id, nanos):
        """Record a request's handling time (``request_percentage``); its throttle time in ms."""
        return self.record(principal, client_id, nanos * NANOS_TO_PERCENTAGE)

    def max_value_in_window(self, principal, client_id):
        """Kafka's ``getMaxValueInQuotaWindow``: the most a client may take in one go (a Fetch's ``max_bytes`` is
        capped at it, so one response cannot be over the quota by itself); None without a quota."""
        quota, _ = self.store.resolve(_user(principal), client_id or "", self.quota_key)
        return None if quota is None else quota * (self.samples - 1) * self.window

    def unrecord(self, principal, client_id, value, now=None):
        """Take back a recorded ``value`` (a Fetch answered empty because it was throttled, as Kafka does)."""
        _, tags = self.store.resolve(_user(principal), client_id or "", self.quota_key)
        if tags is None:
            return
        with self._lock:
            rate = self._states.get(tags)
            if rate is not None:
                rate.record(-value, self.clock() if now is None else now)


class TokenBucket:
    """Kafka's ``TokenBucket``: ``quota`` tokens a second, at most ``burst``; starts full."""

    def __init__(self, now):
        self.tokens = math.inf
        self._at = now

    def refill(self, quota, burst, now):
        self.tokens = min(burst, self.tokens + quota * (now - self._at))
        self._at = now
        return self.tokens

    def expired(self, now):
        """True after an hour unused: forgotten, the client starts again from a full bucket."""
        return now - self._at >= 3600


class ThrottlingQuotaExceeded(Exception):
    """A strict mutation quota refused a mutation (THROTTLING_QUOTA_EXCEEDED)."""

    def __init__(self):
        super().__init__("The throttling quota has been exceeded.")


class ControllerMutationQuotaManager(_PerClient):
    """Kafka's ``ControllerMutationQuotaManager`` (``controller_mutation_rate``, KIP-599)."""

    def __init__(self, store, samples=11, window_seconds=1, clock=time.monotonic):
        super().__init__(store, CONTROLLER_MUTATION_RATE, samples, window_seconds, clock)

    def quota_for(self, principal, client_id, strict):
        """The quota of one request (Kafka's ``newQuotaFor``), or None when the client has none."""
        quota, tags = self.store.resolve(_user(principal), client_id or "", self.quota_key)
        if quota is None:
            return None
        return MutationQuota(self, quota, tags, strict)

    def _record(self, quota, tags, permits, strict):
        """Take ``permits`` from the client's bucket (strict: not when it is below zero); ``(accepted, tokens)``."""
        now = self.clock()
        burst = quota * self.samples * self.window
        with self._lock:
            bucket = self._state(tags, now, lambda: TokenBucket(now))
            tokens = bucket.refill(quota, burst, now)
            if strict and tokens < 0:
                return False, tokens, now
            bucket.tokens = min(burst, tokens - permits)
            return True, bucket.tokens, now


class MutationQuota:
    """The controller mutation quota of one request (Kafka's ``StrictControllerMutationQuota`` and
    ``PermissiveControllerMutationQuota``): ``record`` each topic's partitions, then ``throttle_time_ms``."""

    def __init__(self, manager, quota, tags, strict):
        self._manager, self._quota, self._tags, self._strict = manager, quota, tags, strict
        self._throttle_ms, self._recorded_at = 0, 0.0

    def record(self, permits):
        """Take ``permits`` partitions; ``ThrottlingQuotaExceeded`` when a strict quota is exhausted."""
        accepted, tokens, now = self._manager._record(self._quota, self._tags, permits, self._strict)
        if tokens < 0:
            self._throttle_ms = math.inf if self._quota == 0 else round(-tokens / self._quota * 1000)
            self._recorded_at = now
        if not accepted:
            raise ThrottlingQuotaExceeded()

    def throttle_time_ms(self):
        """How long the client is throttled: the time until its bucket is back at zero, less the time since."""
        if not self._throttle_ms:
            return 0
        if self._throttle_ms == math.inf:       # a quota of 0: never back, held for the longest window Kafka uses
            return round(self._manager.samples * self._manager.window * 1000)
        elapsed_ms = (self._manager.clock() - self._recorded_at) * 1000
        return max(0, round(self._throttle_ms - elapsed_ms))

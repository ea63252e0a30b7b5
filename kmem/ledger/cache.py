"""PidCache: KIP-1044's write-through cache in front of a PidLedger.

Bounded (least recently used entries go first), thread-safe, and it remembers misses too, so a
producer id asked for again and again costs the ledger one read. Writes go to the ledger first and
then to the cache, so the cache never holds what the ledger does not.
"""
import threading
from collections import OrderedDict

from kmem.errors import InvalidArgumentError

_MISSING = object()


class PidCache:
    def __init__(self, ledger, max_entries):
        """``ledger``: a PidLedger (anything with its ``read``, ``update`` and ``expired``);
        ``max_entries``: how many producer ids (entries and remembered misses) the cache holds."""
        if not all(callable(getattr(ledger, name, None)) for name in ("read", "update", "expired")):
            raise InvalidArgumentError(f"ledger must be a PidLedger (read, update, expired): {ledger!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InvalidArgumentError(f"max_entries must be an integer of at least 1: {max_entries!r}")
        self.ledger = ledger
        self.max_entries = max_entries
        self._entries = OrderedDict()      # pid -> ProducerEntry, or None for a known miss
        self._reading = {}                 # pid -> token of the ledger read in flight; a put removes it
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, pid):
        """The producer's entry (from the cache, else the ledger), or None."""
        with self._lock:
            entry = self._entries.get(pid, _MISSING)
            if entry is not _MISSING:
                if entry is not None and self.ledger.expired(entry):
                    entry = self._entries[pid] = None          # the ledger reads it as absent now
                self._entries.move_to_end(pid)
                self.hits += 1
                return entry
            self.misses += 1
            token = self._reading[pid] = object()
        entry = _MISSING
        try:
            entry = self.ledger.read(pid)
        finally:
            with self._lock:
                # Store the result only if no put for this pid came in meanwhile (even one evicted since).
                if self._reading.get(pid) is token:
                    del self._reading[pid]
                    if entry is not _MISSING:
                        self._store(pid, entry)
        return entry

    def put(self, entry):
        """Write through: the ledger first, then the cache. Returns the entry as the ledger stored it.

        Puts for one producer id must not race each other (Kafka serialises a partition's appends);
        the cache lock is not held across the ledger write, so a flush never stalls cache readers.
        """
        entry = self.ledger.update(entry)
        with self._lock:
            self._reading.pop(entry.producer_id, None)
            self._store(entry.producer_id, entry)
        return entry

    def _store(self, pid, entry):
        self._entries[pid] = entry
        self._entries.move_to_end(pid)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self):
        return len(self._entries)

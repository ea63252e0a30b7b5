"""Helpers for the transaction coordinator's tests: a recording double of ``TxnMarkerWriter``, a settable
clock, and coordinators made on one ``LogManager`` (``coordinator_env``)."""
import contextlib
import threading

from broker_helpers import wait_for
from kmem.broker import LogManager
from kmem.broker.codes import ErrorCode
from kmem.broker.timer import Timer
from kmem.broker.txn.coordinator import TransactionCoordinator, TxnConfig
from kmem.protocol import ApiKey, RequestHeader, messages


class RecordingMarkers:
    """A ``TxnMarkerWriter`` double: records each write; ``fail`` partitions answer KAFKA_STORAGE_ERROR,
    ``refused`` ones (partition -> error code) their code."""

    def __init__(self):
        self.writes = []
        self.fail = set()
        self.refused = {}
        self.lock = threading.Lock()

    def write(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions):
        with self.lock:
            self.writes.append((producer_id, producer_epoch, commit, tuple(partitions)))
            return {tp: ErrorCode.KAFKA_STORAGE_ERROR if tp in self.fail else self.refused.get(tp, ErrorCode.NONE)
                    for tp in partitions}


class Clock:
    def __init__(self):
        self.now = 1_700_000_000_000

    def __call__(self):
        return self.now


@contextlib.contextmanager
def coordinator_env(directory):
    """``(logs, make)``: a ``LogManager`` in ``directory`` with topic "t" (3 partitions), and ``make(**settings)``
    making a ``TransactionCoordinator`` on it (``TxnConfig`` settings, ``clock=`` a ``Clock``; its ``clock``
    attribute is that clock). Everything made is closed at the end."""
    timer = Timer()
    logs = LogManager(directory)
    logs.create_topic("t", 3)
    made = []

    def make(**settings):
        clock = settings.pop("clock", None) or Clock()
        coordinator = TransactionCoordinator(logs, TxnConfig(**settings), timer=timer, markers=RecordingMarkers(),
                                             clock=clock)
        coordinator.clock = clock
        made.append(coordinator)
        return coordinator
    try:
        yield logs, make
    finally:
        for coordinator in made:
            coordinator.close()
        timer.close()
        logs.close()


def settle(coordinator):
    wait_for(lambda: coordinator.markers_pending() == 0, "the markers and completion written")


def begin(coordinator, tid="tx", partitions=(("t", 0),)):
    error, pid, epoch = coordinator.init_producer(tid, 60000)
    assert error == ErrorCode.NONE
    assert coordinator.add_partitions(tid, pid, epoch, set(partitions)) == ErrorCode.NONE
    return pid, epoch


def describe(coordinator, tid):
    response = coordinator.describe_transactions(RequestHeader(ApiKey.DESCRIBE_TRANSACTIONS, 0, 1, "c"),
                                                 messages.DescribeTransactionsRequest(transactional_ids=[tid]))
    return response.transaction_states[0]

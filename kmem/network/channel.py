"""``KafkaChannel``: one connection's transport, its receive and send in progress, and its mute state.

Two kinds of mute share Kafka's state machine: the *explicit* mute that keeps one request in flight per
connection (the selector remembers those), and the *memory* mute a channel applies to itself when the
pool refuses its receive. The selector lifts memory mutes when the pool recovers; explicit ones stay.
A client over its quota is throttled as KIP-219 has it: its response goes out at once, and the channel
stays muted until the throttle ends as well as the response is sent (the ``THROTTLE_*`` states).
"""
import enum
import selectors

from kmem.errors import IllegalStateError
from kmem.network.receive import UNLIMITED, NetworkReceive
from kmem.network.sasl import ANONYMOUS
from kmem.pool import NONE
from kmem.send import close_send


class ChannelMuteState(enum.Enum):
    """Kafka's mute states."""
    # Members are singletons compared by identity: an identity hash spares Enum's Python-level __hash__
    # on every request's two transitions.
    __hash__ = object.__hash__
    NOT_MUTED = "NOT_MUTED"
    MUTED = "MUTED"
    MUTED_AND_RESPONSE_PENDING = "MUTED_AND_RESPONSE_PENDING"
    MUTED_AND_THROTTLED = "MUTED_AND_THROTTLED"
    MUTED_AND_THROTTLED_AND_RESPONSE_PENDING = "MUTED_AND_THROTTLED_AND_RESPONSE_PENDING"


class ChannelMuteEvent(enum.Enum):
    __hash__ = object.__hash__
    REQUEST_RECEIVED = "REQUEST_RECEIVED"
    RESPONSE_SENT = "RESPONSE_SENT"
    THROTTLE_STARTED = "THROTTLE_STARTED"
    THROTTLE_ENDED = "THROTTLE_ENDED"


_S = ChannelMuteState
_E = ChannelMuteEvent
# Kafka's transitions; every other (state, event) pair is an error.
_TRANSITIONS = {
    (_S.MUTED, _E.REQUEST_RECEIVED): _S.MUTED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_RESPONSE_PENDING, _E.RESPONSE_SENT): _S.MUTED,
    (_S.MUTED_AND_RESPONSE_PENDING, _E.THROTTLE_STARTED): _S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, _E.RESPONSE_SENT): _S.MUTED_AND_THROTTLED,
    (_S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, _E.THROTTLE_ENDED): _S.MUTED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_THROTTLED, _E.THROTTLE_ENDED): _S.MUTED,
}


class KafkaChannel:
    """A connection as the selector sees it.

    A *priority* channel (KIP-81) reads its frames into memory outside the pool, so it is never refused
    memory and never memory-muted: a coordinator or heartbeat connection keeps working when the pool is
    exhausted by bulk data.
    """

    def __init__(self, channel_id, transport, pool=NONE, max_receive_size=UNLIMITED, priority=False):
        self.id = channel_id
        self.transport = transport
        self.priority = priority
        self.pool = NONE if priority else pool
        self.max_receive_size = max_receive_size
        self.mute_state = ChannelMuteState.NOT_MUTED
        self.receive = None
        self.send = None
        self.closed = False
        self.authenticator = None       # a SASL listener's: frames go to it until it is complete (kmem.network.sasl)
        self.peer_principal = ANONYMOUS     # on an SSL listener, its client certificate's (kmem.network.ssl_principal)
        self.listener = None            # a server's: the listener it came in on (kmem.network.server.ListenerConfig)
        self.on_close = None            # called once, when the channel closes
        self.client_software = ("", "")     # (name, version) its ApiVersions v3+ gave (KIP-511), for its handler

    @property
    def principal(self):
        """``User:<name>`` once SASL authenticated (None before), else ``peer_principal``: its client certificate's
        on an SSL listener, ``User:ANONYMOUS`` without one."""
        return self.peer_principal if self.authenticator is None else self.authenticator.principal

    @property
    def authenticating(self):
        return self.authenticator is not None and not self.authenticator.complete

    @property
    def ready(self):
        return self.transport.ready

    @property
    def muted(self):
        return self.mute_state is not ChannelMuteState.NOT_MUTED

    @property
    def has_bytes_buffered(self):
        return self.transport.has_bytes_buffered

    def is_in_mutable_state(self):
        """True when a memory mute may be applied or lifted: a receive has begun, has no memory yet, and
        the transport is ready (a TLS handshake cannot be paused)."""
        return self.receive is not None and not self.receive.memory_allocated and self.transport.ready

    def mute(self):
        if self.mute_state is ChannelMuteState.NOT_MUTED:
            self.mute_state = ChannelMuteState.MUTED

    def maybe_unmute(self):
        """Unmute unless a response is pending; returns whether the channel is unmuted."""
        if self.mute_state is ChannelMuteState.MUTED:
            self.mute_state = ChannelMuteState.NOT_MUTED
        return self.mute_state is ChannelMuteState.NOT_MUTED

    def handle_mute_event(self, event):
        try:
            self.mute_state = _TRANSITIONS[self.mute_state, event]
        except KeyError:
            raise IllegalStateError(
                f"channel {self.id}: cannot handle {event.name} in mute state {self.mute_state.name}") from None

    @property
    def events(self):
        """What the selector should wait for on this channel's socket."""
        if not self.transport.ready:
            return self.transport.events
        events = 0 if self.muted else selectors.EVENT_READ
        if self.send is not None:
            events |= selectors.EVENT_WRITE
        return events

    def prepare(self):
        """Advance the handshake; returns True when the channel became ready by this call."""
        if self.transport.ready:
            return False
        self.transport.handshake()
        return self.transport.ready

    def read(self):
        """Read towards the current receive; mutes the channel when the pool refuses memory."""
        if self.receive is None:
            self.receive = NetworkReceive(self.id, self.max_receive_size, self.pool)
        n = self.receive.read_from(self.transport)
        if self.receive.waiting_for_memory and self.is_in_mutable_state():
            self.mute()
        return n

    def maybe_complete_receive(self):
        """The finished receive (ownership passes to the caller), or None."""
        if self.receive is not None and self.receive.complete:
            receive, self.receive = self.receive, None
            return receive
        return None

    def set_send(self, send):
        if self.send is not None:
            raise IllegalStateError(f"channel {self.id}: a send is already in progress")
        self.send = send

    def write(self):
        """Write towards the current send; returns it once completed, else None."""
        send = self.send
        if send is None:
            return None
        send.write_to(self.transport)
        if send.completed:
            self.send = None
            return send
        return None

    def close(self):
        """Close the socket and release the memory of a partial receive and what an unfinished send holds
        (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.receive is not None:
            self.receive.close()
            self.receive = None
        if self.send is not None:
            close_send(self.send)
            self.send = None
        self.transport.close()
        if self.on_close is not None:
            self.on_close()

    def __repr__(self):
        return f"<KafkaChannel {self.id} {self.mute_state.name}{' priority' if self.priority else ''}>"

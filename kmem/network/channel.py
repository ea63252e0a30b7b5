"""``KafkaChannel``: one connection's transport, its receive and send in progress, and its mute state.

Two kinds of mute share Kafka's state machine: the *explicit* mute that keeps one request in flight per
connection (the selector remembers those), and the *memory* mute a channel applies to itself when the
pool refuses its receive. The selector lifts memory mutes when the pool recovers; explicit ones stay.
A client over its quota is throttled as KIP-219 has it: its response goes out at once, and the channel
stays muted until the throttle ends as well as the response is sent (the ``THROTTLE_*`` states).

The selector asks a channel a dozen things per request, so the channel is compiled (``kmem/_channel.pxi``);
its states and their transitions are here.
"""
import enum

from kmem._core import KafkaChannel

__all__ = ["ChannelMuteEvent", "ChannelMuteState", "KafkaChannel", "MUTE_TRANSITIONS"]


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
MUTE_TRANSITIONS = {
    (_S.MUTED, _E.REQUEST_RECEIVED): _S.MUTED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_RESPONSE_PENDING, _E.RESPONSE_SENT): _S.MUTED,
    (_S.MUTED_AND_RESPONSE_PENDING, _E.THROTTLE_STARTED): _S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, _E.RESPONSE_SENT): _S.MUTED_AND_THROTTLED,
    (_S.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING, _E.THROTTLE_ENDED): _S.MUTED_AND_RESPONSE_PENDING,
    (_S.MUTED_AND_THROTTLED, _E.THROTTLE_ENDED): _S.MUTED,
}

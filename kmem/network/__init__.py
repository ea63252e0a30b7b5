"""kmem's network layer (KIP-72, KIP-81): size-prefixed frames read into pool memory, channels muted when
the pool is exhausted, a selector that wakes when memory returns, and a socket server that handles each
request on the thread that read it (deferring those that wait or block).
"""
from kmem.network.channel import ChannelMuteEvent, ChannelMuteState, KafkaChannel
from kmem.network.receive import UNLIMITED, NetworkReceive, NetworkSend
from kmem.network.sasl import SaslAuthenticator, SaslChannelBuilder
from kmem.network.selector import Selector
from kmem.network.quotas import ConnectionQuotas
from kmem.network.server import Deferred, ListenerConfig, Request, SocketServer, SocketServerConfig, offloaded
from kmem.network.transport import PlaintextTransport, TlsTransport

__all__ = [
    "UNLIMITED", "NetworkReceive", "NetworkSend", "PlaintextTransport", "TlsTransport", "ChannelMuteState",
    "ChannelMuteEvent", "KafkaChannel", "Selector", "Request", "Deferred", "offloaded",
    "SocketServer", "SocketServerConfig", "ListenerConfig", "ConnectionQuotas", "SaslChannelBuilder",
    "SaslAuthenticator",
]

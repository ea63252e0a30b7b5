"""kmem's network layer (KIP-72, KIP-81): size-prefixed frames read into pool memory, channels muted when
the pool is exhausted, a selector that wakes when memory returns, and a threaded socket server.
"""
from kmem.network.channel import ChannelMuteEvent, ChannelMuteState, KafkaChannel
from kmem.network.receive import UNLIMITED, NetworkReceive, NetworkSend
from kmem.network.selector import Selector
from kmem.network.server import Request, SocketServer, SocketServerConfig
from kmem.network.transport import PlaintextTransport, TlsTransport

__all__ = [
    "UNLIMITED", "NetworkReceive", "NetworkSend", "PlaintextTransport", "TlsTransport", "ChannelMuteState",
    "ChannelMuteEvent", "KafkaChannel", "Selector", "Request",
    "SocketServer", "SocketServerConfig",
]

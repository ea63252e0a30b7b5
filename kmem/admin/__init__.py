"""Operating tools: a small admin client that talks to any Kafka broker over the protocol
(``AdminClient``, ``kmem.admin.client``), and the commands built on it (``kmem topics``, ``groups``, ``produce``,
``consume``: ``kmem.admin.commands``). Importing the package imports neither, so ``kmem --help`` stays light."""

__all__ = ["AdminClient", "AdminError"]


def __getattr__(name):
    if name in __all__:
        from kmem.admin import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

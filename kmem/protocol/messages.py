"""The message classes, one per request and response, built from Kafka's schemas on first use:
``kmem.protocol.messages.FetchResponse``, its structs as attributes (``FetchResponse.PartitionData``).

A class holds every field of every version (snake_case of the schema's names); a field absent from
the version being encoded is ignored, and one absent from the version decoded keeps its default.
"""
from .api import ApiKey, message_class

_BY_NAME = {f"{key.message_name}{kind}": (key, kind) for key in ApiKey for kind in ("Request", "Response")}
__all__ = sorted(_BY_NAME)


def __getattr__(name):
    try:
        api_key, kind = _BY_NAME[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    cls = message_class(api_key, kind)
    globals()[name] = cls
    return cls


def __dir__():
    return __all__

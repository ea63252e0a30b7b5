"""DescribeClientQuotas and AlterClientQuotas 0-1 (KIP-546; what ``kafka-configs --entity-type users/clients/ips``
and AdminClient's ``describeClientQuotas``/``alterClientQuotas`` send), over ``kmem.broker.quotas.ClientQuotaStore``.

A filter Kafka refuses answers the whole DescribeClientQuotas with its error (INVALID_REQUEST, UNSUPPORTED_VERSION
for an unknown entity type) and no entries. An AlterClientQuotas entry Kafka refuses (an unknown entity type or key,
a value that is negative, not finite or not whole for a byte rate, an IP with a user or client id) fails alone with
INVALID_REQUEST; the others are written together to ``client_quotas.json`` (fsync): AlterClientQuotas runs on an io
thread (``kmem.broker.apis.dispatch``). Who may call them (DESCRIBE_CONFIGS or ALTER_CONFIGS on the cluster) is
``kmem.broker.apis.authorize``'s check.
"""
import logging

from kmem.broker.codes import ErrorCode
from kmem.broker.quotas import QuotaRequestError
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)

QUOTA_APIS = {ApiKey.DESCRIBE_CLIENT_QUOTAS: "describe_client_quotas",
              ApiKey.ALTER_CLIENT_QUOTAS: "alter_client_quotas"}
QUOTA_VERSIONS = {key: (0, 1) for key in QUOTA_APIS}


class ClientQuotaHandlers:
    """The quota APIs over ``store`` (a ``ClientQuotaStore``)."""

    def __init__(self, store):
        self.store = store

    def describe_client_quotas(self, header, request):
        Response = messages.DescribeClientQuotasResponse
        try:
            matched = self.store.describe([(c.entity_type, c.match_type, c.match) for c in request.components],
                                          request.strict)
        except QuotaRequestError as e:
            return Response(throttle_time_ms=0, error_code=e.code, error_message=str(e), entries=None)
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, entries=[
            Response.EntryData(entity=[Response.EntityData(entity_type=entity_type, entity_name=name)
                                       for entity_type, name in key],
                               values=[Response.ValueData(key=name, value=value) for name, value in values.items()])
            for key, values in matched])

    def alter_client_quotas(self, header, request):
        Response = messages.AlterClientQuotasResponse
        entries = [([(e.entity_type, e.entity_name) for e in entry.entity],
                    [(op.key, op.value, op.remove) for op in entry.ops]) for entry in request.entries]
        try:
            results = self.store.alter(entries, request.validate_only)
        except OSError as e:                # nothing was written: every entry fails
            log.error("could not write the client quotas to %s: %s", self.store.path, e)
            results = [(ErrorCode.UNKNOWN_SERVER_ERROR, f"client quotas not written: {e}")] * len(entries)
        else:
            if not request.validate_only:
                for (pairs, ops), (code, _) in zip(entries, results):
                    if code == ErrorCode.NONE:
                        log.info("client quotas of %s altered: %s", dict(pairs), ops)
        return Response(throttle_time_ms=0, entries=[
            Response.EntryData(error_code=code, error_message=message, entity=[
                Response.EntityData(entity_type=entity_type, entity_name=name) for entity_type, name in pairs])
            for (pairs, _), (code, message) in zip(entries, results)])

"""DescribeAcls, CreateAcls and DeleteAcls 0-3 (KIP-11, KIP-290 patterns; what ``kafka-acls`` and AdminClient's
``createAcls``/``describeAcls``/``deleteAcls`` send), as Kafka's ``AclApis`` and ``AclControlManager`` answer them.

Without an authorizer (``authorizer.class.name`` unset) each is answered SECURITY_DISABLED, as Kafka does. A
creation Kafka refuses (an UNKNOWN or ANY field, a MATCH pattern, an empty name, a CLUSTER resource not named
``kafka-cluster``, a principal that is not ``Type:name``) fails alone with INVALID_REQUEST; the others are written
together. A filter with an UNKNOWN field fails alone; every binding the other filters match is deleted in one
write. Who may call them (ALTER or DESCRIBE on the cluster) is ``kmem.broker.apis.authorize``'s check. Creations
and deletions write ``acls.json`` (fsync): they run on an io thread (``kmem.broker.apis.dispatch``).
"""
import logging

from kmem.broker.codes import ErrorCode
from kmem.broker.security.authorizer import AclBinding, AclBindingFilter
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)

ACL_APIS = {ApiKey.DESCRIBE_ACLS: "describe_acls", ApiKey.CREATE_ACLS: "create_acls",
            ApiKey.DELETE_ACLS: "delete_acls"}
ACL_VERSIONS = {key: (0, 3) for key in ACL_APIS}
NO_AUTHORIZER = "No Authorizer is configured."


def _filter(request):
    return AclBindingFilter.of(request.resource_type_filter, request.resource_name_filter, request.pattern_type_filter,
                               request.principal_filter, request.host_filter, request.operation,
                               request.permission_type)


class AclHandlers:
    """The ACL APIs over ``authorizer`` (a ``StandardAuthorizer``, or None)."""

    def __init__(self, authorizer):
        self.authorizer = authorizer

    def describe_acls(self, header, request):
        Response = messages.DescribeAclsResponse
        if self.authorizer is None:
            return Response(throttle_time_ms=0, error_code=ErrorCode.SECURITY_DISABLED,
                            error_message="No Authorizer is configured on the broker", resources=[])
        acl_filter = _filter(request)
        error = acl_filter.validation_error()
        if error is not None:
            return Response(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, error_message=error,
                            resources=[])
        resources = {}
        for acl in self.authorizer.acls(acl_filter):
            resources.setdefault((acl.resource_type, acl.name, acl.pattern_type), []).append(
                Response.AclDescription(principal=acl.principal, host=acl.host, operation=acl.operation,
                                        permission_type=acl.permission))
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, resources=[
            Response.DescribeAclsResource(resource_type=resource_type, resource_name=name, pattern_type=pattern_type,
                                          acls=acls)
            for (resource_type, name, pattern_type), acls in resources.items()])

    def create_acls(self, header, request):
        Response = messages.CreateAclsResponse
        Result = Response.AclCreationResult
        if self.authorizer is None:
            return Response(throttle_time_ms=0, results=[
                Result(error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER) for _ in request.creations])
        bindings = [AclBinding.of(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host,
                                  c.operation, c.permission_type) for c in request.creations]
        errors = [binding.validation_error() for binding in bindings]
        results = [Result(error_code=ErrorCode.INVALID_REQUEST if error else ErrorCode.NONE, error_message=error)
                   for error in errors]
        valid = [binding for binding, error in zip(bindings, errors) if error is None]
        try:
            self.authorizer.create(valid)
        except OSError as e:                # nothing was written: every valid creation fails
            log.error("could not write the ACLs to %s: %s", self.authorizer.path, e)
            for result, error in zip(results, errors):
                if error is None:
                    result.error_code, result.error_message = ErrorCode.UNKNOWN_SERVER_ERROR, f"ACLs not written: {e}"
        else:
            for binding in valid:
                log.info("ACL created: %s", binding)
        return Response(throttle_time_ms=0, results=results)

    def delete_acls(self, header, request):
        Response = messages.DeleteAclsResponse
        Result, Matching = Response.DeleteAclsFilterResult, Response.DeleteAclsMatchingAcl
        if self.authorizer is None:
            return Response(throttle_time_ms=0, filter_results=[
                Result(error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER, matching_acls=[])
                for _ in request.filters])
        filters = [_filter(f) for f in request.filters]
        errors = [f.validation_error() for f in filters]
        try:
            deleted = iter(self.authorizer.delete([f for f, error in zip(filters, errors) if error is None]))
        except OSError as e:
            log.error("could not write the ACLs to %s: %s", self.authorizer.path, e)
            return Response(throttle_time_ms=0, filter_results=[
                Result(error_code=ErrorCode.INVALID_REQUEST if error else ErrorCode.UNKNOWN_SERVER_ERROR,
                       error_message=error or f"ACLs not written: {e}", matching_acls=[]) for error in errors])
        results = []
        for error in errors:
            if error is not None:
                results.append(Result(error_code=ErrorCode.INVALID_REQUEST, error_message=error, matching_acls=[]))
                continue
            acls = next(deleted)
            for acl in acls:
                log.info("ACL deleted: %s", acl)
            results.append(Result(error_code=ErrorCode.NONE, error_message=None, matching_acls=[
                Matching(error_code=ErrorCode.NONE, error_message=None, resource_type=acl.resource_type,
                         resource_name=acl.name, pattern_type=acl.pattern_type, principal=acl.principal,
                         host=acl.host, operation=acl.operation, permission_type=acl.permission) for acl in acls]))
        return Response(throttle_time_ms=0, filter_results=results)

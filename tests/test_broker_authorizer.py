"""The authorizer's decisions as Kafka's StandardAuthorizer makes them: literal, wildcard and prefixed patterns,
DENY over ALLOW, implied operations, super users, allow.everyone.if.no.acl.found, authorizeByResourceType
(KIP-679), the filters of DescribeAcls and DeleteAcls, the file the ACLs persist in, the audit log."""
import errno
import json
import logging
import os
import random

import pytest

from kmem.broker.security.authorizer import (ACLS_FILE, AclBinding, AclBindingFilter, AuthorizerConfig,
                                             Operation, PatternType, Permission, ResourceType, StandardAuthorizer)
from kmem.errors import ConfigError

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
HOST = "127.0.0.1"


def acl(name, operation, permission=ALLOW, principal="User:alice", pattern=LITERAL, resource=TOPIC, host="*"):
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


def authorizer(tmp_path, *acls, **config):
    result = StandardAuthorizer(tmp_path, AuthorizerConfig(**config))
    result.create(list(acls))
    return result


def allowed(auth, name, operation, principal="User:alice", resource=TOPIC, host=HOST):
    return auth.authorize(principal, host, operation, resource, name)


def test_literal_prefixed_and_wildcard_patterns(tmp_path):
    auth = authorizer(tmp_path, acl("orders-eu", Operation.READ), acl("orders-", Operation.WRITE, pattern=PREFIXED),
                      acl("*", Operation.DESCRIBE, principal="User:bob"))
    assert allowed(auth, "orders-eu", Operation.READ)
    assert not allowed(auth, "orders-us", Operation.READ)
    assert allowed(auth, "orders-us", Operation.WRITE) and allowed(auth, "orders-", Operation.WRITE)
    assert not allowed(auth, "orders", Operation.WRITE)          # shorter than the prefix
    assert not allowed(auth, "orders-eu", Operation.WRITE, principal="User:bob")
    assert allowed(auth, "anything", Operation.DESCRIBE, principal="User:bob")
    assert not allowed(auth, "anything", Operation.DESCRIBE, resource=GROUP, principal="User:bob")


def test_a_literal_name_is_not_a_prefix(tmp_path):
    auth = authorizer(tmp_path, acl("orders", Operation.READ))
    assert not allowed(auth, "orders-eu", Operation.READ)


def test_deny_wins_over_allow_from_any_pattern(tmp_path):
    auth = authorizer(tmp_path, acl("orders-", Operation.WRITE, pattern=PREFIXED),
                      acl("orders-secret", Operation.WRITE, DENY),
                      acl("orders-x", Operation.ALL, DENY, pattern=PREFIXED))
    assert allowed(auth, "orders-eu", Operation.WRITE)
    assert not allowed(auth, "orders-secret", Operation.WRITE)
    assert not allowed(auth, "orders-xy", Operation.WRITE)
    auth.create([acl("*", Operation.WRITE, DENY, principal="User:*")])
    assert not allowed(auth, "orders-eu", Operation.WRITE)


def test_implied_operations_only_from_allow(tmp_path):
    auth = authorizer(tmp_path, *(acl(f"t{op}", op) for op in (Operation.READ, Operation.WRITE, Operation.DELETE,
                                                               Operation.ALTER, Operation.CREATE)),
                      acl("configs", Operation.ALTER_CONFIGS), acl("denied", Operation.ALL),
                      acl("denied", Operation.READ, DENY))
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert allowed(auth, f"t{op}", Operation.DESCRIBE)
    assert not allowed(auth, f"t{Operation.CREATE}", Operation.DESCRIBE)
    assert not allowed(auth, f"t{Operation.READ}", Operation.WRITE)
    assert allowed(auth, "configs", Operation.DESCRIBE_CONFIGS)
    assert not allowed(auth, "configs", Operation.DESCRIBE)
    # a DENY of READ denies READ, not the DESCRIBE that ALL allows
    assert not allowed(auth, "denied", Operation.READ)
    assert allowed(auth, "denied", Operation.DESCRIBE)


def test_principal_and_host(tmp_path):
    auth = authorizer(tmp_path, acl("t", Operation.READ, principal="User:*", host="10.0.0.1"),
                      acl("u", Operation.READ, host=HOST))
    assert allowed(auth, "t", Operation.READ, principal="User:anyone", host="10.0.0.1")
    assert not allowed(auth, "t", Operation.READ, host=HOST)
    assert allowed(auth, "u", Operation.READ) and not allowed(auth, "u", Operation.READ, host="10.0.0.2")


def test_super_users_and_no_acl_found(tmp_path):
    auth = authorizer(tmp_path, acl("t", Operation.READ, DENY, principal="User:*"),
                      super_users=frozenset({"User:admin"}))
    assert allowed(auth, "t", Operation.READ, principal="User:admin")
    assert not allowed(auth, "other", Operation.READ)
    open_auth = StandardAuthorizer(tmp_path, AuthorizerConfig(allow_if_no_acl=True))
    assert allowed(open_auth, "other", Operation.READ)                  # no ACL names it
    assert not allowed(open_auth, "t", Operation.READ)                  # an ACL names it


def test_authorize_by_resource_type(tmp_path):
    auth = authorizer(tmp_path, acl("orders-", Operation.WRITE, pattern=PREFIXED))
    assert auth.authorize_by_resource_type("User:alice", HOST, Operation.WRITE, TOPIC)
    assert not auth.authorize_by_resource_type("User:bob", HOST, Operation.WRITE, TOPIC)
    auth.create([acl("orders", Operation.WRITE, DENY, pattern=PREFIXED)])
    assert not auth.authorize_by_resource_type("User:alice", HOST, Operation.WRITE, TOPIC)
    auth.create([acl("other", Operation.WRITE)])
    assert auth.authorize_by_resource_type("User:alice", HOST, Operation.WRITE, TOPIC)
    auth.create([acl("*", Operation.WRITE, DENY)])
    assert not auth.authorize_by_resource_type("User:alice", HOST, Operation.WRITE, TOPIC)


def test_prefix_index_agrees_with_a_scan(tmp_path):
    """The bisection over sorted prefixes finds exactly the prefixes a scan of every ACL finds."""
    rng = random.Random(7)
    names = sorted({"".join(rng.choice("ab-") for _ in range(rng.randint(1, 6))) for _ in range(300)})
    auth = authorizer(tmp_path, *(acl(name, Operation.READ, pattern=PREFIXED) for name in names[::2]),
                      *(acl(name, Operation.READ, DENY, pattern=PREFIXED) for name in names[1::7]))
    for _ in range(2000):
        name = "".join(rng.choice("ab-") for _ in range(rng.randint(1, 8)))
        prefixes = [p for p in names if name.startswith(p)]
        expected = any(p in names[::2] for p in prefixes) and not any(p in names[1::7] for p in prefixes)
        assert allowed(auth, name, Operation.READ) == expected, name


def test_filters_match_as_kafka(tmp_path):
    literal, prefixed, wildcard = (acl("orders-eu", Operation.READ), acl("orders-", Operation.WRITE, pattern=PREFIXED),
                                   acl("*", Operation.DESCRIBE, principal="User:bob"))
    auth = authorizer(tmp_path, literal, prefixed, wildcard)

    def found(resource=ResourceType.ANY, name=None, pattern=PatternType.ANY, principal=None,
              operation=Operation.ANY, permission=Permission.ANY):
        return set(auth.acls(AclBindingFilter(resource, name, pattern, principal, None, operation, permission)))
    assert found() == {literal, prefixed, wildcard}
    assert found(name="orders-eu") == {literal}                          # ANY: the exact name
    assert found(name="orders-eu", pattern=PatternType.MATCH) == {literal, prefixed, wildcard}
    assert found(name="orders-", pattern=PREFIXED) == {prefixed}
    assert found(pattern=LITERAL) == {literal, wildcard}
    assert found(principal="User:bob") == {wildcard}
    assert found(operation=Operation.WRITE) == {prefixed}
    assert found(resource=GROUP) == set()
    assert auth.delete([AclBindingFilter(TOPIC, None, PatternType.ANY, "User:alice", None, Operation.ANY,
                                         Permission.ANY)]) == [[literal, prefixed]]
    assert found() == {wildcard}


def test_validation_as_acl_control_manager(tmp_path):
    def error(**changes):
        fields = dict(resource_type=TOPIC, name="t", pattern_type=LITERAL, principal="User:a", host="*",
                      operation=Operation.READ, permission=ALLOW)
        fields.update(changes)
        return AclBinding(**fields).validation_error()
    assert error() is None
    assert error(resource_type=ResourceType.ANY) == "Invalid resourceType ANY"
    assert error(pattern_type=PatternType.MATCH) == "Invalid patternType MATCH"
    assert error(operation=Operation.ANY) == "Invalid operation ANY"
    assert error(permission=Permission.ANY) == "Invalid permissionType ANY"
    assert error(name="") == "Resource name should not be empty"
    assert error(resource_type=CLUSTER, name="c") == "The only valid name for the CLUSTER resource is kafka-cluster"
    assert error(principal="") is not None and error(principal="alice") is not None
    assert AclBinding.of(2, "t", 3, "User:a", "*", 99, 3).operation == Operation.UNKNOWN


def test_acls_persist_as_access_control_entry_records(tmp_path):
    auth = authorizer(tmp_path, acl("orders-", Operation.WRITE, pattern=PREFIXED), acl("x", Operation.READ, DENY))
    auth.create([acl("x", Operation.READ, DENY)])           # already there: kept once
    document = json.loads((tmp_path / ACLS_FILE).read_text())
    assert sorted(document["acls"][0]) == sorted(["id", "resourceType", "resourceName", "patternType", "principal",
                                                  "host", "operation", "permissionType"])
    assert len(document["acls"]) == 2
    again = StandardAuthorizer(tmp_path)
    assert set(again.acls(AclBindingFilter.of(1, None, 1, None, None, 1, 1))) == set(auth.acls(
        AclBindingFilter.of(1, None, 1, None, None, 1, 1)))
    assert again.authorize("User:alice", HOST, Operation.WRITE, TOPIC, "orders-1")
    (tmp_path / ACLS_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable ACLs"):
        StandardAuthorizer(tmp_path)


def test_settings():
    assert AuthorizerConfig.from_settings({}) is None
    config = AuthorizerConfig.from_settings({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                                             "super.users": "User:admin; User:ops",
                                             "allow.everyone.if.no.acl.found": "true"})
    assert config == AuthorizerConfig(frozenset({"User:admin", "User:ops"}), True)
    with pytest.raises(ConfigError, match="authorizer.class.name"):
        AuthorizerConfig.from_settings({"authorizer.class.name": "com.example.Mine"})
    with pytest.raises(ConfigError, match="super.users"):
        AuthorizerConfig.from_settings({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                                        "super.users": "admin"})


def test_denials_logged_in_kafka_form(tmp_path, caplog):
    auth = authorizer(tmp_path, acl("t", Operation.READ, DENY), acl("v", Operation.READ))
    with caplog.at_level(logging.INFO, logger="kmem.authorizer"):
        assert not auth.authorize("User:alice", HOST, Operation.READ, TOPIC, "t", api="Fetch")
        assert not auth.authorize("User:alice", HOST, Operation.READ, TOPIC, "u", api="Fetch", log_if_denied=False)
    assert [r.getMessage() for r in caplog.records if r.name == "kmem.authorizer"] == [
        "Principal = User:alice is Denied operation = READ from host = 127.0.0.1 on resource = Topic:LITERAL:t for "
        "request = Fetch with resourceRefCount = 1 based on rule MatchingAcl(acl=StandardAcl(resourceType=TOPIC, "
        "resourceName=t, patternType=LITERAL, principal=User:alice, host=*, operation=READ, permissionType=DENY))"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kmem.authorizer"):
        assert auth.authorize("User:alice", HOST, Operation.READ, TOPIC, "v", api="Fetch")
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "kmem.authorizer"] == [(
        "DEBUG", "Principal = User:alice is Allowed operation = READ from host = 127.0.0.1 on resource = "
        "Topic:LITERAL:v for request = Fetch with resourceRefCount = 1 based on rule MatchingAcl(acl=StandardAcl("
        "resourceType=TOPIC, resourceName=v, patternType=LITERAL, principal=User:alice, host=*, operation=READ, "
        "permissionType=ALLOW))")]


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    """A full disk: the create or delete fails, the ACLs in force and on disk stay as they were, and the ACL APIs
    answer the failure per creation or filter."""
    from kmem.broker.apis.acls import AclHandlers
    from kmem.protocol import ApiKey, message_class
    kept = acl("kept", Operation.READ)
    auth = authorizer(tmp_path, kept)
    before = (tmp_path / ACLS_FILE).read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    Create = message_class(ApiKey.CREATE_ACLS, "Request")
    creations = [Create.AclCreation(resource_type=TOPIC, resource_name="new", resource_pattern_type=LITERAL,
                                    principal="User:alice", host="*", operation=Operation.READ, permission_type=ALLOW),
                 Create.AclCreation(resource_type=TOPIC, resource_name="", resource_pattern_type=LITERAL,
                                    principal="User:alice", host="*", operation=Operation.READ, permission_type=ALLOW)]
    results = AclHandlers(auth).create_acls(None, Create(creations=creations)).results
    assert [r.error_code for r in results] == [-1, 42]          # UNKNOWN_SERVER_ERROR, INVALID_REQUEST
    Delete = message_class(ApiKey.DELETE_ACLS, "Request")
    everything = Delete.DeleteAclsFilter(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                         principal_filter=None, host_filter=None, operation=1, permission_type=1)
    assert [r.error_code for r in AclHandlers(auth).delete_acls(None, Delete(filters=[everything])).filter_results] \
        == [-1]
    monkeypatch.undo()
    assert allowed(auth, "kept", Operation.READ) and not allowed(auth, "new", Operation.READ)
    assert (tmp_path / ACLS_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [ACLS_FILE]
    assert StandardAuthorizer(tmp_path).acls(AclBindingFilter.of(1, None, 1, None, None, 1, 1)) == [kept]

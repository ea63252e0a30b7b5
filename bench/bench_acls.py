"""The cost of an authorization decision with 10,000 ACLs (5,000 LITERAL, 5,000 PREFIXED, on topics, for 100
principals), side by side with a dictionary lookup among 10,000 names in the same run
(``.venv/bin/pytest bench/bench_acls.py``): each call decides for 1,000 topic names, those of a literal ACL, those
under a prefix, and those no ACL names (denied), as Kafka's ``StandardAuthorizer`` decides a Produce's topics.
"""
import random

import pytest

from kmem.broker.security.authorizer import (AclBinding, Operation, PatternType, Permission, ResourceType,
                                             StandardAuthorizer)

ACLS = 10_000
CHECKS = 1_000
PRINCIPALS = [f"User:user-{i}" for i in range(100)]
rng = random.Random(37)
LITERALS = [f"orders-{i:05d}" for i in range(ACLS // 2)]
PREFIXES = [f"team-{i:04d}-" for i in range(ACLS // 2)]
NAMES = {
    "literal": [rng.choice(LITERALS) for _ in range(CHECKS)],
    "prefixed": [rng.choice(PREFIXES) + f"topic-{rng.randrange(100)}" for _ in range(CHECKS)],
    "no ACL (denied)": [f"other-{rng.randrange(10**6)}" for _ in range(CHECKS)],
}


@pytest.fixture(scope="module")
def authorizer(tmp_path_factory):
    authorizer = StandardAuthorizer(tmp_path_factory.mktemp("acls"))
    owners = {}
    bindings = []
    for index, name in enumerate(LITERALS + PREFIXES):
        owners[name] = PRINCIPALS[index % len(PRINCIPALS)]
        pattern = PatternType.LITERAL if index < len(LITERALS) else PatternType.PREFIXED
        bindings.append(AclBinding(ResourceType.TOPIC, name, pattern, owners[name], "*", Operation.WRITE,
                                   Permission.ALLOW))
    authorizer.create(bindings)
    return authorizer, owners


def owner_of(owners, name):
    return owners.get(name) or owners.get(name[:len("team-0000-")]) or PRINCIPALS[0]


@pytest.mark.parametrize("case", NAMES)
def test_kmem_authorize(compare, authorizer, case):
    authorizer, owners = authorizer
    checks = [(owner_of(owners, name), name) for name in NAMES[case]]
    authorize = authorizer.authorize

    def run():
        for principal, name in checks:
            authorize(principal, "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, name, api="Produce")
    compare(f"authorize at {ACLS:,} ACLs: {case}", "kmem", run, CHECKS)
    expected = case != "no ACL (denied)"
    assert all(authorize(p, "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, n) == expected for p, n in checks)


@pytest.mark.parametrize("case", NAMES)
def test_dict_lookup(compare, case):
    table = {name: True for name in LITERALS + PREFIXES}
    names = NAMES[case]
    get = table.get

    def run():
        for name in names:
            get(name)
    compare(f"authorize at {ACLS:,} ACLs: {case}", "dict.get among 10,000 names", run, CHECKS)

"""The "authorized operations" bit fields of Metadata, DescribeCluster and DescribeGroups (KIP-430).

Without an authorizer kmem broker answers as Kafka's ``AuthHelper.authorizedOperations`` does without one: every
operation ``AclEntry.supportedOperations`` lists for the resource type, with bit ``AclOperation.code`` set. With
one (``authorizer.class.name``), ``kmem.broker.apis.authorize`` replaces them by the operations the ACLs allow.
A response carries the field only when the request asks for it; otherwise the field keeps its schema default,
-2**31 (``Int.MinValue``).
"""

# Kafka's AclOperation codes
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12


def _bit_field(*operations):
    return sum(1 << operation for operation in operations)


# Kafka 3.9's AclEntry.supportedOperations per resource type
TOPIC_OPERATIONS = _bit_field(READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)
GROUP_OPERATIONS = _bit_field(READ, DESCRIBE, DELETE)
CLUSTER_OPERATIONS = _bit_field(CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER,
                                DESCRIBE)

"""Racks on kmem broker, as Kafka treats them: ``broker.rack`` is the broker's rack in Metadata and DescribeCluster;
a KIP-848 member's rack (the heartbeat's RackId) is kept and described, and the server-side assignors give the same
assignment whatever the racks, as Kafka's ``UniformAssignor`` and ``RangeAssignor`` do (they do not read them; a
single broker puts every partition on its one rack anyway)."""
import pytest

from broker_helpers import RawConnection
from group_helpers import start_broker
from kmem.broker.group.coordinator import GroupConfig, GroupCoordinator
from kmem.protocol import ApiKey, messages
from test_broker_consumer_groups import Members


@pytest.mark.parametrize("rack", ["rack-a", None])
def test_the_broker_rack_in_metadata_and_describe_cluster(tmp_path, rack):
    broker = start_broker(tmp_path, **({"broker.rack": rack} if rack else {}))
    try:
        with RawConnection(broker.bootstrap_servers) as connection:
            metadata = connection.call(ApiKey.METADATA, 12, messages.MetadataRequest(
                topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            cluster = connection.call(ApiKey.DESCRIBE_CLUSTER, 0, messages.DescribeClusterRequest(
                include_cluster_authorized_operations=False))
        assert [b.rack for b in metadata.brokers] == [b.rack for b in cluster.brokers] == [rack]
    finally:
        broker.close()


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_the_assignment_does_not_depend_on_the_members_racks(tmp_path, assignor):
    from kmem.broker import LogManager
    with LogManager(tmp_path) as logs:
        logs.create_topic("t", 4)
        targets = []
        for racks in (("rack-a", "rack-b", None), (None, None, None), ("rack-b", "rack-b", "rack-a")):
            coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3))
            try:
                members = Members(coordinator, logs, group_id=f"g{len(targets)}")
                for member_id, rack in zip("abc", racks):
                    assert members.join(member_id, rack_id=rack, server_assignor=assignor).error_code == 0
                described = members.describe()
                assert {m.member_id: m.rack_id for m in described.members} == dict(zip("abc", racks))
                targets.append({m.member_id: m.target_assignment.topic_partitions[0].partitions
                                for m in described.members if m.target_assignment.topic_partitions})
            finally:
                coordinator.close()
        assert targets[0] == targets[1] == targets[2] and sum(map(len, targets[0].values())) == 4

"""The server-side assignors of KIP-848 consumer groups (Kafka's ``group.consumer.assignors``): ``uniform`` and
``range``, as Kafka's ``UniformAssignor`` and ``RangeAssignor`` define their results.

An assignor maps ``members`` ({member id: ``AssignmentMember``}) and ``topics`` ({topic id: partition count}, the
subscribed topics that exist) to the target assignment, {member id: {topic id: frozenset of partitions}}; every
member is in the result, with {} when it gets nothing. Both are sticky where they can be: a member keeps the
partitions of its current target assignment that its share allows, so a member joining or leaving moves as few
partitions as the new balance needs.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class AssignmentMember:
    subscribed: frozenset          # topic ids the member subscribes to (that exist)
    current: dict                  # its current target: {topic id: frozenset of partitions}


def _result(members, assigned):
    return {member_id: {topic: frozenset(parts) for topic, parts in assigned[member_id].items() if parts}
            for member_id in members}


def uniform(members, topics):
    """Kafka's ``UniformAssignor``: every partition of the subscribed topics goes to one of its subscribers, so
    that the members' counts differ by one at most where subscriptions allow. With identical subscriptions the
    quota is exact (``partitions // members``, one more for the first ``partitions % members``) and members keep
    their current partitions within it; with different ones the partitions of the topics with fewest subscribers
    go first, each to its least loaded subscriber (its current owner when that one is among the least loaded)."""
    subscribers = {topic: sorted(m for m, member in members.items() if topic in member.subscribed) for topic in topics}
    owner_of = {(topic, p): member_id for member_id, member in members.items()
                for topic, parts in member.current.items() for p in parts}
    assigned = {member_id: {} for member_id in members}
    count = dict.fromkeys(members, 0)

    def give(member_id, topic, p):
        assigned[member_id].setdefault(topic, set()).add(p)
        count[member_id] += 1

    if len({member.subscribed for member in members.values()}) > 1:
        order = sorted(topics, key=lambda topic: (len(subscribers[topic]), str(topic)))
        for topic in order:
            for p in range(topics[topic]):
                candidates = subscribers[topic]
                if not candidates:
                    continue
                least = min(count[m] for m in candidates)
                owner = owner_of.get((topic, p))
                if owner not in candidates or count[owner] > least:
                    owner = min(candidates, key=lambda m: (count[m], m))
                give(owner, topic, p)
        return _result(members, assigned)
    partitions = [(topic, p) for topic in sorted(topics, key=str) for p in range(topics[topic]) if subscribers[topic]]
    if not members:
        return {}
    base, extra = divmod(len(partitions), len(members))
    # the members keeping most of their partitions get the extra one (fewest moves)
    order = sorted(members, key=lambda m: (-sum(len(p) for p in members[m].current.values()), m))
    quota = {member_id: base + (1 if i < extra else 0) for i, member_id in enumerate(order)}
    unassigned = []
    for topic, p in partitions:
        owner = owner_of.get((topic, p))
        if owner is not None and count[owner] < quota[owner]:
            give(owner, topic, p)
        else:
            unassigned.append((topic, p))
    for topic, p in unassigned:
        give(min(members, key=lambda m: (count[m] - quota[m], m)), topic, p)
    return _result(members, assigned)


def range_(members, topics):
    """Kafka's ``RangeAssignor``: each topic's partitions split in contiguous ranges over its subscribers in member
    id order, the first ``partitions % subscribers`` one partition more; members subscribing to the same topics
    get the same partition numbers of each (co-partitioning, for joins)."""
    assigned = {member_id: {} for member_id in members}
    for topic in sorted(topics):
        subscribers = sorted(m for m, member in members.items() if topic in member.subscribed)
        if not subscribers:
            continue
        base, extra = divmod(topics[topic], len(subscribers))
        start = 0
        for i, member_id in enumerate(subscribers):
            size = base + (1 if i < extra else 0)
            if size:
                assigned[member_id][topic] = set(range(start, start + size))
            start += size
    return _result(members, assigned)


# name -> assignor; Kafka's class names name them too
ASSIGNORS = {"uniform": uniform, "range": range_}
ASSIGNOR_CLASSES = {"org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
                    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range"}

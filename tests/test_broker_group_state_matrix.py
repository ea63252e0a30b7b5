"""The group coordinator's answers, state by state: for every state a classic group can be in and every
request a consumer sends in it, the error code and the group's state, generation and member count after,
as Kafka 3.9's classic group coordinator answers them (``group.initial.rebalance.delay.ms=0``).

The expectations come from Kafka 3.9's ``GroupCoordinator`` (``handleJoinGroup``, ``doNewMemberJoinGroup``,
``doStaticNewMemberJoinGroup``, ``doDynamicNewMemberJoinGroup``, ``doCurrentMemberJoinGroup``,
``updateStaticMemberAndRebalance``, ``validateCurrentMember``, ``handleSyncGroup``/``validateSyncGroup``/
``doSyncGroup``, ``handleHeartbeat``/``validateHeartbeat``, ``handleLeaveGroup``, ``handleCommitOffsets``/
``validateOffsetCommit``/``doCommitOffsets``, ``handleFetchOffsets``), ``GroupMetadata`` (``supportsProtocols``,
``canRebalance``) and ``GroupCoordinatorAdapter``/``KafkaApis`` for what differs by version (MEMBER_ID_REQUIRED
from JoinGroup v4, KIP-394; ``group.instance.id`` from JoinGroup v5, SyncGroup and Heartbeat v3, OffsetCommit
v7, KIP-345; SyncGroup's protocol type and name from v5; LeaveGroup's member list from v3, whose member error is
the response's error before). A cell where kmem answers otherwise on purpose asserts kmem's answer and says in
``kafka=`` what Kafka answers and why kmem differs.

Members: L leads, F follows (in the static states with ``group.instance.id`` iL and iF, which their requests
carry); where the state has no such member the requests name an id the group does not know. ``g`` is the
state's generation (0 for no group); "old gen" is g - 1 (0 at least). Each cell (and version) has a group of
its own, brought to its state by the requests that bring a Kafka group there; one coordinator serves them all.
A JoinGroup or SyncGroup answered later (Kafka's ``DelayedJoin``, a follower's pending sync) is WAITS.
"""
import contextlib
import functools
from typing import NamedTuple

import pytest

from kmem.broker import LogManager
from kmem.broker.codes import ErrorCode
from kmem.broker.group.coordinator import DelayedResponse
from kmem.protocol import ApiKey, messages
from test_broker_groups_coordinator import (
    commit, coordinator, fetch, header, heartbeat, join, join_new_member, join_request, sync, sync_request,
)

E = ErrorCode
T0 = ("t", 0)
WAITS = "waits"                     # a JoinGroup or SyncGroup not answered yet
SAME = "same"                       # the state, generation and members the request found
TIMEOUTS = {"session_ms": 30_000, "rebalance_ms": 60_000}       # no deadline falls due while the module runs
CHANGED = (("range", b"other-sub"),)
OTHER = (("other", b""),)


class Cell(NamedTuple):
    error: object                   # an ErrorCode, WAITS, or (fetch) the committed offsets
    after: str = SAME               # "<state> +<generations> <members>", "absent" or SAME
    kafka: str = ""                 # set when kmem answers otherwise on purpose: Kafka's answer and why


# --- the states ---------------------------------------------------------------------------------------------

class Group(NamedTuple):
    generation: int
    roles: dict                     # "L", "F" -> (member id, group.instance.id or None)


GONE = {"L": ("gone-L", None), "F": ("gone-F", None)}


def answer(result):
    """The response, or WAITS while the coordinator holds it (a DelayedResponse not set yet)."""
    if not isinstance(result, DelayedResponse):
        return result
    answered = []
    result.start(lambda build: answered.append(build()))
    return answered[0] if answered else WAITS


def with_offsets(coord, gid):
    """A group that only commits (generation -1), as a consumer's first commit before any member joins."""
    assert commit(coord, {T0: 5}, group=gid) == {T0: E.NONE}


def absent(coord, gid):
    return Group(0, GONE)


def only_offsets(coord, gid):
    with_offsets(coord, gid)
    return Group(0, GONE)


def deleted(coord, gid):
    """DeleteGroups: Kafka's cleanupGroupMetadata marks the group Dead and removes it from the cache."""
    with_offsets(coord, gid)
    result = coord.delete_groups(header(ApiKey.DELETE_GROUPS, 2), messages.DeleteGroupsRequest(groups_names=[gid]))
    assert result.results[0].error_code == E.NONE
    return Group(0, GONE)


def stable_alone(coord, gid, static=False):
    """L alone, Stable in generation 1."""
    with_offsets(coord, gid)
    instance = "iL" if static else None
    first = join(coord, group=gid, instance_id=instance, **TIMEOUTS) if static else \
        join_new_member(coord, group=gid, **TIMEOUTS)
    assert (first.error_code, first.generation_id) == (E.NONE, 1)
    leader = first.member_id
    assert sync(coord, leader, 1, [(leader, b"L")], instance, group=gid).error_code == E.NONE
    return Group(1, {"L": (leader, instance), "F": GONE["F"]})


def left(coord, gid):
    """L left: the rebalance it starts completes with nobody (onCompleteJoin), Empty in generation 2."""
    group = stable_alone(coord, gid)
    assert leave(coord, gid, group.roles["L"][0], None, 3) == E.NONE
    return Group(2, {"L": group.roles["L"], "F": GONE["F"]})


def preparing(coord, gid, static=False):
    """L (Stable in generation 1) has not rejoined yet; F, new, waits in JoinGroup."""
    group = stable_alone(coord, gid, static)
    if static:
        waiting = coord.join_group(header(ApiKey.JOIN_GROUP, 7), join_request(instance_id="iF", group=gid, **TIMEOUTS))
        follower = coord.groups[gid].static_members["iF"]
    else:
        first = join(coord, group=gid, **TIMEOUTS)
        assert first.error_code == E.MEMBER_ID_REQUIRED
        follower = first.member_id
        waiting = coord.join_group(header(ApiKey.JOIN_GROUP, 7), join_request(follower, group=gid, **TIMEOUTS))
    assert answer(waiting) == WAITS
    return Group(1, {**group.roles, "F": (follower, "iF" if static else None)}), waiting


def completing(coord, gid, static=False):
    """L rejoined: generation 2, awaiting the leader's SyncGroup."""
    group, waiting = preparing(coord, gid, static)
    leader, instance = group.roles["L"]
    again = join(coord, member_id=leader, instance_id=instance, group=gid, **TIMEOUTS)
    assert (again.error_code, again.generation_id, again.leader) == (E.NONE, 2, leader)
    assert answer(waiting).generation_id == 2
    return Group(2, group.roles)


def stable(coord, gid, static=False):
    """Both synced: Stable in generation 2."""
    group = completing(coord, gid, static)
    (leader, leader_instance), (follower, follower_instance) = group.roles["L"], group.roles["F"]
    waiting = coord.sync_group(header(ApiKey.SYNC_GROUP, 5), sync_request(follower, 2, (), follower_instance, gid))
    assert answer(waiting) == WAITS
    assert sync(coord, leader, 2, [(leader, b"L"), (follower, b"F")], leader_instance, group=gid).error_code == E.NONE
    assert answer(waiting).assignment == b"F"
    return group


def without_waiting(setup):
    return lambda coord, gid, static=False: setup(coord, gid, static)[0]


class State(NamedTuple):
    state: str                      # Kafka's state name, or "absent"
    members: int
    setup: object                   # (coordinator, group id) -> Group
    static: bool = False


STATES = {
    "no group": State("absent", 0, absent),
    "Empty (offsets only)": State("Empty", 0, only_offsets),
    "Empty (its members left)": State("Empty", 0, left),
    "Dead (deleted)": State("absent", 0, deleted),
    "Stable (one member)": State("Stable", 1, stable_alone),
    "PreparingRebalance": State("PreparingRebalance", 2, without_waiting(preparing)),
    "CompletingRebalance": State("CompletingRebalance", 2, completing),
    "Stable": State("Stable", 2, stable),
    "PreparingRebalance (static)": State("PreparingRebalance", 2, without_waiting(preparing), True),
    "CompletingRebalance (static)": State("CompletingRebalance", 2, completing, True),
    "Stable (static)": State("Stable", 2, stable, True),
}


# --- the requests -------------------------------------------------------------------------------------------

def who(group, role, member, instance):
    """(member id, group.instance.id) of the request: a role's (``instance`` instead of its own if given), or
    the given ones."""
    if not role:
        return member, instance
    member_id, own_instance = group.roles[role]
    return member_id, instance or own_instance


def join_run(coord, gid, group, version, role=None, member="", instance=None, protocols=(("range", b"sub"),),
             protocol_type="consumer"):
    member_id, instance_id = who(group, role, member, instance)
    response = answer(coord.join_group(header(ApiKey.JOIN_GROUP, version), join_request(
        member_id, instance_id, protocols, group=gid, protocol_type=protocol_type, **TIMEOUTS)))
    return response if response == WAITS else response.error_code


def sync_run(coord, gid, group, version, role=None, member="", instance=None, old=False, protocol_name="range"):
    member_id, instance_id = who(group, role, member, instance)
    generation = max(group.generation - 1, 0) if old else group.generation
    leader = group.roles["L"][0]
    assignments = [(leader, b"L2"), (group.roles["F"][0], b"F2")] if member_id == leader else []
    request = sync_request(member_id, generation, assignments, instance_id, gid, protocol_name)
    response = answer(coord.sync_group(header(ApiKey.SYNC_GROUP, version), request))
    return response if response == WAITS else response.error_code


def heartbeat_run(coord, gid, group, version, role=None, member="", instance=None, old=False):
    member_id, instance_id = who(group, role, member, instance)
    generation = max(group.generation - 1, 0) if old else group.generation
    return heartbeat(coord, member_id, generation, instance_id, version, gid)


def leave(coord, gid, member_id, instance_id, version):
    """LeaveGroup's error for the member: the response's before v3 (LeaveGroupResponse), the member's after."""
    Request = messages.LeaveGroupRequest
    if version < 3:
        response = coord.leave_group(header(ApiKey.LEAVE_GROUP, version), Request(group_id=gid, member_id=member_id))
        return response.error_code
    response = coord.leave_group(header(ApiKey.LEAVE_GROUP, version), Request(group_id=gid, members=[
        Request.MemberIdentity(member_id=member_id, group_instance_id=instance_id, reason=None)]))
    assert response.error_code == E.NONE
    return response.members[0].error_code


def leave_run(coord, gid, group, version, role=None, member="", instance=None):
    member_id, instance_id = who(group, role, member, instance)
    return leave(coord, gid, member_id, instance_id if version >= 3 else None, version)


def commit_run(coord, gid, group, version, role=None, member="", instance=None, generation=None, old=False):
    member_id, instance_id = who(group, role, member, instance)
    if generation is None:
        generation = max(group.generation - 1, 0) if old else group.generation
    return commit(coord, {T0: 7}, member_id, generation, version, gid, instance_id)[T0]


def fetch_run(coord, gid, group, version):
    return fetch(coord, gid, version)


class Request(NamedTuple):
    run: object                     # (coordinator, group id, Group, version) -> error code, WAITS or offsets
    versions: tuple = (7,)


def request(run, versions, **fields):
    return Request(functools.partial(run, **fields), versions)


REQUESTS = {
    "join(new) v3": request(join_run, (3,)),
    "join(new) v4+": request(join_run, (4, 9)),
    "join(L)": request(join_run, (7,), role="L"),
    "join(F)": request(join_run, (7,), role="F"),
    "join(F, changed metadata)": request(join_run, (7,), role="F", protocols=CHANGED),
    "join(unknown id)": request(join_run, (7,), member="nobody"),
    "join(unknown id, other protocol)": request(join_run, (7,), member="nobody", protocols=OTHER),
    "join(new, other protocol type)": request(join_run, (7,), protocol_type="connect"),
    "join(new, other protocol)": request(join_run, (7,), protocols=OTHER),
    "join(L, other protocol)": request(join_run, (7,), role="L", protocols=OTHER),
    "join(iF, new id)": request(join_run, (7,), instance="iF"),          # a static member restarted
    "join(iF, unknown id)": request(join_run, (7,), member="nobody", instance="iF"),
    "join(F, unknown instance)": request(join_run, (7,), role="F", instance="nobody-instance"),
    "sync(L)": request(sync_run, (5,), role="L"),
    "sync(F)": request(sync_run, (5,), role="F"),
    "sync(L, old gen)": request(sync_run, (5,), role="L", old=True),
    "sync(unknown id)": request(sync_run, (5,), member="nobody"),
    "sync(L, unknown instance)": request(sync_run, (5,), role="L", instance="nobody-instance"),
    "sync(L, other protocol) v4": request(sync_run, (4,), role="L", protocol_name="other"),
    "sync(L, other protocol) v5": request(sync_run, (5,), role="L", protocol_name="other"),
    "sync(iF, unknown id) v2": request(sync_run, (2,), member="nobody", instance="iF"),
    "sync(iF, unknown id) v3+": request(sync_run, (3, 5), member="nobody", instance="iF"),
    "heartbeat(L)": request(heartbeat_run, (0, 4), role="L"),
    "heartbeat(F)": request(heartbeat_run, (4,), role="F"),
    "heartbeat(L, old gen)": request(heartbeat_run, (4,), role="L", old=True),
    "heartbeat(unknown id)": request(heartbeat_run, (4,), member="nobody"),
    "heartbeat(iF, unknown id) v2": request(heartbeat_run, (2,), member="nobody", instance="iF"),
    "heartbeat(iF, unknown id) v3+": request(heartbeat_run, (3, 4), member="nobody", instance="iF"),
    "heartbeat(L, unknown instance)": request(heartbeat_run, (4,), role="L", instance="nobody-instance"),
    "leave(L)": request(leave_run, (3,), role="L"),
    "leave(F)": request(leave_run, (0, 3), role="F"),
    "leave(unknown id)": request(leave_run, (0, 3), member="nobody"),
    "leave(iF)": request(leave_run, (3,), instance="iF"),                   # by instance id, no member id
    "leave(iF, unknown id)": request(leave_run, (3,), member="nobody", instance="iF"),
    "commit(gen -1)": request(commit_run, (2, 8), generation=-1),
    "commit(L)": request(commit_run, (8,), role="L"),
    "commit(F)": request(commit_run, (8,), role="F"),
    "commit(L, old gen)": request(commit_run, (8,), role="L", old=True),
    "commit(unknown id)": request(commit_run, (8,), member="nobody"),
    "commit(L, unknown instance)": request(commit_run, (8,), role="L", instance="nobody-instance"),
    "commit(iF, unknown id) v6": request(commit_run, (6,), member="nobody", instance="iF"),
    "commit(iF, unknown id) v7+": request(commit_run, (7, 8), member="nobody", instance="iF"),
    "fetch": request(fetch_run, (7, 8)),
}


# --- what Kafka 3.9 answers ----------------------------------------------------------------------------------

UNKNOWN, ILLEGAL, REBALANCING = E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION, E.REBALANCE_IN_PROGRESS
INCONSISTENT, FENCED, REQUIRED = E.INCONSISTENT_GROUP_PROTOCOL, E.FENCED_INSTANCE_ID, E.MEMBER_ID_REQUIRED
COMMITTED = {T0: 5}


def no_members(exists, offsets):
    """No group (``exists`` False) or an Empty one. A new member creates the group (getOrMaybeCreateGroup)
    and any protocol fits an Empty group (supportsProtocols); a member id the group does not have is
    UNKNOWN_MEMBER_ID (handleJoinGroup without a group, validateCurrentMember), in SyncGroup and Heartbeat too.
    A simple commit (generation -1) creates or uses an Empty group (handleCommitOffsets, validateOffsetCommit);
    any generation or member id is ILLEGAL_GENERATION without a group, UNKNOWN_MEMBER_ID in an Empty one."""
    member_commit = Cell(UNKNOWN if exists else ILLEGAL)
    return {
        # addMemberAndRebalance; InitialDelayedJoin with no delay completes the join: the member leads
        "join(new) v3": Cell(E.NONE, "CompletingRebalance +1 1"),
        "join(iF, new id)": Cell(E.NONE, "CompletingRebalance +1 1"),   # doStaticNewMemberJoinGroup: added
        "join(new) v4+": Cell(REQUIRED, "Empty +0 0"),                  # doDynamicNewMemberJoinGroup
        "join(new, other protocol type)": Cell(REQUIRED, "Empty +0 0"),
        "join(new, other protocol)": Cell(REQUIRED, "Empty +0 0"),
        **{name: Cell(UNKNOWN) for name in REQUESTS
           if name.startswith(("join(L", "join(F", "join(unknown", "join(iF, unknown", "sync", "heartbeat", "leave"))},
        "commit(gen -1)": Cell(E.NONE, "Empty +0 0"),
        **{name: member_commit for name in REQUESTS if name.startswith("commit(") and name != "commit(gen -1)"},
        "fetch": Cell(COMMITTED if offsets else {}),
    }


def with_members(static, follower=True):
    """What every state with members answers alike: a new dynamic member gets its id first (v4+); a member id
    the group does not know is UNKNOWN_MEMBER_ID, an instance id it knows with another member id
    FENCED_INSTANCE_ID, one it does not know UNKNOWN_MEMBER_ID (validateCurrentMember, before the generation:
    then ILLEGAL_GENERATION); a protocol no member shares is INCONSISTENT_GROUP_PROTOCOL (supportsProtocols);
    a commit without member id or generation is UNKNOWN_MEMBER_ID (validateOffsetCommit: only members commit
    to a group with members). Before SyncGroup v3, Heartbeat v3 and OffsetCommit v7 the instance id is not
    sent: the unknown member id is UNKNOWN_MEMBER_ID."""
    instance_check = Cell(FENCED if static else UNKNOWN)
    cells = {
        "join(new) v4+": Cell(REQUIRED),
        "join(unknown id)": Cell(UNKNOWN),
        "join(unknown id, other protocol)": Cell(INCONSISTENT),         # the protocols are checked first
        "join(new, other protocol type)": Cell(INCONSISTENT),
        "join(new, other protocol)": Cell(INCONSISTENT),
        "join(L, other protocol)": Cell(INCONSISTENT),
        "join(iF, unknown id)": instance_check,
        "join(F, unknown instance)": Cell(UNKNOWN),
        "sync(L, old gen)": Cell(ILLEGAL), "heartbeat(L, old gen)": Cell(ILLEGAL), "commit(L, old gen)": Cell(ILLEGAL),
        "sync(unknown id)": Cell(UNKNOWN), "heartbeat(unknown id)": Cell(UNKNOWN), "leave(unknown id)": Cell(UNKNOWN),
        "commit(unknown id)": Cell(UNKNOWN), "commit(gen -1)": Cell(UNKNOWN),
        "sync(iF, unknown id) v2": Cell(UNKNOWN), "heartbeat(iF, unknown id) v2": Cell(UNKNOWN),
        "commit(iF, unknown id) v6": Cell(UNKNOWN),
        "sync(iF, unknown id) v3+": instance_check, "heartbeat(iF, unknown id) v3+": instance_check,
        "commit(iF, unknown id) v7+": instance_check, "leave(iF, unknown id)": instance_check,
        **same_answers(Cell(UNKNOWN), "heartbeat(L, unknown instance)", "sync(L, unknown instance)",
                       "commit(L, unknown instance)"),
        "fetch": Cell(COMMITTED),
    }
    if not static:
        cells["leave(iF)"] = Cell(UNKNOWN)            # handleLeaveGroup: no member has the instance id
    if not follower:
        cells.update({name: Cell(UNKNOWN) for name in REQUESTS if name.startswith(
            ("join(F", "sync(F", "heartbeat(F", "leave(F", "commit(F"))})
    return cells


def same_answers(cell, *names):
    return {name: cell for name in names}


# Stable, L alone: a new member or the leader's JoinGroup rebalances (Stable: the leader always rebalances)
STABLE_ALONE = {
    **with_members(static=False, follower=False),
    "join(new) v3": Cell(WAITS, "PreparingRebalance +0 2"),            # L has to rejoin
    "join(iF, new id)": Cell(WAITS, "PreparingRebalance +0 2"),         # a new static member
    "join(L)": Cell(E.NONE, "CompletingRebalance +1 1"),                # every member joined: DelayedJoin completes
    **same_answers(Cell(E.NONE), "sync(L)", "sync(L, other protocol) v4", "heartbeat(L)", "commit(L)"),
    "sync(L, other protocol) v5": Cell(INCONSISTENT),                   # validateSyncGroup
    "leave(L)": Cell(E.NONE, "Empty +1 0"),                             # onCompleteJoin with nobody
}


def preparing_cells(static):
    """L has not rejoined; F waits in JoinGroup (generation g is still the previous one)."""
    return {
        **with_members(static),
        "join(new) v3": Cell(WAITS, "PreparingRebalance +0 3"),
        "join(L)": Cell(E.NONE, "CompletingRebalance +1 2"),            # the last one: the join completes
        "join(F)": Cell(WAITS), "join(F, changed metadata)": Cell(WAITS),   # updateMemberAndRebalance: still waits
        # updateStaticMemberAndRebalance in PreparingRebalance: the new id takes F's place and waits
        "join(iF, new id)": Cell(WAITS) if static else Cell(WAITS, "PreparingRebalance +0 3"),
        # doSyncGroup, handleHeartbeat: PreparingRebalance, after the generation check
        **same_answers(Cell(REBALANCING), "sync(L)", "sync(F)", "sync(L, other protocol) v4", "heartbeat(L)",
                       "heartbeat(F)"),
        "sync(L, other protocol) v5": Cell(INCONSISTENT),               # protocolName is still generation g's
        **same_answers(Cell(E.NONE), "commit(L)", "commit(F)"),         # doCommitOffsets: allowed while preparing
        "leave(L)": Cell(E.NONE, "CompletingRebalance +1 1"),           # F is the one left, and it has joined
        "leave(F)": Cell(E.NONE, "PreparingRebalance +0 1"),
        **({"leave(iF)": Cell(E.NONE, "PreparingRebalance +0 1")} if static else {}),
    }


def completing_cells(static):
    """Generation g's JoinGroup answered, the leader's SyncGroup awaited."""
    rebalanced = "PreparingRebalance +0 2"
    return {
        **with_members(static),
        "join(new) v3": Cell(WAITS, "PreparingRebalance +0 3"),
        # doCurrentMemberJoinGroup: the same metadata is answered the generation again (a lost response)
        "join(L)": Cell(E.NONE), "join(F)": Cell(E.NONE),
        "join(F, changed metadata)": Cell(WAITS, rebalanced),
        # updateStaticMemberAndRebalance in CompletingRebalance: always a rebalance
        "join(iF, new id)": Cell(WAITS, rebalanced if static else "PreparingRebalance +0 3"),
        "sync(L)": Cell(E.NONE, "Stable +0 2"), "sync(L, other protocol) v4": Cell(E.NONE, "Stable +0 2"),
        "sync(F)": Cell(WAITS),                                         # the follower waits for the leader
        "sync(L, other protocol) v5": Cell(INCONSISTENT),
        **same_answers(Cell(E.NONE), "heartbeat(L)", "heartbeat(F)"),
        **same_answers(Cell(REBALANCING), "commit(L)", "commit(F)"),    # doCommitOffsets: CompletingRebalance
        **same_answers(Cell(E.NONE, "PreparingRebalance +0 1"), "leave(L)", "leave(F)",
                       *(("leave(iF)",) if static else ())),
    }


def stable_cells(static):
    rebalanced = "PreparingRebalance +0 2"
    return {
        **with_members(static),
        "join(new) v3": Cell(WAITS, "PreparingRebalance +0 3"),
        "join(L)": Cell(WAITS, rebalanced),                             # the leader's join always rebalances
        "join(F)": Cell(E.NONE),                                        # a follower with the same metadata
        "join(F, changed metadata)": Cell(WAITS, rebalanced),
        # updateStaticMemberAndRebalance: the selected protocol stays, the group is stored with the new id
        "join(iF, new id)": Cell(E.NONE) if static else Cell(WAITS, "PreparingRebalance +0 3"),
        **same_answers(Cell(E.NONE), "sync(L)", "sync(F)", "sync(L, other protocol) v4", "heartbeat(L)",
                       "heartbeat(F)", "commit(L)", "commit(F)"),
        "sync(L, other protocol) v5": Cell(INCONSISTENT),
        **same_answers(Cell(E.NONE, "PreparingRebalance +0 1"), "leave(L)", "leave(F)",
                       *(("leave(iF)",) if static else ())),
    }


EXPECTED = {
    "no group": no_members(exists=False, offsets=False),
    "Empty (offsets only)": no_members(exists=True, offsets=True),
    "Empty (its members left)": no_members(exists=True, offsets=True),
    # Kafka's Dead group is gone from the coordinator's cache at once: no group
    "Dead (deleted)": no_members(exists=False, offsets=False),
    "Stable (one member)": STABLE_ALONE,
    "PreparingRebalance": preparing_cells(static=False),
    "CompletingRebalance": completing_cells(static=False),
    "Stable": stable_cells(static=False),
    "PreparingRebalance (static)": preparing_cells(static=True),
    "CompletingRebalance (static)": completing_cells(static=True),
    "Stable (static)": stable_cells(static=True),
}
CELLS = [(state, name) for state, cells in EXPECTED.items() for name in cells]


# --- running a cell -----------------------------------------------------------------------------------------

def observed(coord, gid):
    group = coord.groups.get(gid)
    return ("absent",) if group is None else (group.state, group.generation, len(group.members))


def expected_after(cell, state, generation):
    if cell.after == SAME:
        return ("absent",) if state.state == "absent" else (state.state, generation, state.members)
    if cell.after == "absent":
        return ("absent",)
    name, delta, members = cell.after.split()
    return name, generation + int(delta), int(members)


@pytest.fixture(scope="module")
def coord(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        logs = stack.enter_context(LogManager(tmp_path_factory.mktemp("groups")))
        logs.create_topic("t", 4)
        made = coordinator(logs)
        stack.callback(made.close)
        yield made


@pytest.mark.parametrize("state_name, request_name", CELLS)
def test_the_coordinator_answers_as_kafka(coord, state_name, request_name):
    state, request, cell = STATES[state_name], REQUESTS[request_name], EXPECTED[state_name][request_name]
    for version in request.versions:
        gid = f"{state_name}/{request_name}/v{version}"
        group = state.setup(coord, gid, state.static) if state.static else state.setup(coord, gid)
        assert observed(coord, gid) == expected_after(Cell(E.NONE), state, group.generation)
        result = request.run(coord, gid, group, version)
        assert (result, observed(coord, gid)) == (cell.error, expected_after(cell, state, group.generation)), \
            f"v{version} {cell.kafka}"


def test_the_table_has_every_request_in_every_state():
    for state, cells in EXPECTED.items():
        assert set(cells) == set(REQUESTS), (state, set(REQUESTS) ^ set(cells))
    assert set(EXPECTED) == set(STATES)

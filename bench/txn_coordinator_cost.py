"""What a transaction costs kmem's transaction coordinator, without the network (``.venv/bin/python
bench/txn_coordinator_cost.py``): in a broker in this process, one transactional id commits ``--transactions``
transactions of one partition, each as a client's would go: AddPartitionsToTxn (``add_partitions``: its
``__transaction_state`` record written), EndTxn (``end_transaction``: PrepareCommit written) and the work its
response leaves behind (the marker written to the partition, then CompleteCommit). Printed: the median µs of each
step, warm (in a live broker the same work takes three to four times as long: see ``txn_commit_split.py``'s
request times).

``--instructions``: instead, the instructions a transaction costs, counted by valgrind's callgrind (deterministic
where times on a shared machine are not): two runs, of ``--transactions`` and twice as many, and their difference
divided by ``--transactions``. Run it from outside a checkout to count the kmem of ``PYTHONPATH``.

``--bytecodes``: instead, the Python bytecodes a transaction runs (``sys.settrace`` opcode events), in all and by
function, the costliest first.
"""
import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WARM = 200


def steps(transactions, trace=None):
    """``{step: [ns of each transaction]}`` after ``WARM`` transactions; ``trace``, a ``sys.settrace`` function,
    is set for those."""
    from kmem.broker import Broker

    with tempfile.TemporaryDirectory() as directory, Broker(directory, port=0) as broker:
        broker.logs.create_topic("t", 1)
        coordinator = broker.transactions
        error, producer_id, epoch = coordinator.init_producer("bench", 60000)
        assert not error, error
        times = {"AddPartitionsToTxn": [], "EndTxn": [], "markers and CompleteCommit": []}
        for done in range(WARM + transactions):
            if done == WARM and trace is not None:
                sys.settrace(trace)
            started = time.perf_counter_ns()
            error = coordinator.add_partitions("bench", producer_id, epoch, {("t", 0)})
            added = time.perf_counter_ns()
            after_response = []
            error = error or coordinator.end_transaction("bench", producer_id, epoch, True, after_response.append)
            ended = time.perf_counter_ns()
            for work in after_response:
                work()
            completed = time.perf_counter_ns()
            assert not error, error
            if done >= WARM:
                for step, took in zip(times, (added - started, ended - added, completed - ended)):
                    times[step].append(took)
        sys.settrace(None)
        assert broker.logs.get_partition("t", 0).last_stable_offset == WARM + transactions     # every marker in
        return times


def instructions(transactions):
    counts = []
    with tempfile.TemporaryDirectory() as workdir:
        for count in (transactions, 2 * transactions):
            out = os.path.join(workdir, f"callgrind.{count}")
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                            os.path.abspath(__file__), "--transactions", str(count)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, PYTHONSAFEPATH="1"))     # kmem from PYTHONPATH
            with open(out) as f:
                counts.append(sum(int(line.split()[1]) for line in f if line.startswith("totals:")))
    return (counts[1] - counts[0]) // transactions


def bytecodes(transactions):
    """``Counter({"file:function": bytecodes})`` over ``transactions`` traced transactions."""
    counts = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        return trace

    steps(transactions, trace)
    del counts[f"{os.path.basename(__file__)}:steps"]          # the bench's own loop
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind instead")
    parser.add_argument("--bytecodes", action="store_true", help="count Python bytecodes instead")
    args = parser.parse_args()
    if args.bytecodes:
        counts = bytecodes(args.transactions)
        print(f"{sum(counts.values()) / args.transactions:,.0f} Python bytecodes a transaction; by function:")
        for function, count in counts.most_common(15):
            print(f"  {count / args.transactions:7.1f} {function}")
        return
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
        print(f"{instructions(args.transactions):,} instructions a transaction (AddPartitionsToTxn, EndTxn, the "
              "markers and CompleteCommit)")
        return
    for step, took in steps(args.transactions).items():
        print(f"{step}: {statistics.median(took) / 1000:.1f} µs median")


if __name__ == "__main__":
    main()

"""A command-line progress bar for Spark stages, fed by the SparkContext's status tracker."""
import contextlib
import os
import sys
import threading

# the size assumed for a terminal that reports none (0 x 0: a serial console, some containers), where
# tqdm would draw nothing
DEFAULT_SIZE = os.terminal_size((80, 24))


@contextlib.contextmanager
def stage_progress(spark, description, stream=None, interval=0.25):
    """Show the tasks of running stages completing while the block runs (nothing when not a terminal)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield
        return
    from tqdm import tqdm

    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()
    columns, lines = _size(stream)
    bar = tqdm(total=0, desc=description, unit="task", file=stream, leave=True, ncols=columns, nrows=lines)

    seen = {}     # stage id -> (completed, total); finished stages are asked again for their final count

    def update():
        for stage_id in set(tracker.getActiveStageIds()) | seen.keys():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                seen[stage_id] = (info.numCompletedTasks, info.numTasks)
        bar.total = sum(total for _, total in seen.values())
        bar.n = sum(completed for completed, _ in seen.values())
        bar.refresh()

    def poll():
        while not done.wait(interval):
            update()

    thread = threading.Thread(target=poll, name="kmem-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        update()            # the final counts, also of a block shorter than the interval
        bar.n = bar.total
        bar.close()


def _size(stream):
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return DEFAULT_SIZE
    return size.columns or DEFAULT_SIZE.columns, size.lines or DEFAULT_SIZE.lines

"""A command-line progress bar for Spark stages, fed by the SparkContext's status tracker."""
import contextlib
import sys
import threading


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
    bar = tqdm(total=0, desc=description, unit="task", file=stream, leave=True)

    def poll():
        seen = {}     # stage id -> (completed, total); finished stages are asked again for their final count
        while not done.wait(interval):
            for stage_id in set(tracker.getActiveStageIds()) | seen.keys():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            bar.total = sum(total for _, total in seen.values())
            bar.n = sum(completed for completed, _ in seen.values())
            bar.refresh()

    thread = threading.Thread(target=poll, name="kmem-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.n = bar.total
        bar.close()

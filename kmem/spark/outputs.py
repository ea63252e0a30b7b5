"""Where the pipeline writes: each output directory is checked before Spark starts, so no job
overwrites its input or anything it did not write.

An output directory is refused (``InvalidArgumentError``) when it is the input directory, inside it,
or (for the jobs that replace directories) holds it: a job would rewrite the segments it reads, or read
what it writes. ``ledger`` and ``convert`` also refuse a file, and a directory that is not empty and
not a previous output of the same job. A previous output is marked by the
job's ``.kmem-<job>`` file; a rerun there replaces only what the job writes and leaves the rest.
"""
import os
import shutil

from kmem.errors import InvalidArgumentError


def marker(job):
    return f".kmem-{job}"


def check_apart(output_dir, input_dir, what="output", may_hold=False):
    """Refuse an ``output_dir`` that is ``input_dir``, inside it, or (unless ``may_hold``: a job that
    only adds files) holds it; local paths only."""
    if "://" in os.fspath(input_dir):
        return
    output, source = os.path.realpath(output_dir), os.path.realpath(input_dir)
    common = os.path.commonpath([output, source])
    if common == source or common == output and not may_hold:
        where = "is" if output == source else "is inside" if common == source else "holds"
        raise InvalidArgumentError(f"{what} directory {output_dir} {where} the input directory {input_dir}: "
                                   "give a directory apart from it")


def prepare_output(output_dir, job, owns, input_dir=None):
    """Make ``output_dir`` ready for ``job``: created when missing and marked as the job's; in a previous
    output of the job, the entries ``owns(name)`` says the job writes are removed. Refuses (see the module
    docstring) before changing anything."""
    output_dir = os.fspath(output_dir)
    if input_dir is not None:
        check_apart(output_dir, input_dir, f"{job} output")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise InvalidArgumentError(f"{job} output {output_dir} is a file, not a directory")
    entries = set(os.listdir(output_dir)) if os.path.isdir(output_dir) else set()
    if entries and marker(job) not in entries:
        raise InvalidArgumentError(f"{job} output directory {output_dir} is not empty and is not a previous {job} "
                                   f"output (no {marker(job)} file): give a new or empty directory")
    for name in sorted(filter(owns, entries)):
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, marker(job)), "w") as file:
        file.write(f"written by kmem pipeline {job}; a rerun replaces its outputs here and leaves the rest\n")


def prepare_partition_output(output_dir, job, input_dir):
    """``prepare_output`` for a job writing one ``<topic>-<partition>/`` directory per partition
    (``ledger``, ``convert``): a rerun replaces those directories."""
    from kmem.spark.segments import PARTITION_DIR

    def owns(name):
        return PARTITION_DIR.match(name) is not None and os.path.isdir(os.path.join(output_dir, name))
    prepare_output(output_dir, job, owns, input_dir)

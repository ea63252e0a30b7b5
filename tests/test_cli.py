"""The ``kmem`` command line as a user runs it (a child process, from outside the source tree): what it
checks before Spark starts, in one line each, and the exit codes its help documents."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import kmem
from kmem.records import build_records

SOURCE_TREE = pathlib.Path(__file__).resolve().parent.parent / "kmem"


def kmem_cli(*args, cwd, env=None, timeout=60):
    """Run ``kmem ARGS``; PYTHONSAFEPATH keeps a checkout's uncompiled tree off the child's sys.path."""
    return subprocess.run([sys.executable, "-m", "kmem.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(env or os.environ, PYTHONSAFEPATH="1"))


@pytest.fixture
def logs(tmp_path):
    """A log directory with one small segment."""
    segment = tmp_path / "logs" / "orders-0" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(build_records([b"v"] * 3, magic=2))
    return tmp_path / "logs"


def test_version(tmp_path):
    result = kmem_cli("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == f"kmem {kmem.__version__}"


@pytest.mark.parametrize("command", [[], ["pipeline"], ["pipeline", "report"], ["pipeline", "convert"],
                                     ["pipeline", "ledger"], ["pipeline", "demo"]])
def test_help_documents_the_exit_codes(tmp_path, command):
    result = kmem_cli(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0
    for code, meaning in (("0", "done"), ("1", "partial success"), ("2", "nothing done"), ("3", "nothing to do")):
        assert f"  {code}  {meaning}" in result.stdout


@pytest.mark.parametrize("job", [["report"], ["ledger", "OUT"], ["convert", "OUT"]])
def test_an_input_without_segments_is_one_warning_and_exit_3_before_spark_starts(tmp_path, job):
    (tmp_path / "empty" / "not-a-partition").mkdir(parents=True)
    name, *output = job
    result = kmem_cli("pipeline", name, tmp_path / "empty", *[tmp_path / o for o in output], cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [f"kmem: warning: no Kafka log segments "
                                          f"(<topic>-<partition>/<20-digit offset>.log) under {tmp_path / 'empty'}"]
    assert result.stdout == "" and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("job", [["report"], ["ledger", "OUT"], ["convert", "OUT"]])
def test_a_missing_input_directory_is_one_line_and_exit_2(tmp_path, job):
    name, *output = job
    result = kmem_cli("pipeline", name, tmp_path / "missing", *output, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: input directory {tmp_path / 'missing'} does not exist "
                                          "or is not a directory"]


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_a_chunk_size_that_is_not_positive_is_refused_naming_the_argument(tmp_path, logs, value):
    result = kmem_cli("pipeline", "convert", logs, tmp_path / "out", "--chunk-size", value, cwd=tmp_path)
    assert result.returncode == 2
    assert f"argument --chunk-size: must be a positive integer, not '{value}'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_no_java_is_one_line_with_the_fix_before_spark_starts(tmp_path, logs):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(env, PATH=str(tmp_path / "no-bin")))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["kmem: error: Spark needs Java and no java on the PATH: install a Java 17 "
                                          "(or newer) runtime, e.g. apt-get install openjdk-17-jre-headless"]
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(env, JAVA_HOME=str(tmp_path / "jdk")))
    assert result.returncode == 2 and f"JAVA_HOME={tmp_path / 'jdk'} has no bin/java" in result.stderr


def test_a_java_older_than_17_is_named(tmp_path, logs):
    jdk = tmp_path / "jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "java").write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    (jdk / "java").chmod(0o755)
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(os.environ, JAVA_HOME=str(tmp_path / "jdk")))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert f"Spark 4 needs Java 17 or newer, {jdk / 'java'} is Java 11" in result.stderr


def test_the_demo_refuses_a_non_empty_directory_it_did_not_write_and_deletes_nothing(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = kmem_cli("pipeline", "demo", "--output", tmp_path / "mine", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: demo output directory {tmp_path / 'mine'} is not empty and "
                                          "is not a previous demo output (no .kmem-demo file): give a new or empty "
                                          "directory"]
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    result = kmem_cli("pipeline", "demo", "--output", ".", cwd=tmp_path / "mine")
    assert result.returncode == 2 and os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_a_previous_demo_output_loses_only_what_the_demo_wrote(tmp_path):
    from kmem.spark.demo import MARKER, OUTPUTS, prepare_output

    output = tmp_path / "demo"
    prepare_output(output)                      # a new directory: created and marked
    assert os.listdir(output) == [MARKER]
    for name in OUTPUTS:
        if name.endswith((".json", ".png")):
            (output / name).write_text("old")
        else:
            (output / name / "sub").mkdir(parents=True)
    (output / "notes.txt").write_text("keep me")
    prepare_output(output)
    assert sorted(os.listdir(output)) == sorted([MARKER, "notes.txt"])


def test_a_source_tree_without_its_compiled_core_says_how_to_fix_the_import(tmp_path):
    tree = tmp_path / "kmem"
    tree.mkdir()
    for name in ("__init__.py", "_core.pyx"):
        shutil.copy(SOURCE_TREE / name, tree / name)
    result = subprocess.run([sys.executable, "-S", "-c", "import kmem"], capture_output=True, text=True,
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode != 0
    assert "unbuilt source tree" in result.stderr and "build_ext --inplace" in result.stderr

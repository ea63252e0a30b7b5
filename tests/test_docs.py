"""The README and the documentation site (``docs/``, ``mkdocs.yml``): every Python example runs as
written, every page is in the site's navigation, the site builds, and the README's first screen says
what kmem is, for whom, and how to start the broker.

A ```` ```python ```` block runs in a new namespace in an empty working directory, so it must be
complete (its imports, its data); a block after an ``<!-- pytest -->`` line is a test file, run by
pytest in a child process with the kmem plugin."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) if DOCS.is_dir() else []
BLOCK = re.compile(r"^(<!-- pytest -->\n)?```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def examples():
    for path in [ROOT / "README.md", *PAGES]:
        text = path.read_text()
        for block in BLOCK.finditer(text):
            line = text.count("\n", 0, block.start(2)) + 1
            yield pytest.param(path, line, bool(block.group(1)), block.group(2),
                               id=f"{path.relative_to(ROOT)}:{line}")


@pytest.mark.parametrize("path, line, is_test_file, source", list(examples()))
def test_every_python_example_runs_as_written(path, line, is_test_file, source, tmp_path, monkeypatch,
                                              pytestconfig):
    monkeypatch.chdir(tmp_path)
    if is_test_file:
        (tmp_path / "test_example.py").write_text(source)
        (tmp_path / "pytest.ini").write_text("[pytest]\n")
        plugin = [] if pytestconfig.pluginmanager.has_plugin("kmem") else ["-p", "kmem.pytest_plugin"]
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
                                 "test_example.py"], capture_output=True, text=True, timeout=300,
                                env=dict(os.environ, PYTHONSAFEPATH="1"))
        assert result.returncode == 0, f"{path}:{line}\n{result.stdout[-4000:]}"
        return
    # the example's line numbers in tracebacks are the document's
    exec(compile("\n" * (line - 1) + source, str(path), "exec"), {"__name__": "__example__"})


def test_there_are_examples_in_the_readme_and_on_every_part_page():
    counted = {}
    for param in examples():
        counted[param.values[0].name] = counted.get(param.values[0].name, 0) + 1
    assert counted["README.md"] >= 2
    for page in ("broker.md", "testing.md", "pools.md", "bloom.md", "records.md", "network.md", "protocol.md",
                 "ledger.md", "pipeline.md", "consumer.md"):
        assert counted.get(page), page


def test_every_page_is_in_the_navigation_and_every_link_resolves():
    if not PAGES:
        pytest.skip("no docs/ beside these tests")
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", config, re.MULTILINE))
    assert listed == {page.name for page in PAGES}
    for path in [ROOT / "README.md", *PAGES]:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).is_file(), f"{path.name} links to {target}"


def test_the_site_builds_with_its_api_reference(tmp_path):
    if not PAGES:
        pytest.skip("no docs/ beside these tests")
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs extra is not installed")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stderr[-4000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "kafka_topic_factory" in reference and "LazyDownConvertRecords" in reference


def test_the_readme_first_screen_says_what_kmem_is_for_whom_and_how_to_start_the_broker():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:25])
    assert "Kafka broker" in first_screen
    for audience in ("development", "tests", "old clients", "services", "Spark"):
        assert audience in first_screen, audience
    assert "kmem broker --log-dir" in first_screen and "pip install kmem" not in first_screen

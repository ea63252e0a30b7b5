"""The package as built: compiled core loaded, packaging files consistent with each other."""
import ast
import importlib.machinery
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml

import kmem
import kmem._core

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_core_is_the_compiled_extension():
    assert kmem._core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert not hasattr(kmem._core, "__path__")     # a module file, not a package directory stand-in


def test_fallback_is_impossible_core_missing_fails_import(tmp_path):
    # Copy the pure-Python files without the extension: importing kmem must fail loudly.
    pkg = tmp_path / "kmem"
    pkg.mkdir()
    for source in pathlib.Path(kmem.__file__).parent.glob("*.py"):
        (pkg / source.name).write_text(source.read_text())
    # -S: no site-packages, so the only kmem to be found is the copy on PYTHONPATH
    result = subprocess.run([sys.executable, "-S", "-c", "import kmem"], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode != 0
    assert "_core" in result.stderr


def test_a_bench_runs_with_benchmarks_disabled():
    """`pytest bench --benchmark-disable` is the quick check that every bench runs: reading timings that
    pytest-benchmark did not take must not fail (bench_pool goes through the shared comparison table)."""
    pytest.importorskip("pytest_benchmark")
    bench = ROOT / "bench" / "bench_pool.py"
    if not bench.exists():
        pytest.skip("no bench/ beside these tests")
    result = subprocess.run([sys.executable, "-m", "pytest", str(bench), "-q", "-x", "--benchmark-disable",
                             "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]


JDK = "openjdk-17-jdk-headless"
GO_AND_SARAMA = "golang-go golang-github-shopify-sarama-dev"
BROWSER = "chromium chromium-driver"
CONSOLE_THROUGH_FLASK = {"jinja2", "werkzeug"}


@pytest.mark.parametrize("present, sarama, installs", [
    (["java", "javac", "go", "chromium", "chromedriver"], True, None),
    # a JRE alone: the commons-collections probe would skip for want of javac
    (["java", "go", "chromium", "chromedriver"], True, JDK),
    (["java", "javac", "go", "chromium", "chromedriver"], False, GO_AND_SARAMA),    # Go without Sarama's sources
    (["java", "javac", "chromium", "chromedriver"], False, GO_AND_SARAMA),
    (["java", "javac", "go", "chromium"], True, BROWSER),      # the browser without its driver
    ([], False, f"{JDK} {GO_AND_SARAMA} {BROWSER}"),          # one apt-get for all
])
def test_ci_installs_a_jdk_go_sarama_and_chromium_unless_they_are_there(tmp_path, present, sarama, installs):
    """.ci/run, with apt-get, make and the Java and Go tools replaced by stubs that log their calls (the go
    stub finds Sarama's package or not, as ``sarama`` says)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ["apt-get", "make", *present]:
        stub = bin_dir / tool
        found = "0" if tool != "go" or sarama else "1"
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit {found}\n')
        stub.chmod(0o755)
    for tool in ["dirname", "sh"]:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    bash = shutil.which("bash")
    subprocess.run([bash, str(ROOT / ".ci" / "run")], check=True, env={"PATH": str(bin_dir)}, timeout=60)
    logged = calls.read_text().splitlines()
    assert logged[-1] == "make test"
    if "go" in present:
        assert "go list github.com/Shopify/sarama" in logged
    installed = [line for line in logged if line.startswith("apt-get install")]
    assert installed == ([f"apt-get install -y -qq {installs}"] if installs else [])


def test_version_matches_project_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert kmem.__version__ == project["version"]


def test_wheel_workflow_agrees_with_pyproject():
    workflow = yaml.safe_load((ROOT / "wheelhouse-ci.yml").read_text())
    cibw = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    jobs = workflow["jobs"]
    wheel_steps = [step for step in jobs["wheels"]["steps"] if "cibuildwheel" in str(step.get("uses", ""))]
    assert wheel_steps, "the wheel job must run cibuildwheel"
    runners = jobs["wheels"]["strategy"]["matrix"]["os"]
    assert any("ubuntu" in r for r in runners) and any("macos" in r for r in runners)
    assert any("arm" in r for r in runners), "aarch64 wheels are built natively on an arm runner"
    assert "sdist" in jobs and "bench" in jobs
    # the Python versions the workflow sets up for tests and benchmarks are ones we build wheels for
    for version in jobs["bench"]["strategy"]["matrix"]["python"]:
        assert f"cp{version.replace('.', '')}-*" in cibw["build"]


@pytest.mark.skipif(subprocess.run([sys.executable, "-m", "cibuildwheel", "--help"],
                                   capture_output=True).returncode != 0, reason="cibuildwheel not installed")
def test_cibuildwheel_build_identifiers_offline():
    result = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform",
                             "linux", "--archs", "x86_64,aarch64"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    identifiers = result.stdout.split()
    for version in ("cp310", "cp311", "cp312", "cp313"):
        for arch in ("x86_64", "aarch64"):
            assert f"{version}-manylinux_{arch}" in identifiers
    assert not any("musllinux" in i for i in identifiers)


def _stub_parameters(function):
    arguments = function.args
    return [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs if a.arg != "self"]


def _runtime_parameters(function):
    import inspect
    return [name for name in inspect.signature(function).parameters if name != "self"]


def _stubbed_names(body):
    functions = {node.name: node for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    attributes = {node.target.id for node in body if isinstance(node, ast.AnnAssign)}
    return functions, attributes


def test_core_stubs_describe_the_compiled_surface():
    stubbed, constants = _stubbed_names(ast.parse((ROOT / "kmem" / "_core.pyi").read_text()).body)
    assert set(stubbed) | constants == {name for name in dir(kmem._core) if not name.startswith("__")}
    for name, node in stubbed.items():
        runtime = getattr(kmem._core, name)
        if isinstance(node, ast.FunctionDef):
            assert _stub_parameters(node) == _runtime_parameters(runtime), name
            continue
        members, attributes = _stubbed_names(node.body)
        public = {member for member in vars(runtime) if not member.startswith("__")}
        assert public <= set(members) | attributes, f"{name} lacks stubs for {public - set(members) - attributes}"
        for member_name in public & set(members):
            member = getattr(runtime, member_name)
            if callable(member):        # not a property or attribute
                assert _stub_parameters(members[member_name]) == _runtime_parameters(member), \
                    f"{name}.{member_name}"


def _imported_distributions(paths):
    """Distributions (normalized names) that the files at ``paths`` import (or locate for their data with
    ``find_spec``), outside the stdlib, kmem, the files' sibling modules and the benchmarks' (bench/peers.py
    starts the peer brokers for tests too)."""
    import importlib.metadata
    import re

    providers = importlib.metadata.packages_distributions()
    found = set()
    for path in paths:
        text = path.read_text()
        if path.suffix == ".py":
            names = [alias.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
                     for alias in node.names]
            names += [node.module for node in ast.walk(ast.parse(text))
                      if isinstance(node, ast.ImportFrom) and node.level == 0]
            # packages used for their data files, located with importlib.util.find_spec
            names += re.findall(r"find_spec\(\s*[\"']([\w.]+)[\"']", text)
        else:       # Cython: plain imports only (cimports are compile time)
            names = [a or b for a, b in re.findall(r"^\s*(?:import\s+([\w.]+)|from\s+([\w.]+)\s+import\b)", text,
                                                   re.MULTILINE)]
        for name in names:
            top = name.split(".")[0]
            local = (path.parent / f"{top}.py").exists() or (ROOT / "bench" / f"{top}.py").exists()
            if top != "kmem" and top not in sys.stdlib_module_names and not local:
                # a module not installed here (quixstreams: its application runs in .venv-quix) counts as the
                # distribution of its name
                found.update(_normalized(dist) for dist in providers.get(top, [top]))
    return found


def _normalized(requirement):
    import re

    return re.sub(r"[-_.]+", "-", re.match(r"[\w.-]+", requirement)[0]).lower()


def test_runtime_dependencies_and_extras_are_what_kmem_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {name: {_normalized(r) for r in requirements}
              for name, requirements in project["optional-dependencies"].items()}
    sources = [p for p in (ROOT / "kmem").rglob("*") if p.suffix in (".py", ".pyx", ".pxi")]
    optional = {"spark": [p for p in sources if "spark" in p.parts],
                "metrics": [ROOT / "kmem" / "metrics.py", ROOT / "kmem" / "broker" / "telemetry.py"],
                "pytest": [ROOT / "kmem" / "pytest_plugin.py"],
                "console": [ROOT / "kmem" / "console.py"]}
    core = [p for p in sources if not any(p in files for files in optional.values())]
    runtime = {_normalized(r) for r in project["dependencies"]}
    assert runtime == _imported_distributions(core)
    for extra, files in optional.items():
        # Flask brings Jinja and Werkzeug, which the console uses through it
        assert extras[extra] == _imported_distributions(files) - runtime - CONSOLE_THROUGH_FLASK, extra
    # the tests import their peers and references from the test extra, which includes every optional part
    # (and quixstreams from its own extra: its test skips without it)
    assert _imported_distributions((ROOT / "tests").glob("*.py")) - runtime <= \
        extras["test"] - {"kmem"} | extras["spark"] | extras["metrics"] | extras["pytest"] | extras["docs"] \
        | extras["quix"] | extras["console"] | CONSOLE_THROUGH_FLASK
    assert "kmem" in extras["test"]

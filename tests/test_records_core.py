"""The compiled records core applies decisions it is given and holds none: down-conversion's rules are
a table built in kmem.records.convert; results are named; its parts build in any include order."""
import pathlib
import shutil
import subprocess
import sys

import pytest
from records_samples import read_kmem, scenario_batches

from kmem import _core
from kmem.records import build_control_batch, codecs, convert

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_down_conversion_rules_are_a_python_table():
    action = convert.entry_action
    assert action(2, codecs.NONE, True, 1) == "skip"         # control batches are dropped below v2
    assert action(2, codecs.NONE, True, 2) == "copy"
    assert action(2, codecs.ZSTD, False, 0) == "stop"        # refused by down_convert
    assert action(1, codecs.GZIP, False, 1) == "copy"        # at or below the target: copied unread
    assert action(2, codecs.LZ4, False, 1) == "stop"         # needs a codec: converted in Python
    assert action(2, codecs.NONE, False, 0) == "convert"
    table = convert.ACTION_TABLES[1]
    assert len(table) == _core.ACTION_TABLE_SIZE
    assert table[(2 * 8 + codecs.NONE) * 2 + 1] == _core.ENTRY_ACTIONS["skip"]


def test_core_run_follows_the_table_it_is_given():
    data = scenario_batches("none") + build_control_batch(1, 30, 7, 0, 5)
    every = {name: bytes([code]) * _core.ACTION_TABLE_SIZE for name, code in _core.ENTRY_ACTIONS.items()}
    copied = _core.run_down_conversion(data, 0, actions=every["copy"], to_magic=1, first_offset=0)
    assert bytes(copied.output) == data and copied.stop == len(data) and copied.records == 0
    skipped = _core.run_down_conversion(data, 0, actions=every["skip"], to_magic=1, first_offset=0)
    assert skipped.output == b"" and skipped.stop == len(data)
    stopped = _core.run_down_conversion(data, 0, actions=every["stop"], to_magic=1, first_offset=0)
    assert stopped.output == b"" and stopped.stop == 0
    converted = _core.run_down_conversion(data, 0, actions=every["convert"], to_magic=1, first_offset=11)
    assert (converted.stop, converted.records) == (len(data), 6 + 1)    # offsets 11.. and the marker
    assert [row[0] for row in read_kmem(converted.output)] == [11, 15, 16, 17, 22, 24, 30]
    with pytest.raises(ValueError, match="actions must hold"):
        _core.run_down_conversion(data, 0, actions=b"\1", to_magic=1, first_offset=0)


def test_core_results_are_named():
    section = _core.encode_v2_records([(0, 0, None, b"a", []), (2, 1, b"k", b"b", [])])
    converted = _core.convert_v2_section(section, count=2, base_offset=10, base_timestamp=100, log_append=False,
                                         log_append_time=-1, to_magic=1, relative=True)
    assert (converted.records, converted.last_offset, converted.max_timestamp) == (2, 12, 101)
    inner = _core.encode_legacy_entries(1, 0, [(0, 5, None, b"a"), (4, 6, None, b"b"), (2, 7, None, b"c")])
    scan = _core.scan_legacy_entries(inner)
    assert (scan.count, scan.first, scan.last, scan.lowest, scan.highest) == (3, 0, 2, 0, 4)
    legacy = _core.convert_legacy_section(inner, absolute_base=100, to_magic=0)
    assert (legacy.records, legacy.last_offset) == (3, 102)


@pytest.mark.slow
def test_core_parts_compile_in_any_include_order(tmp_path):
    for part in [ROOT / "kmem" / "_core.pxd", *(ROOT / "kmem").glob("_*.pxi")]:
        shutil.copy(part, tmp_path)
    source = (ROOT / "kmem" / "_core.pyx").read_text().splitlines()
    includes = [line for line in source if line.startswith("include ")]
    (tmp_path / "_core.pyx").write_text("\n".join([line for line in source if not line.startswith("include ")]
                                                  + includes[::-1]) + "\n")
    result = subprocess.run([sys.executable, "-m", "cython", "-3", "_core.pyx"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr

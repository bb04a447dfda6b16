"""The shared helpers: the one (compressed) JSONL reader, the one content hasher and the one
percentile helper."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from eagle3_pipeline.runtime.files import (
    TruncatedFile,
    atomic_path,
    iter_byte_lines,
    iter_jsonl,
    iter_lines,
    sha256_tree,
    temporary_path,
    write_jsonl,
)
from eagle3_pipeline.stats import median, percentiles


def test_sha256_tree_hashes_content_and_names_not_location(tmp_path):
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "state.json").write_text("{}")
    (a / "sub" / "data.arrow").write_bytes(b"rows")
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    assert sha256_tree(a) == sha256_tree(b)
    (b / "sub" / "data.arrow").write_bytes(b"rowz")
    assert sha256_tree(a) != sha256_tree(b)
    (b / "sub" / "data.arrow").write_bytes(b"rows")
    (b / "sub" / "data.arrow").rename(b / "sub" / "other.arrow")
    assert sha256_tree(a) != sha256_tree(b)


def test_percentiles_are_numpys():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    got = percentiles(values, (0, 25, 50, 90, 100))
    assert got == pytest.approx(
        dict(
            zip(
                ["p0", "p25", "p50", "p90", "p100"],
                np.percentile(values, [0, 25, 50, 90, 100]),
                strict=True,
            )
        )
        | {"mean": np.mean(values)}
    )
    assert percentiles(np.array(values)) == percentiles(iter(values))
    assert percentiles([]) == {} and median([]) is None and median([1, 2, 3, 10]) == 2.5


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.zst", "rows.jsonl.gz"])
def test_one_reader_for_plain_zstd_and_gzip_jsonl(tmp_path, name):
    rows = [{"id": f"r{i}", "text": "x" * i} for i in range(5000)]
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n\n" for r in rows)  # blank lines are skipped
    else:
        write_jsonl(path, rows)
    assert list(iter_jsonl(path)) == rows
    read = []
    lines = list(iter_lines(path, read.append))
    assert sum(read) == path.stat().st_size and len(read) > 2  # progress as it goes
    assert json.loads(lines[-1] if lines[-1].strip() else lines[-2]) == rows[-1]


def test_reader_decodes_bad_utf8_as_told(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    with pytest.raises(UnicodeDecodeError):
        list(iter_lines(path))
    assert list(iter_lines(path, errors="replace"))[1] == '{"b": "\ufffd"}\n'


def test_a_truncated_zstd_file_is_an_error_not_a_short_read(tmp_path):
    """zstandard's own stream reader ends quietly inside a cut frame, as if the file were
    whole: the rows past the cut would be lost without a word."""
    rows = [{"id": f"r{i}", "text": "y" * 50} for i in range(2000)]
    path = tmp_path / "rows.jsonl.zst"
    write_jsonl(path, rows)
    whole = path.read_bytes()
    assert [json.loads(x) for x in iter_byte_lines(path)] == rows
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TruncatedFile, match="ends inside a zstd frame: it is truncated"):
        list(iter_lines(path))
    path.write_bytes(whole + whole)  # two whole frames one after another are read on
    assert len(list(iter_jsonl(path))) == 2 * len(rows)


def test_a_killed_writers_temporary_is_removed_by_the_next_writer(tmp_path):
    target = tmp_path / "out.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = temporary_path(target).with_name(
        temporary_path(target).name.rsplit("-", 1)[0] + f"-{dead.pid}"
    )
    stale.write_bytes(b"")  # a 0-byte file, as SIGKILL leaves it
    live = temporary_path(target)  # this process's: it is alive, and is left alone
    assert live.name == f".out.json.tmp-{os.uname().nodename}-{os.getpid()}"
    other_host = tmp_path / ".out.json.tmp-elsewhere-1"
    other_host.write_bytes(b"x")
    with atomic_path(target) as tmp:
        assert not stale.exists() and other_host.exists()
        tmp.write_text("{}")
    assert target.read_text() == "{}" and not live.exists()

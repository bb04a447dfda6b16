"""The shared helpers: the one content hasher and the one percentile helper."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from eagle3_pipeline.fileio import sha256_tree
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
        dict(zip(["p0", "p25", "p50", "p90", "p100"], np.percentile(values, [0, 25, 50, 90, 100])))
        | {"mean": np.mean(values)}
    )
    assert percentiles(np.array(values)) == percentiles(iter(values))
    assert percentiles([]) == {} and median([]) is None and median([1, 2, 3, 10]) == 2.5

"""Stage vocab: counts of the trained tokens, the speculators vocab map, K selection, coverage."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from eagle3_pipeline.prepare import stage as prepare
from eagle3_pipeline.runtime import files as fileio
from eagle3_pipeline.vocab import stage as vocab

from synth_rows import record, write_lines, write_records


@pytest.fixture(scope="module")
def spec_build():
    """speculators' own map builder (importing speculators takes ~30 s: once per module)."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    return build_vocab_mappings_from_distribution


def npy_bytes(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def assert_same_as_speculators(spec_build, counts, k, with_zeros=False):
    v = len(counts)
    freq = {i: int(c) for i, c in enumerate(counts) if with_zeros or c > 0}
    d2t_ref, t2d_ref = spec_build(freq, k, v)
    d2t, t2d = vocab.build_vocab_mappings(counts, k)
    assert npy_bytes(d2t) == npy_bytes(d2t_ref.numpy())
    assert npy_bytes(t2d) == npy_bytes(t2d_ref.numpy())


# ------------------------------------------------------------------------------------------
# The map: byte-identical to speculators
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_map_matches_speculators_on_random_counts(spec_build, seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(50, 3000))
    # small count range -> many ties; about half the ids never seen
    counts = rng.integers(0, 6, v) * (rng.random(v) < 0.5)
    distinct = int(np.count_nonzero(counts))
    ks = {1, 2, 7, max(1, distinct // 2), distinct, distinct + 1, min(v, distinct + 37), v - 1, v}
    for k in sorted(x for x in ks if 1 <= x <= v):
        assert_same_as_speculators(spec_build, counts, k)
    # speculators builds its dict from observed tokens only; a dict listing the unseen ids
    # with count 0 gives the same map
    assert_same_as_speculators(spec_build, counts, min(v, distinct + 5), with_zeros=True)


def test_map_matches_speculators_on_zipf_counts(spec_build):
    rng = np.random.default_rng(11)
    v = 49152
    counts = np.bincount(rng.zipf(1.3, 200_000) % v, minlength=v)
    for k in (256, 1000, 8192, v):
        assert_same_as_speculators(spec_build, counts, k)


def test_map_format_and_ties():
    counts = np.array([0, 4, 2, 4, 0, 9, 2, 4, 0, 0])
    d2t, t2d = vocab.build_vocab_mappings(counts, 3)
    # 9 (id 5), then the tie of 4s -> the smaller ids 1 and 3 win over 7
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_
    assert (np.arange(3) + d2t).tolist() == [1, 3, 5]
    assert d2t.tolist() == [1, 2, 3]
    assert np.flatnonzero(t2d).tolist() == [1, 3, 5]
    # ties among the 2s: id 2 before id 6
    assert (np.arange(6) + vocab.build_vocab_mappings(counts, 6)[0]).tolist() == [1, 2, 3, 5, 6, 7]


def test_k_larger_than_distinct_fills_with_smallest_unseen_ids():
    counts = np.zeros(12, dtype=np.int64)
    counts[[7, 2, 9]] = [5, 3, 3]
    d2t, t2d = vocab.build_vocab_mappings(counts, 5)
    assert (np.arange(5) + d2t).tolist() == [0, 1, 2, 7, 9]
    assert d2t.tolist() == [0, 0, 0, 4, 5]
    assert t2d.sum() == 5


def test_k_equal_v_is_identity_and_k_above_v_is_refused(spec_build):
    counts = np.array([3, 0, 1, 7, 0])
    d2t, t2d = vocab.build_vocab_mappings(counts, 5)
    assert d2t.tolist() == [0, 0, 0, 0, 0]
    assert t2d.all()
    assert_same_as_speculators(spec_build, counts, 5)
    # speculators cannot build K > V either (it fails indexing t2d); we say why instead
    with pytest.raises(IndexError):
        spec_build({0: 3, 2: 1, 3: 7}, 6, 5)
    with pytest.raises(ValueError, match="must be in"):
        vocab.build_vocab_mappings(counts, 6)
    with pytest.raises(ValueError, match="must be in"):
        vocab.choose_k(counts, 6, 0.9)


# ------------------------------------------------------------------------------------------
# Choosing K
# ------------------------------------------------------------------------------------------


def test_auto_k_rounds_up_to_256_and_caps_at_v():
    v = 5000
    counts = np.zeros(v, dtype=np.int64)
    counts[:1000] = 1  # coverage grows by 0.1 % per token up to K = 1000
    assert vocab.choose_k(counts, "auto", 0.300) == (512, "auto", 300)
    assert vocab.choose_k(counts, "auto", 0.256) == (256, "auto", 256)
    assert vocab.choose_k(counts, "auto", 0.2561) == (512, "auto", 257)
    assert vocab.choose_k(counts, "auto", 1.0) == (1024, "auto", 1000)
    assert vocab.choose_k(counts, 300, 0.98) == (300, "fixed", 980)
    small = np.ones(1000, dtype=np.int64)
    assert vocab.choose_k(small, "auto", 0.99) == (1000, "auto", 990)  # 1024 capped at V


def test_coverage_curve():
    counts = np.array([1, 0, 6, 3])
    assert vocab.coverage_curve(counts).tolist() == [0.6, 0.9, 1.0, 1.0]
    with pytest.raises(ValueError, match="no tokens"):
        vocab.coverage_curve(np.zeros(4))


# ------------------------------------------------------------------------------------------
# Counting
# ------------------------------------------------------------------------------------------


def mixed_rows(seed: int, n: int = 300) -> list[bytes]:
    """Lines with every case: truncation, prompts filling the window, ties, malformed rows."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        p = rng.integers(1, 40)
        c = rng.integers(1, 40)
        ids = rng.zipf(1.5, p + c) % 500
        lines.append(
            json.dumps(
                record(f"r{i}", ids[:p].tolist(), ids[p:].tolist()), separators=(",", ":")
            ).encode()
        )
    lines[10] = b'{"id":"x","prompt_token_ids":[1],"completion_token_ids":[2.0]}'
    lines[50] = b'{"id":"y","prompt_token_ids":[],"completion_token_ids":[2]}'
    lines[90] = b'{"id":"z", "prompt_token_ids": [1, 2], "completion_token_ids": [7, 7, 8]}'
    lines[130] = b"not json"
    lines[210] = b'{"id":"v","prompt_token_ids":[1],"completion_token_ids":[-5]}'
    return lines


def prepared(tmp_path, records, seq_length):
    """The prepare stage's data set of ``records`` and its stats."""
    stats = prepare.build_dataset(
        records, tmp_path / "ds", tmp_path / "ds.json", seq_length, seed=0
    )
    return tmp_path / "ds", stats


@pytest.mark.parametrize("seq_length", [16, 48, 1000])
def test_counts_are_the_loss_masked_tokens_of_the_dataset(tmp_path, seq_length):
    records = write_lines(tmp_path / "synth.jsonl.zst", mixed_rows(seq_length))
    ds_dir, ds_stats = prepared(tmp_path, records, seq_length)
    counts, stats = vocab.count_tokens(ds_dir, 512)

    import datasets  # the reference: row by row, through the datasets library

    ds = datasets.load_from_disk(str(ds_dir)).with_format("numpy")
    expected = np.zeros(512, dtype=np.int64)
    for row in ds:
        expected += np.bincount(row["input_ids"][row["loss_mask"] == 1], minlength=512)
    assert np.array_equal(counts, expected)
    assert stats["tokens_counted"] == ds_stats["tokens_trainable"] == int(expected.sum())
    assert stats["rows"] == ds_stats["rows_kept"] < 300
    assert stats["tokens_total"] == ds_stats["tokens_total"]


def test_counts_by_hand(tmp_path):
    rows = [
        record("a", [9, 9], [1, 2, 2, 3]),  # seq 5: trainable 1, 2, 2
        record("b", [9, 9, 9, 9, 9], [4, 5]),  # prompt fills the window: dropped by prepare
        record("c", [9], [3, 3, 3, 3, 3, 3]),
    ]  # trainable 3 x 4
    ds_dir, _ = prepared(tmp_path, write_records(tmp_path / "s.jsonl.zst", rows), 5)
    counts, stats = vocab.count_tokens(ds_dir, 10)
    assert counts.tolist() == [0, 1, 2, 4, 0, 0, 0, 0, 0, 0]
    assert stats == {"rows": 2, "tokens_total": 10, "tokens_counted": 7}


def test_token_id_beyond_target_vocab_is_an_error(tmp_path):
    records = write_records(tmp_path / "s.jsonl.zst", [record("a", [1], [2, 10])])
    ds_dir, _ = prepared(tmp_path / "full", records, 100)
    with pytest.raises(ValueError, match="target vocab size 10"):
        vocab.count_tokens(ds_dir, 10)
    # ...unless truncation cut it away
    ds_dir, _ = prepared(tmp_path / "cut", records, 2)
    assert vocab.count_tokens(ds_dir, 10)[0][2] == 1


# ------------------------------------------------------------------------------------------
# The stage
# ------------------------------------------------------------------------------------------


def hand_example(tmp_path, vocab_size=3000):
    """Token 0 x 1000 and tokens 1..1999 once each: 2999 tokens, 2000 distinct."""
    completion = [0] * 1000 + list(range(1, 2000))
    records = write_records(
        tmp_path / "synth.jsonl.zst",
        [record("a", [5], completion[:1500]), record("b", [5], completion[1500:])],
    )
    target = tmp_path / "target.json"
    fileio.write_json(
        target, {"model_path": "/nowhere", "architecture": {"vocab_size": vocab_size}}
    )
    return prepared(tmp_path, records, 4096)[0], target


def run_build(tmp_path, dataset, target, k, coverage=0.98):
    out = tmp_path / "vocab"
    cov = vocab.build(
        dataset,
        target,
        out / "d2t.npy",
        out / "t2d.npy",
        out / "token_freq.npy",
        out / "coverage.json",
        out / "coverage.png",
        draft_vocab_size=k,
        target_coverage=coverage,
    )
    return out, cov


def test_build_fixed_k_outputs(tmp_path):
    dataset, target = hand_example(tmp_path)
    out, cov = run_build(tmp_path, dataset, target, k=1024)
    assert cov == fileio.read_json(out / "coverage.json")
    assert cov["draft_vocab_size"] == 1024 and cov["selection"] == "fixed"
    assert cov["target_vocab_size"] == 3000
    assert cov["tokens_counted"] == 2999
    assert cov["distinct_tokens"] == 2000
    assert cov["coverage"] == pytest.approx(2023 / 2999)
    assert cov["coverage_at"] == {"1024": pytest.approx(2023 / 2999), "2048": 1.0}
    # 98 % of 2999 = 2939.02 tokens: 1000 + (K - 1) >= 2939.02 -> K = 1941
    assert cov["k_for_target_coverage"] == 1941
    assert cov["counting"]["rows"] == 2
    assert cov["provenance"]["params"]["draft_vocab_size"] == 1024
    assert set(cov["provenance"]["inputs"]) == {"dataset", "target"}

    freq = np.load(out / "token_freq.npy")
    assert freq.dtype == np.int64 and freq.shape == (3000,)
    assert freq[0] == 1000 and freq[1:2000].tolist() == [1] * 1999 and freq[2000:].sum() == 0
    d2t, t2d = np.load(out / "d2t.npy"), np.load(out / "t2d.npy")
    assert d2t.dtype == np.int64 and d2t.shape == (1024,)
    assert t2d.dtype == np.bool_ and t2d.shape == (3000,)
    # token 0, then ties of count 1 -> smallest ids 1..1023
    assert (np.arange(1024) + d2t).tolist() == list(range(1024))
    assert np.flatnonzero(t2d).tolist() == list(range(1024))
    png = (out / "coverage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert sorted(p.name for p in out.iterdir()) == [
        "coverage.json",
        "coverage.png",
        "d2t.npy",
        "t2d.npy",
        "token_freq.npy",
    ]


def test_build_auto_k(tmp_path, spec_build):
    dataset, target = hand_example(tmp_path)
    # 50 %: 1000 + (K - 1) >= 1499.5 -> K = 501 -> 512
    out, cov = run_build(tmp_path, dataset, target, k="auto", coverage=0.5)
    assert (cov["draft_vocab_size"], cov["selection"], cov["k_for_target_coverage"]) == (
        512,
        "auto",
        501,
    )
    assert cov["coverage"] == pytest.approx(1511 / 2999)
    assert cov["configured_draft_vocab_size"] == "auto"
    freq = np.load(out / "token_freq.npy")
    d2t_ref, t2d_ref = spec_build({i: int(c) for i, c in enumerate(freq) if c}, 512, 3000)
    assert (out / "d2t.npy").read_bytes() == npy_bytes(d2t_ref.numpy())
    assert (out / "t2d.npy").read_bytes() == npy_bytes(t2d_ref.numpy())


def test_build_on_the_real_target_vocab(tmp_path, target_json):
    """V comes from target.json: SmolLM2's 49152."""
    records = write_records(
        tmp_path / "s.jsonl.zst", [record("a", [1, 2], [49151, 3, 3, 2]), record("b", [1], [7])]
    )
    dataset, _ = prepared(tmp_path, records, 4096)
    out, cov = run_build(tmp_path, dataset, target_json, k="auto", coverage=0.98)
    assert cov["target_vocab_size"] == 49152
    assert np.load(out / "t2d.npy").shape == (49152,)
    assert cov["draft_vocab_size"] == 256 and cov["coverage"] == 1.0
    assert sorted(cov["coverage_at"]) == sorted(["1024", "2048", "4096", "8192", "16384", "32768"])
    assert np.flatnonzero(np.load(out / "token_freq.npy")).tolist() == [2, 3, 7, 49151]

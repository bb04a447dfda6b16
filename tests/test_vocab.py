"""Stage vocab: counts of the trained tokens, the speculators vocab map, K selection, coverage."""

from __future__ import annotations

import importlib.util
import io
import json

import numpy as np
import pytest

from eagle3_pipeline import fileio, prepare, vocab
from synth_rows import record, write_lines, write_records

# The fast way needs msgspec and numba (both pinned in envs/cpu-lock.txt); without them the
# stage counts with the exact way only, and these tests of the fast way are skipped.
HAS_FAST = all(importlib.util.find_spec(m) for m in ("msgspec", "numba"))
needs_fast = pytest.mark.skipif(not HAS_FAST, reason="msgspec or numba missing")
METHODS = ["json", pytest.param("fast", marks=needs_fast)]


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
    """Lines with every case: truncation, prompts filling the window, ties, malformed rows,
    and rows the fast way hands to the exact one (spaces, 10-digit ids)."""
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
    lines[170] = b'{"id":"w","prompt_token_ids":[1234567890],"completion_token_ids":[5]}'
    lines[210] = b'{"id":"v","prompt_token_ids":[1],"completion_token_ids":[-5]}'
    return lines


def dataset_counts(tmp_path, records, seq_length, vocab_size):
    """Counts of the loss-masked tokens of the prepared data set."""
    prepare.build_dataset(records, tmp_path / "ds", tmp_path / "ds.json", seq_length, seed=0)
    import datasets

    ds = datasets.load_from_disk(str(tmp_path / "ds")).with_format("numpy")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in ds:
        counts += np.bincount(row["input_ids"][row["loss_mask"] == 1], minlength=vocab_size)
    return counts, fileio.read_json(tmp_path / "ds.json")


@needs_fast
@pytest.mark.parametrize("seq_length", [16, 48, 1000])
def test_fast_and_exact_counts_match_each_other_and_the_dataset(tmp_path, seq_length):
    assert vocab.fast_available()
    records = write_lines(tmp_path / "synth.jsonl.zst", mixed_rows(seq_length))
    exact, s_exact = vocab.count_tokens(records, 512, seq_length, method="json", chunk_bytes=2048)
    fast, s_fast = vocab.count_tokens(records, 512, seq_length, method="fast", chunk_bytes=2048)
    assert s_fast["chunks_fast"] > 0 and s_fast["chunks_exact"] > 0
    assert s_exact["chunks_fast"] == 0
    assert np.array_equal(fast, exact)
    strip = ("chunks_fast", "chunks_exact", "method")
    assert {k: v for k, v in s_fast.items() if k not in strip} == {
        k: v for k, v in s_exact.items() if k not in strip
    }

    from_ds, ds_stats = dataset_counts(tmp_path, records, seq_length, 512)
    assert np.array_equal(fast, from_ds)
    assert s_fast["tokens_counted"] == ds_stats["tokens_trainable"] == int(from_ds.sum())
    assert s_fast["rows_counted"] == ds_stats["rows_kept"]
    assert s_fast["rows_in"] == ds_stats["rows_in"] == 300
    assert s_fast["dropped_by_reason"] == ds_stats["dropped_by_reason"]
    assert s_fast["dropped_by_reason"]["invalid_json"] == 1


@pytest.mark.parametrize("method", METHODS)
def test_counts_by_hand(tmp_path, method):
    rows = [
        record("a", [9, 9], [1, 2, 2, 3]),  # seq 5: trainable 1, 2, 2
        record("b", [9, 9, 9, 9, 9], [4, 5]),  # prompt fills the window: nothing
        record("c", [9], [3, 3, 3, 3, 3, 3]),
    ]  # trainable 3 x 4
    records = write_records(tmp_path / "s.jsonl.zst", rows)
    counts, stats = vocab.count_tokens(records, 10, 5, method=method)
    assert counts.tolist() == [0, 1, 2, 4, 0, 0, 0, 0, 0, 0]
    assert stats["rows_counted"] == 2
    assert stats["dropped_by_reason"] == {"no_trainable_tokens": 1}
    assert stats["tokens_counted"] == 7
    assert stats["method"] == method


def test_auto_falls_back_to_the_exact_way_without_msgspec_or_numba(tmp_path, monkeypatch):
    records = write_records(tmp_path / "s.jsonl.zst", [record("a", [1], [2, 3, 3])])
    monkeypatch.setattr(vocab, "_fast_tools", lambda: None)
    counts, stats = vocab.count_tokens(records, 5, 100)
    assert stats["method"] == "json" and counts.tolist() == [0, 0, 1, 2, 0]
    with pytest.raises(RuntimeError, match="msgspec and numba"):
        vocab.count_tokens(records, 5, 100, method="fast")


@pytest.mark.parametrize("method", METHODS)
def test_token_id_beyond_target_vocab_is_an_error(tmp_path, method):
    records = write_records(tmp_path / "s.jsonl.zst", [record("a", [1], [2, 10])])
    with pytest.raises(ValueError, match="target vocab size 10"):
        vocab.count_tokens(records, 10, 100, method=method)
    # ...unless truncation cuts it away
    assert vocab.count_tokens(records, 10, 2, method=method)[0][2] == 1


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=needs_fast)])
def test_parse_kernel(jit):
    parse = vocab._fast_tools()["parse"] if jit else vocab._parse_id_arrays

    def run(text: bytes, budget):
        buf = np.frombuffer(text, dtype=np.uint8)
        ids = np.zeros(len(text), dtype=np.int64)
        lengths = np.zeros(len(budget), dtype=np.int64)
        m = parse(buf, np.array(budget, dtype=np.int64), ids, lengths)
        return m, ids[: max(m, 0)].tolist(), lengths.tolist()

    assert run(b"[1,22][333][0,4,5]", [1, 5, 2]) == (4, [1, 333, 0, 4], [2, 1, 3])
    assert run(b"[1,22][333]", [0, 0]) == (0, [], [2, 1])
    assert run(b"[123456789]", [1]) == (1, [123456789], [1])
    for bad, budget in [
        (b"[]", [1]),
        (b"[1,,2]", [3]),
        (b"[1, 2]", [2]),
        (b"[-1]", [1]),
        (b"[1.0]", [1]),
        (b"[[1]]", [1]),
        (b"[1234567890]", [1]),
        (b"[1][2]", [1]),
        (b"[1]", [1, 1]),
        (b"[1", [1]),
        (b"1]", [1]),
        (b'["1"]', [1]),
        (b"[1]x", [1]),
    ]:
        assert run(bad, budget)[0] == -1, bad


def test_prefetch_passes_errors_and_stops():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x in vocab.prefetch(items()):
            got.append(x)
    assert got == [1, 2]
    gen = vocab.prefetch(iter(range(10**6)), depth=2)
    assert next(gen) == 0
    gen.close()  # the producer thread stops instead of filling memory


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
    return records, target


def run_build(tmp_path, records, target, k, coverage=0.98, seq_length=4096):
    out = tmp_path / "vocab"
    cov = vocab.build(
        records,
        target,
        out / "d2t.npy",
        out / "t2d.npy",
        out / "token_freq.npy",
        out / "coverage.json",
        out / "coverage.png",
        draft_vocab_size=k,
        target_coverage=coverage,
        seq_length=seq_length,
    )
    return out, cov


def test_build_fixed_k_outputs(tmp_path):
    records, target = hand_example(tmp_path)
    out, cov = run_build(tmp_path, records, target, k=1024)
    assert cov == fileio.read_json(out / "coverage.json")
    assert cov["draft_vocab_size"] == 1024 and cov["selection"] == "fixed"
    assert cov["target_vocab_size"] == 3000
    assert cov["tokens_counted"] == 2999
    assert cov["distinct_tokens"] == 2000
    assert cov["coverage"] == pytest.approx(2023 / 2999)
    assert cov["coverage_at"] == {"1024": pytest.approx(2023 / 2999), "2048": 1.0}
    # 98 % of 2999 = 2939.02 tokens: 1000 + (K - 1) >= 2939.02 -> K = 1941
    assert cov["k_for_target_coverage"] == 1941
    assert cov["counting"]["rows_counted"] == 2
    assert cov["provenance"]["params"]["draft_vocab_size"] == 1024
    assert set(cov["provenance"]["inputs"]) == {"records", "target"}

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
    records, target = hand_example(tmp_path)
    # 50 %: 1000 + (K - 1) >= 1499.5 -> K = 501 -> 512
    out, cov = run_build(tmp_path, records, target, k="auto", coverage=0.5)
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
    out, cov = run_build(tmp_path, records, target_json, k="auto", coverage=0.98)
    assert cov["target_vocab_size"] == 49152
    assert np.load(out / "t2d.npy").shape == (49152,)
    assert cov["draft_vocab_size"] == 256 and cov["coverage"] == 1.0
    assert sorted(cov["coverage_at"]) == sorted(["1024", "2048", "4096", "8192", "16384", "32768"])
    assert np.flatnonzero(np.load(out / "token_freq.npy")).tolist() == [2, 3, 7, 49151]

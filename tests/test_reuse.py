"""Reuse of finished work by content, without a server: which synth answers, extracted samples
and benchmark results a re-run keeps (the stages' idempotence; tests/test_rerun_matrix.py runs
it for real on a CI-sized run)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from eagle3_pipeline import bench, extract
from eagle3_pipeline.bench import cache, measure, stage
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.runtime.files import read_json, write_json
from eagle3_pipeline.runtime.results import EXTRACT_PART, HIDDEN_STATES, TRAIN_METRICS, format_tag
from eagle3_pipeline.synth import answers

from conftest import default_config

# ---- synth: answers keyed by prompt --------------------------------------------------------


def prompt(pid: str, text: str) -> dict:
    return {"id": pid, "source": "t", "messages": [{"role": "user", "content": text}]}


def entry(p: dict, status: str = "ok", **kw) -> dict:
    return {"status": status, "id": p["id"], "key": answers.prompt_key(p), **kw}


def test_synth_reuses_answers_of_unchanged_prompts_only():
    a, b, c = prompt("a", "first"), prompt("b", "second"), prompt("c", "third")
    journal = [entry(a), entry(b), entry(c, "failed")]
    edited_b = prompt("b", "second, edited")
    done = answers.settled(journal, [a, edited_b, c], max_model_len=2048)
    assert set(done) == {"a"}  # b changed, c failed: both asked again
    # a later ok replaces an earlier failure of the same prompt
    assert set(answers.settled([*journal, entry(c)], [a, c], 2048)) == {"a", "c"}
    # the id is part of the key (it seeds sampling)
    assert answers.prompt_key(prompt("x", "same")) != answers.prompt_key(prompt("y", "same"))


def test_synth_retries_rejections_only_under_another_context_length():
    p = prompt("long", "x" * 100)
    journal = [entry(p, "rejected", max_model_len=1024)]
    assert set(answers.settled(journal, [p], 1024)) == {"long"}
    assert answers.settled(journal, [p], 4096) == {}


def test_synth_journal_fingerprint_ignores_the_prompts_and_operational_keys():
    cfg = default_config()
    target = {"identity": "t1", "model_path": "/somewhere"}
    fp = answers.fingerprint(target, cfg["synth"], cfg["vllm"])
    busy = default_config(synth={"concurrency": 3, "retries": 9}, vllm={"startup_timeout_s": 5})
    moved = {"identity": "t1", "model_path": "/elsewhere"}
    assert answers.fingerprint(moved, busy["synth"], busy["vllm"]) == fp
    hotter = default_config(synth={"temperature": 0.7})
    assert answers.fingerprint(target, hotter["synth"], hotter["vllm"]) != fp
    assert answers.fingerprint({"identity": "t2"}, cfg["synth"], cfg["vllm"]) != fp


# ---- extract: samples keyed by their row's token ids ---------------------------------------


def sample(root, index: int, S: int, key: str, payload: bytes) -> dict:
    path = shards.sample_path(root, index, S)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return {
        "index": index,
        "key": key,
        "tokens": 3,
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "mtime_ns": path.stat().st_mtime_ns,
        "agree": [2, 3],
    }


def store(root, S: int, keys: list[str], capture="c1") -> extract.ShardBook:
    """A finished part over rows 0..len(keys)-1 whose sample i holds b'data-<key>'."""
    pool = extract.reset_layout(root, capture, S, len(keys))
    book = extract.ShardBook(root, S, range(len(keys)), dict(enumerate(keys)), pool)
    for i, k in enumerate(keys):
        book.record(sample(root, i, S, k, f"data-{k}".encode()))
    book.close()
    return book


def reopen(root, S: int, keys: list[str], capture="c1") -> tuple[extract.ShardBook, list[int]]:
    """What run_part does before it extracts: returns the book and the rows left to do."""
    pool = extract.reset_layout(root, capture, S, len(keys))
    book = extract.ShardBook(root, S, range(len(keys)), dict(enumerate(keys)), pool)
    book.scan()
    adopted = [i for i in range(len(keys)) if i not in book.done and book.adopt(i)]
    assert all(i in book.done for i in adopted)
    book.close()
    return book, [i for i in range(len(keys)) if i not in book.done]


def content(root, i: int, S: int) -> bytes:
    return shards.sample_path(root, i, S).read_bytes()


def test_extract_reuses_rows_that_moved_and_redoes_only_new_ones(tmp_path):
    store(tmp_path, 4, ["a", "b", "c", "d", "e", "f"])
    # an edited prompt pool: prepare's shuffle moves rows, "c" is gone, "x" is new
    keys = ["f", "x", "a", "e", "b", "d"]
    book, todo = reopen(tmp_path, 4, keys)
    assert todo == [1]
    for i, k in enumerate(keys):
        if i != 1:
            assert content(tmp_path, i, 4) == f"data-{k}".encode()
            assert book.done[i]["key"] == k and book.done[i]["index"] == i
    assert not shards.sample_path(tmp_path, 1, 4).exists()  # c's file left row 1
    # the same rows again: everything stays where it is
    book2, todo2 = reopen(tmp_path, 4, keys)
    assert todo2 == [1] and book2.pooled == 0


def test_extract_new_shard_size_keeps_every_sample(tmp_path):
    store(tmp_path, 4, ["a", "b", "c", "d", "e"])
    _, todo = reopen(tmp_path, 2, ["a", "b", "c", "d", "e"])
    assert todo == []
    assert content(tmp_path, 4, 2) == b"data-e"
    assert not (shards.shard_dir(tmp_path, 3)).exists()  # nothing left in old shards


def test_extract_fewer_rows_keep_their_samples_and_another_capture_drops_all(tmp_path):
    store(tmp_path, 2, ["a", "b", "c", "d", "e"])
    _, todo = reopen(tmp_path, 2, ["e", "a"])  # shards past the end go to the pool first
    assert todo == []
    assert content(tmp_path, 0, 2) == b"data-e"
    _, todo = reopen(tmp_path, 2, ["e", "a"], capture="c2")  # e.g. other layer ids
    assert todo == [0, 1]
    assert not (tmp_path / "shards").exists() or not any(
        (tmp_path / "shards").rglob("*.safetensors")
    )


def test_extract_trusts_untouched_files_and_rehashes_touched_ones(tmp_path):
    store(tmp_path, 4, ["a", "b", "c"])
    path = shards.sample_path(tmp_path, 1, 4)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _, todo = reopen(tmp_path, 4, ["a", "b", "c"])
    assert todo == []  # touched but the same content: its sha256 is checked and matches
    path.write_bytes(b"data-B")  # same size, other content
    book, todo = reopen(tmp_path, 4, ["a", "b", "c"])
    assert todo == [1] and book.corrupt == [1]


def test_gather_frees_samples_no_row_uses(tmp_path):
    store(tmp_path, 4, ["a", "b", "c", "d"])
    reopen(tmp_path, 4, ["a", "b"])  # c and d wait in the pool
    pooled = list((tmp_path / extract.REUSE).rglob("*.safetensors"))
    assert len(pooled) == 2
    part = {
        "part": 0,
        "samples": [0, 2],
        "tokens": 6,
        "bytes": 12,
        "root": str(tmp_path),
        "layer_ids": [2, 30],
        "aux_layer_ids": [2],
        "final_layer_id": 30,
        "hidden_size": 8,
        "storage": "bf16",
        "samples_per_shard": 4,
        "shards": [],
        "this_run": {},
        "verification": {
            "samples_checked": 2,
            "next_token_agreement": 1.0,
            "next_token_positions": 4,
            "reference": None,
        },
    }
    write_json(tmp_path / "parts" / "part_0.json", {"format": format_tag(EXTRACT_PART), **part})
    extract.gather([tmp_path / "parts" / "part_0.json"], tmp_path / "manifest.json", {})
    assert not (tmp_path / extract.REUSE).exists()


# ---- bench: results cached per prompt set --------------------------------------------------


def test_bench_fingerprint_covers_what_a_measurement_depends_on(tmp_path):
    cfg = default_config()
    settings = cache.measurement_settings(cfg["bench"], cfg["vllm"])
    assert "bench.prompt_sets" not in settings and "bench.gate" not in settings
    assert settings["bench.max_tokens"] == cfg["bench"]["max_tokens"]
    # rounds as they run on this device (auto: 1 on the CPU), and how they pair
    assert settings["bench.rounds"] == 1 and settings["bench.pairing"] == "alternate"
    on_gpu = cache.measurement_settings(cfg["bench"], {**cfg["vllm"], "device": "cuda"})
    assert on_gpu["bench.rounds"] == 3
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "1"}\n')
    target = {"identity": "t"}
    fp = cache.set_fingerprint("d", target, prompts, settings)
    assert cache.set_fingerprint("d", target, prompts, dict(settings)) == fp
    assert cache.set_fingerprint("d2", target, prompts, settings) != fp
    assert cache.set_fingerprint("d", {"identity": "t2"}, prompts, settings) != fp
    assert cache.set_fingerprint("d", target, prompts, {**settings, "bench.max_tokens": 1}) != fp
    assert cache.set_fingerprint("d", target, prompts, {**settings, "bench.rounds": 5}) != fp
    prompts.write_text('{"id": "2"}\n')
    assert cache.set_fingerprint("d", target, prompts, settings) != fp


def test_drafter_identity_ignores_where_the_verifier_lives(tmp_path):
    cfg = {"speculators_config": {"verifier": {"name_or_path": "/a/model", "architectures": []}}}
    write_json(tmp_path / "config.json", cfg)
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    first = cache.drafter_identity(tmp_path)
    cfg["speculators_config"]["verifier"]["name_or_path"] = "/b/model"
    write_json(tmp_path / "config.json", cfg)
    assert cache.drafter_identity(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    assert cache.drafter_identity(tmp_path) != first


def user(text: str) -> dict:
    return {"role": "user", "content": text}


@pytest.fixture
def bench_inputs(tmp_path, monkeypatch, target_json):
    """A drafter, target (the packaged model's tokenizer counts the prompts) and manifest that
    pass the consistency check, and vLLM servers replaced by passes that record what they are
    asked to measure (the baseline server at 10 tok/s, the drafter's at 12)."""
    asked: list[tuple[str, list[str]]] = []

    class Server:
        def __init__(self, spec_cfg):
            self.drafter = spec_cfg is not None
            self.k = (spec_cfg or {}).get("num_speculative_tokens")

        def stop(self):
            pass

    def one_pass(server, prompts, temperature, concurrency, cfg, spec):
        res = {
            "requests": len(prompts),
            "output_tokens": 10,
            "wall_s": 1.0,
            "tokens_per_s": 12.0 if server.drafter else 10.0,
            "latencies_s": [0.1],
            "outputs": [[1, 2, 3]],
        }
        if spec:
            res["counts"] = {
                "drafts": 10,
                "draft_tokens": 30,
                "accepted": 5,
                "accepted_per_position": [3, 1, 1],
            }
        return res

    def recorded(what, real):
        def fn(*args):
            asked.append((what or args[4], sorted(args[1])))  # measure_rounds(..., who, done)
            return real(*args)

        return fn

    monkeypatch.setattr(measure, "one_pass", one_pass)
    monkeypatch.setattr(measure, "warm_up", lambda *a: None)
    monkeypatch.setattr(stage, "measure_alternating", recorded("pair", measure.measure_alternating))
    monkeypatch.setattr(stage, "measure_rounds", recorded(None, measure.measure_rounds))
    monkeypatch.setattr(stage, "start_server", lambda *a, **k: Server(a[3]))
    monkeypatch.setattr(
        stage.consistency,
        "check",
        lambda *a: {"ok": True, "problems": [], "drafter": {"speculators_model_type": "eagle3"}},
    )
    write_json(tmp_path / "target.json", {**read_json(target_json), "identity": "t"})
    manifest = {"format": format_tag(HIDDEN_STATES), "aux_layer_ids": [1]}
    write_json(tmp_path / "manifest.json", manifest)
    write_json(tmp_path / "metrics.json", {"format": format_tag(TRAIN_METRICS), "epochs": []})
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    write_json(drafter / "config.json", {})
    (drafter / "model.safetensors").write_bytes(b"w")
    files = {}
    for name in ("one", "two", "three"):
        files[name] = tmp_path / f"bench_{name}.jsonl"
        files[name].write_text(json.dumps({"id": name, "messages": [user(name)]}) + "\n")

    def run(names, **bench_overrides):
        """The jobs as the workflow runs them: with bench.pairing: separate the baseline's,
        then the drafter's; with alternate the drafter's alone (the baseline beside it)."""
        cfg = default_config(bench=bench_overrides)
        sets = {n: str(files[n]) for n in names}
        baseline, b = None, None
        if cfg["bench"]["pairing"] == "separate":
            baseline = tmp_path / "baseline.json"
            b = bench.run_baseline(
                tmp_path / "target.json", sets, baseline, cfg["bench"], cfg["vllm"], tmp_path / "c"
            )
        metrics = bench.run(
            tmp_path / "target.json",
            drafter,
            tmp_path / "manifest.json",
            tmp_path / "metrics.json",
            sets,
            tmp_path / "bench.json",
            cfg["bench"],
            cfg["vllm"],
            tmp_path / "c",
            baseline_json=baseline,
        )
        return b, metrics

    return run, asked, files


def test_bench_measures_only_sets_it_has_no_result_for(bench_inputs):
    run, asked, files = bench_inputs
    sep = {"pairing": "separate"}
    base, first = run(["one", "two"], **sep)
    assert asked == [("baseline", ["one", "two"]), ("drafter", ["one", "two"])]
    assert base["this_run"]["servers_started"] == first["this_run"]["servers_started"] == 1
    assert [r["speedup"] for r in first["runs"]] == [1.2, 1.2]  # against the shared baseline
    base, again = run(["one", "two"], **sep)  # nothing new: no server
    assert len(asked) == 2 and again["this_run"]["servers_started"] == 0
    assert base["this_run"]["servers_started"] == 0 and again["runs"] == first["runs"]
    _, added = run(["one", "two", "three"], **sep)  # a new set: only it is measured
    assert asked[-2:] == [("baseline", ["three"]), ("drafter", ["three"])]
    assert [r["prompt_set"] for r in added["runs"]] == ["one", "two", "three"]
    assert added["this_run"]["cached_sets"] == ["one", "two"]
    _, removed = run(["two"], **sep)
    assert len(asked) == 4 and [r["prompt_set"] for r in removed["runs"]] == ["two"]
    files["one"].write_text(json.dumps({"id": "one-edited", "messages": [user("one")]}) + "\n")
    run(["one", "two"], **sep)  # an edited set is measured again, alone
    assert asked[-2:] == [("baseline", ["one"]), ("drafter", ["one"])]
    floor = {"prompt_set": "one", "acceptance_length": 1.0}
    _, judged = run(["one", "two"], gate={"floors": [floor]}, **sep)  # a floor re-judges
    assert len(asked) == 6 and judged["gate"]["passed"]
    run(["one", "two"], num_speculative_tokens=[2, 3], **sep)  # another k: only it, baseline stays
    assert asked[6:] == [("drafter", ["one", "two"])]  # one server, for k = 2 (3 is cached)
    run(["one", "two"], max_tokens=7, **sep)  # a measurement setting: everything again
    assert asked[-2:] == [("baseline", ["one", "two"]), ("drafter", ["one", "two"])]
    assert read_json(files["two"].parent / "bench.json")["this_run"]["measured_sets"] == [
        "one",
        "two",
    ]


def test_alternating_bench_measures_the_baseline_beside_each_drafter(bench_inputs):
    run, asked, _ = bench_inputs
    _, first = run(["one", "two"], rounds=2)
    assert asked == [("pair", ["one", "two"])]
    assert first["this_run"]["servers_started"] == 2  # the baseline and the drafter
    row = first["runs"][0]
    assert row["pairing"] == "alternate" and row["rounds"] == 2
    assert row["speedup_rounds"] == [1.2, 1.2] and row["significance"] == "faster"
    assert row["acceptance_length"] == pytest.approx(1.5)  # 10 of 20 drafts accepted
    _, again = run(["one", "two"], rounds=2)  # cached, baseline included: no server
    assert len(asked) == 1 and again["this_run"]["servers_started"] == 0
    _, two_ks = run(["one", "two"], rounds=2, num_speculative_tokens=[2, 3, 4])
    assert asked[1:] == [("pair", ["one", "two"])] * 2  # k = 2 and 4, beside one baseline
    assert two_ks["this_run"]["servers_started"] == 3
    run(["one", "two"], rounds=3)  # more rounds: measured again
    assert asked[-1] == ("pair", ["one", "two"])


def test_a_failed_set_costs_only_itself(bench_inputs, monkeypatch):
    """A request of set 'two' fails at k = 3 (a prompt too long for the context, a server that
    died): every set measured before it is kept, at k = 2 and at k = 3, and the re-run
    measures only what failed and what had not been measured, with one server per k left."""
    run, asked, _ = bench_inputs
    passes = measure.one_pass

    def failing(server, prompts, *args, **kwargs):
        if server.k == 3 and prompts[0]["id"] == "two":
            raise bench.BenchError("request 0 (prompt 'two') failed: BadRequestError")
        return passes(server, prompts, *args, **kwargs)

    monkeypatch.setattr(measure, "one_pass", failing)
    ks = {"rounds": 2, "num_speculative_tokens": [2, 3]}
    with pytest.raises(bench.BenchError, match="prompt 'two'"):
        run(["one", "two", "three"], **ks)
    assert asked == [("pair", ["one", "three", "two"])] * 2  # k = 2 whole, k = 3 up to 'two'
    monkeypatch.setattr(measure, "one_pass", passes)
    _, again = run(["one", "two", "three"], **ks)
    assert asked[2:] == [("pair", ["three", "two"])]  # at k = 3 only: 'one' was kept
    assert again["this_run"]["servers_started"] == 2  # the baseline and the k = 3 drafter
    assert again["this_run"]["measured_sets"] == ["two", "three"]
    assert again["this_run"]["cached_sets"] == ["one"]
    assert [(r["prompt_set"], r["k"]) for r in again["runs"]] == [
        (name, k) for k in (2, 3) for name in ("one", "two", "three")
    ]


def test_a_prompt_too_long_for_the_context_fails_before_any_server(bench_inputs):
    """The held-out set is checked against synth's answers when it is written; where
    bench.max_tokens leaves less room, its prompt would fail the job at its request: the job
    stops before starting a server, naming the prompt, its tokens and the limit."""
    run, asked, files = bench_inputs
    files["two"].write_text(json.dumps({"id": "two", "messages": [user("word " * 600)]}) + "\n")
    with pytest.raises(bench.BenchError) as err:
        run(["one", "two"], max_tokens=1500)  # of vllm.max_model_len 2048
    assert asked == []
    assert str(err.value).startswith(
        "1 prompt(s) are longer than the context leaves for the answer, 548 tokens "
        "(vllm.max_model_len 2048 - bench.max_tokens 1500): two/two ("
    )
    assert "raise vllm.max_model_len or lower bench.max_tokens" in str(err.value)

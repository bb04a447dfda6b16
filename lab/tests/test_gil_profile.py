"""lab/gil_profile.py sorts py-spy's lock samples by what held the lock, per request."""

from __future__ import annotations

import importlib.util
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
    f"{ROOT};{ONE};_post_json (eagle3_pipeline/client.py:80) 40",
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

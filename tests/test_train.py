"""Train stage: config mapping, checkpoint hygiene, CPU training with speculators' trainer,
kill-and-resume, export and reload.

The slow part is one CPU training on real SmolLM2 hidden states (tests/hidden_states_fixture):
it is killed with SIGKILL right after its first mid-epoch checkpoint and re-run, and the
end-to-end, export and reload tests all read the outputs of that resumed run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_pipeline import train
from eagle3_pipeline.methods import consistency
from eagle3_pipeline.train import checkpoints, launcher, metrics, stage, trainer_config
from eagle3_pipeline.train.fingerprint import fingerprint, prepare_work_dir

REPO = Path(__file__).resolve().parents[1]

from train_fixtures import EPOCHS, _records, trainer_args_of


def schema_train_defaults() -> dict:
    """The default EAGLE-3 train job's config (config.train_job_section)."""
    from eagle3_pipeline import config

    return config.drafter_train_config(config.validate({}), "eagle3")


# ---- pure mapping --------------------------------------------------------------------------


def test_trainer_args_cpu_defaults():
    cfg = schema_train_defaults()
    args, backend = trainer_args_of(cfg)
    assert backend == {"hidden_states_path": "/r/hidden_states"}
    assert args["speculator_type"] == "eagle3"
    assert args["verifier_name_or_path"] == "/m/target"
    assert args["hidden_states_backend"] == "eagle3-pipeline-shards"
    assert args["on_missing"] == "raise"
    assert args["target_layer_ids"] == [2, 15, 27]  # from the manifest, not the config
    assert args["draft_vocab_size"] == 8192
    assert (args["d2t_path"], args["t2d_path"]) == ("/r/vocab/d2t.npy", "/r/vocab/t2d.npy")
    # CPU resolution of the auto settings
    assert args["draft_attn_impl"] == "sdpa"
    assert args["loss_implementation"] == "eager"
    assert args["hidden_states_dtype"] == "float32"
    assert args["num_workers"] == 0
    assert args["total_seq_len"] == 2048
    # null window = full attention on every draft layer
    assert args["full_attention_indices"] == [0]
    assert "sliding_window" not in args
    assert args["train_data_ratio"] == pytest.approx(0.9)
    assert args["epochs"] == 3 and args["lr"] == 0.0003 and args["optimizer"] == "adamw"
    assert args["scheduler_type"] == "cosine" and args["scheduler_warmup_ratio"] == 0.05
    assert 0 < args["checkpoint_freq"] < 1 and args["save_best"] is False
    assert args["no_resume_from_checkpoint"] is False and args["fsdp_shard"] is False


def test_train_module_imports_light():
    """Planning and the mapping never import torch or speculators."""
    code = (
        "import sys; from eagle3_pipeline.train import trainer_config as t; "
        "t.resolve_auto({'gpus': 0}); "
        "bad = {'torch', 'speculators', 'transformers'} & set(sys.modules); "
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_trainer_args_gpu_and_window():
    cfg = {
        **schema_train_defaults(),
        "gpus": 8,
        "fsdp": True,
        "sliding_window": 2048,
        "num_layers": 2,
    }
    args, _ = trainer_args_of(cfg, cpus=128)
    assert args["draft_attn_impl"] == "simple_flex_attention"
    assert args["loss_implementation"] == "fused"
    assert args["hidden_states_dtype"] == "bfloat16"
    assert args["total_seq_len"] == 8192
    assert args["num_workers"] == 12
    assert args["fsdp_shard"] is True
    assert args["sliding_window"] == 2048 and args["full_attention_indices"] == []
    assert (
        trainer_config.auto_workers(1, cpus=16) == 12
        and trainer_config.auto_workers(4, cpus=16) == 2
    )


def test_trainer_args_rejects_bad_combinations():
    cfg = schema_train_defaults()
    with pytest.raises(train.TrainError, match="extra_args may not set"):
        trainer_args_of({**cfg, "extra_args": {"target_layer_ids": [1, 2, 3]}})
    with pytest.raises(train.TrainError, match="float32 on the CPU"):
        trainer_args_of({**cfg, "hidden_states_dtype": "bfloat16"})
    with pytest.raises(train.TrainError, match="no CPU backward"):
        trainer_args_of({**cfg, "attn_impl": "simple_flex_attention"})
    args, _ = trainer_args_of({**cfg, "extra_args": {"checkpoint_freq": 0.5, "muon_momentum": 0.9}})
    assert args["checkpoint_freq"] == 0.5 and args["muon_momentum"] == 0.9


# ---- fingerprint and checkpoint hygiene ----------------------------------------------------


def _fake_inputs(tmp: Path) -> dict:
    import numpy as np

    (tmp / "ds").mkdir()
    (tmp / "ds" / "state.json").write_text('{"_format_type": "torch"}')
    (tmp / "ds" / "data-00000-of-00001.arrow").write_bytes(b"rows")
    np.save(tmp / "d2t.npy", np.zeros(4, dtype=np.int64))
    np.save(tmp / "t2d.npy", np.zeros(8, dtype=bool))
    manifest = {
        "samples_sha256": "abc",
        "num_samples": 2,
        "layer_ids": [2, 15, 27, 30],
        "storage": "bf16",
        "hidden_size": 576,
        "root": str(tmp / "hs"),
        "provenance": {"created": "2026-01-01T00:00:00+00:00"},
    }
    return dict(
        dataset_dir=tmp / "ds",
        manifest=manifest,
        d2t=tmp / "d2t.npy",
        t2d=tmp / "t2d.npy",
        target={"identity": "t1", "model_path": str(tmp / "target")},
    )


def test_fingerprint_invalidates_stale_checkpoints(tmp_path):
    import numpy as np

    inputs = _fake_inputs(tmp_path)
    params = {"lr": 0.001, "epochs": 2, "num_workers": 0, "log_freq": 1, "data_path": "/a/ds"}
    fp = fingerprint(train_config=params, gpus=0, **inputs)
    assert fp == fingerprint(train_config=params, gpus=0, **inputs)
    # operational knobs, paths, the manifest's provenance and timings and where the target
    # lies do not invalidate; anything that changes the result does
    same = {
        **inputs,
        "manifest": {**inputs["manifest"], "root": "/elsewhere", "provenance": {}},
        "target": {"identity": "t1", "model_path": "/moved"},
    }
    moved = {**params, "num_workers": 4, "log_freq": 10, "data_path": "/b/ds"}
    assert fp["hash"] == fingerprint(train_config=moved, gpus=0, **same)["hash"]
    assert fp["hash"] != fingerprint(train_config={**params, "lr": 0.002}, gpus=0, **inputs)["hash"]
    assert fp["hash"] != fingerprint(train_config=params, gpus=2, **inputs)["hash"]
    for changed in (
        {"manifest": {**inputs["manifest"], "samples_sha256": "abd"}},
        {"manifest": {**inputs["manifest"], "layer_ids": [1, 15, 27, 30]}},
        {"target": {"identity": "t2", "model_path": str(tmp_path / "target")}},
    ):
        assert (
            fp["hash"] != fingerprint(train_config=params, gpus=0, **{**inputs, **changed})["hash"]
        )

    work = tmp_path / "work"
    assert prepare_work_dir(work, fp) is False  # fresh
    (work / "checkpoints" / "0").mkdir(parents=True)
    (work / "logs").mkdir()
    (work / "logs" / "metrics.jsonl").write_text("{}\n")
    assert prepare_work_dir(work, fp) is True  # same inputs: kept for resume
    assert (work / "checkpoints" / "0").is_dir()

    np.save(inputs["d2t"], np.ones(4, dtype=np.int64))  # the vocab stage changed
    fp2 = fingerprint(train_config=params, gpus=0, **inputs)
    assert fp2["hash"] != fp["hash"]
    assert prepare_work_dir(work, fp2) is False
    assert not (work / "checkpoints").exists() and not (work / "logs").exists()
    assert json.loads((work / "fingerprint.json").read_text())["hash"] == fp2["hash"]


def test_training_code_is_part_of_the_fingerprint():
    from eagle3_pipeline.staleness.code import LOGIC, module_file, role
    from eagle3_pipeline.train.fingerprint import TRAINING_CODE

    for name in TRAINING_CODE:
        assert module_file(name) is not None and role(name) == LOGIC, name


def _write_checkpoint(d: Path, epoch: int, local_step: int, global_step: int) -> None:
    import zipfile

    import numpy as np
    from safetensors.numpy import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(d / "model.safetensors"))
    for name in ("optimizer_state_dict.pt", "scheduler_state_dict.pt"):
        with zipfile.ZipFile(d / name, "w") as zf:
            zf.writestr("archive/data.pkl", b"x")
    time.sleep(0.01)
    (d / "training_state.json").write_text(
        json.dumps({"epoch": epoch, "local_step": local_step, "global_step": global_step})
    )


def test_torn_checkpoints_are_removed(tmp_path):
    save = tmp_path / "checkpoints"
    _write_checkpoint(save / "0", 0, 0, 10)
    _write_checkpoint(save / "1", 1, 4, 14)
    (save / "checkpoint_best").symlink_to("0")
    assert checkpoints.checkpoint_problem(save / "1", scheduler=True) is None
    # a kill while saving: the weights of epoch 2 are torn
    _write_checkpoint(save / "2", 2, 3, 23)
    weights = save / "2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])
    (save / "epoch2_step3").symlink_to("2")
    (save / "interrupted").mkdir()
    # a kill during an end-of-epoch save over a mid-epoch one: state older than weights
    os.utime(save / "1" / "training_state.json", (1, 1))
    resume = checkpoints.clean_checkpoints(save, scheduler=True, val_epochs={0})
    assert resume == {"epoch": 0, "local_step": 0, "global_step": 10, "removed": ["2", "1"]}
    assert [d.name for d in checkpoints.epoch_dirs(save)] == ["0"]
    assert not (save / "epoch2_step3").is_symlink() and not (save / "interrupted").exists()
    assert (save / "checkpoint_best").resolve() == (save / "0").resolve()
    # an end-of-epoch checkpoint whose validation never ran is redone
    assert checkpoints.clean_checkpoints(save, scheduler=True, val_epochs=set()) is None


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_sharded_backend_reads_shards(tmp_path, storage):
    import argparse

    import torch
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8
    from safetensors.torch import save_file

    from eagle3_pipeline.hidden_states import dataset as hs_backend
    from eagle3_pipeline.hidden_states import shards

    root = tmp_path / "hidden_states"
    ref = {}
    for i in range(5):
        h = torch.randn(7, 4, 16)
        t = {"token_ids": torch.arange(7) + i}
        if storage == "fp8":
            q, sc = quantize_tensor_to_fp8(h)
            t.update(hidden_states=q, hidden_states_scales=sc)
        else:
            t["hidden_states"] = h.bfloat16()
        path = shards.sample_path(root, i, 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(t, str(path))
        ref[i] = h
    (root / "manifest.json").write_text(
        json.dumps(
            {
                "format": shards.MANIFEST_FORMAT,
                "root": str(root),
                "num_samples": 5,
                "samples_per_shard": 2,
                "layer_ids": [1, 2, 3, 4],
                "aux_layer_ids": [1, 2, 3],
                "final_layer_id": 4,
                "hidden_size": 16,
                "storage": storage,
            }
        )
    )
    from hs_connectors import HiddenStatesBackend

    backend = HiddenStatesBackend.registry[hs_backend.BACKEND_NAME]
    transfer = backend.from_train_args(
        argparse.Namespace(hidden_states_path=str(root), hidden_states_dtype="float32"), ""
    )
    import pickle

    transfer = pickle.loads(pickle.dumps(transfer))  # what spawned DataLoader workers get
    for i in (0, 3, 4):
        got = transfer.get_cached(i)
        assert set(got) == {"hidden_states", "token_ids"}
        assert torch.equal(got["token_ids"], torch.arange(7) + i)
        tol = 0.07 if storage == "fp8" else 0.01
        rel = (got["hidden_states"].float() - ref[i]).abs().max() / ref[i].abs().max()
        assert rel < tol
    assert transfer.get_cached(5) is None
    with pytest.raises(RuntimeError, match="only reads extracted"):
        transfer.get_generated({})
    # a method training on some of the extracted layers gets only those and the final one
    args = argparse.Namespace(
        hidden_states_path=str(root), hidden_states_dtype="float32", target_layer_ids=[2, 3]
    )
    subset = pickle.loads(pickle.dumps(backend.from_train_args(args, "")))
    assert transfer.columns is None and subset.columns == [1, 2, 3]
    got = subset.get_cached(3)["hidden_states"].float()
    assert got.shape == (7, 3, 16) and got.is_contiguous()
    assert torch.equal(got, transfer.get_cached(3)["hidden_states"].float()[:, [1, 2, 3]])


def test_training_refuses_a_dataset_not_in_torch_format(tmp_path):
    from datasets import Dataset

    ds = Dataset.from_dict(
        {"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1, 1]], "seq_len": [3], "sample_id": ["a"]}
    )
    ds.save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(train.TrainError, match="not a dataset saved in torch format"):
        stage.require_torch_format(tmp_path / "plain")
    ds.set_format(type="torch")
    ds.save_to_disk(str(tmp_path / "torch"))
    stage.require_torch_format(tmp_path / "torch")  # as prepare writes it


def test_sliding_window_as_vllm_serves_it():
    full = {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2, "sliding_window": 2048}
    mixed = {**full, "layer_types": ["sliding_attention", "full_attention"]}
    assert (
        consistency.trained_windows(full) == consistency.served_windows(full, None) == [None, None]
    )
    assert (
        consistency.trained_windows(mixed)
        == consistency.served_windows(mixed, None)
        == [2048, None]
    )
    # a target with a model-wide window (no layer_types, e.g. Mistral-7B-v0.1): vLLM applies it
    # to draft layers that have none, so full-attention training would not be served as trained
    assert (
        consistency.served_windows(full, 4096) == [4096, 4096] != consistency.trained_windows(full)
    )


def test_summarize_counts_resumed_steps_once():
    def rec(kind, attempt, **kw):
        return {"kind": kind, "attempt": attempt, "t": kw.pop("t", 0.0), **kw}

    def step(attempt, g, epoch, loss):
        return rec(
            "train",
            attempt,
            global_step=g,
            epoch=epoch,
            train={"loss": loss, "loss_0": loss, "full_acc_0": 0.5, "cond_acc_0": 0.5},
            profile={"step_ms": 100.0, "tokens_per_s": 1000.0, "fetch_ms": 1.0},
        )

    records = [
        rec("start", 1),
        step(1, 0, 0, 9.0),
        step(1, 1, 0, 8.0),
        step(1, 2, 0, 99.0),
        rec("start", 2),
        step(2, 2, 0, 7.0),
        step(2, 3, 1, 6.0),
        rec(
            "val",
            2,
            epoch=0,
            val={
                "loss_epoch": 6.5,
                "loss_0_epoch": 6.5,
                "full_acc_0_epoch": 0.4,
                "cond_acc_0_epoch": 0.4,
            },
        ),
        rec(
            "val",
            2,
            epoch=1,
            val={
                "loss_epoch": 5.5,
                "loss_0_epoch": 5.5,
                "full_acc_0_epoch": 0.6,
                "cond_acc_0_epoch": 0.6,
            },
        ),
        rec("end", 2),
    ]
    s = metrics.summarize(records, "eagle3", 1)
    e0, e1 = s["epochs"]
    assert e0["train"]["loss"] == pytest.approx(8.0)  # (9 + 8 + 7) / 3: step 2 from attempt 2
    assert e1["train"]["loss"] == pytest.approx(6.0)
    assert e0["val"]["full_acc"] == [0.4] and e1["val"]["loss"] == 5.5
    assert e0["tokens_per_s"] == pytest.approx(1000.0)
    assert [a["first_global_step"] for a in s["attempts"]] == [0, 2]
    assert [a["clean_exit"] for a in s["attempts"]] == [False, True]


def test_summarize_counts_the_tokens_of_every_rank():
    """speculators profiles rank 0's batch only; with N ranks the run processes N batches per
    step, so the stage's tokens/s is N times the profile's (per attempt: a resume may run on
    another number of GPUs)."""

    def step(attempt, g):
        return {
            "kind": "train",
            "attempt": attempt,
            "t": 0.0,
            "global_step": g,
            "epoch": 0,
            "train": {"loss": 1.0},
            "profile": {"step_ms": 100.0, "tokens_per_s": 1000.0},
        }

    one_rank = [{"kind": "start", "attempt": 1, "t": 0.0, "world_size": 1}, step(1, 0)]
    two_ranks = [{"kind": "start", "attempt": 1, "t": 0.0, "world_size": 2}, step(1, 0)]
    assert metrics.summarize(one_rank, "eagle3", 1)["throughput"]["tokens_per_s"] == pytest.approx(
        1000.0
    )
    s = metrics.summarize(two_ranks, "eagle3", 1)
    assert s["throughput"]["tokens_per_s"] == pytest.approx(2000.0)
    assert s["epochs"][0]["tokens_per_s"] == pytest.approx(2000.0)
    # attempt 1 on one rank (1000 tok/s), attempt 2 resumed on two (2000 tok/s), equal time
    mixed = [*one_rank, {"kind": "start", "attempt": 2, "t": 0.0, "world_size": 2}, step(2, 1)]
    assert metrics.summarize(mixed, "eagle3", 1)["throughput"]["tokens_per_s"] == pytest.approx(
        1500.0
    )


def test_training_process_dies_with_a_killed_job(tmp_path):
    """A job killed with SIGKILL (Slurm timeout, OOM killer) cannot stop its trainer itself; the
    guard must, or a re-run would train a second time into the same directory. The exit status
    of a trainer that ends on its own passes through."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    assert launcher.launch([sys.executable, "-c", "import sys; sys.exit(3)"], env, None) == 3
    pidfile = tmp_path / "trainer.pid"
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from eagle3_pipeline.train import launcher; "
                "launcher.launch([sys.executable, '-c', 'import os, time; "
                f'open("{pidfile}", "w").write(str(os.getpid())); time.sleep(300)\'], '
                "dict(__import__('os').environ), None)"
            ),
        ],
        env=env,
    )
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    trainer = int(pidfile.read_text())
    job.kill()
    job.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{trainer}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.2)
    else:
        os.kill(trainer, signal.SIGKILL)
        pytest.fail("the trainer outlived its killed job")


# ---- CPU training: kill mid-epoch, resume, export ------------------------------------------


def test_resume_after_kill(resumed_run):
    work = Path(resumed_run["kwargs"]["work_dir"])
    records = _records(work)
    starts = [r for r in records if r["kind"] == "start"]
    assert [s["attempt"] for s in starts] == [1, 2]
    resume = starts[1]["resume_from"]
    # resumed from a mid-epoch checkpoint at or after the one seen before the kill
    assert (
        resume is not None
        and resume["global_step"] >= resumed_run["killed_state"]["global_step"] > 0
    )
    second = [r for r in records if r["kind"] == "train" and r["attempt"] == 2]
    assert min(r["global_step"] for r in second) == resume["global_step"]  # not from scratch
    log_text = Path(resumed_run["kwargs"]["log_path"]).read_text()
    if resume["local_step"] > 0:
        assert (
            f"Resuming mid-epoch from epoch={resume['epoch']} "
            f"local_step={resume['local_step']} global_step={resume['global_step']}" in log_text
        )
    else:
        assert f"Resuming training on epoch {resume['epoch'] + 1}" in log_text
    # final metrics are consistent: every step trained exactly once across attempts
    steps = sorted({r["global_step"] for r in records if r["kind"] == "train"})
    assert steps == list(range(len(steps)))
    per_epoch = {
        e: sorted({r["global_step"] for r in records if r["kind"] == "train" and r["epoch"] == e})
        for e in range(EPOCHS)
    }
    assert len(per_epoch[0]) == len(per_epoch[1]) > 0
    m = resumed_run["metrics"]
    assert [a["attempt"] for a in m["attempts"]] == [1, 2]
    assert m["attempts"][1]["first_global_step"] == resume["global_step"]
    assert [e["epoch"] for e in m["epochs"]] == list(range(EPOCHS))
    assert all("val" in e for e in m["epochs"])


def test_cpu_training_end_to_end(resumed_run):
    root = resumed_run["root"]
    m = json.loads((root / "drafter" / "metrics.json").read_text())
    assert m["format"] == metrics.METRICS_FORMAT
    assert m["attempts"][0]["bridges"] == [
        "local_rank->cpu",
        "accelerator.synchronize->noop",
        "DataLoader.pin_memory->False",
        "checkpointer.device->cpu",
        "load_processor->tokenizer_if_no_processor",
    ]
    first, last = m["epochs"][0], m["epochs"][-1]
    for e in m["epochs"]:
        for split in ("train", "val"):
            assert len(e[split]["full_acc"]) == 3 and len(e[split]["cond_acc"]) == 3
            assert all(0 <= a <= 1 for a in e[split]["full_acc"])
        assert e["tokens_per_s"] > 0
    assert last["val"]["loss"] < first["val"]["loss"]  # it learns
    assert last["train"]["loss"] < first["train"]["loss"]
    assert m["best_epoch"] in range(EPOCHS) and m["best_val_loss"] is not None
    t = m["throughput"]
    assert t["tokens_per_s"] > 0 and t["loader_wait_fraction"] is not None
    c = m["consistency"]
    assert c["ok"], c["checks"]
    assert c["drafter"]["aux_layer_ids"] == [2, 15, 27]
    assert c["drafter"]["trained_window_per_layer"] == c["served"]["window_per_layer"] == [None]
    assert c["drafter"]["verifier_path_exists"] and not c["problems"]
    png = (root / "drafter" / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # a re-run of a finished stage does not train again
    t0 = time.monotonic()
    again = train.run(**resumed_run["kwargs"])
    assert time.monotonic() - t0 < 30
    assert len(again["attempts"]) == 2 and again["best_epoch"] == m["best_epoch"]
    print(
        f"\nCPU training: first run killed after {resumed_run['first_run_s']:.0f} s, "
        f"resumed run {resumed_run['resume_run_s']:.0f} s, {t['tokens_per_s']:.0f} tok/s, "
        f"loader wait {t['loader_wait_fraction']:.1%}"
    )


def test_export_reloads_with_speculators_and_vllm_config(resumed_run, target_dir, fixture_data):
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    drafter = resumed_run["root"] / "drafter"
    raw = json.loads((drafter / "config.json").read_text())
    # the fields vLLM reads (vllm/transformers_utils/configs/speculators/{base,algos}.py)
    assert raw["speculators_model_type"] == "eagle3"
    assert raw["architectures"] == ["Eagle3DraftModel"]
    assert raw["draft_vocab_size"] == 1024
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert raw["norm_before_fc"] is True and raw["norm_output"] is True
    tl = raw["transformer_layer_config"]
    assert tl["model_type"] == "llama" and tl["hidden_size"] == 576
    assert tl["vocab_size"] == 49152 and tl["layer_types"] == ["full_attention"]
    verifier = raw["speculators_config"]["verifier"]["name_or_path"]
    assert Path(verifier).is_absolute() and Path(verifier) == Path(target_dir).resolve()
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3

    weights = load_file(str(drafter / "model.safetensors"))
    assert np.array_equal(weights["d2t"].numpy(), np.load(fixture_data["d2t"]))
    assert np.array_equal(weights["t2d"].numpy(), np.load(fixture_data["t2d"]))

    # speculators reads it back (from_pretrained fails on CPU: build from the config, load)
    config = Eagle3SpeculatorConfig.from_pretrained(str(drafter))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(weights["t2d"], weights["d2t"])
    model.load_verifier_weights()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected
    assert set(missing) <= {"verifier_lm_head.weight", "verifier_norm.weight"}
    assert torch.equal(model.fc.weight.to(torch.bfloat16), weights["fc.weight"])
    # and predicts a held-out sample about as well as validation said
    from safetensors.torch import load_file as load_hs

    manifest = json.loads(Path(fixture_data["manifest"]).read_text())
    last = manifest["num_samples"] - 1
    hs = load_hs(
        str(Path(manifest["root"]) / "shards" / f"shard_{last // 8:05d}" / f"hs_{last}.safetensors")
    )
    h = hs["hidden_states"].float()
    ids = hs["token_ids"]
    with torch.no_grad():
        _, loss, metrics = model.float()(
            hidden_states=h[:-1, :-1].flatten(1)[None],
            input_ids=ids[1:][None],
            document_ids=torch.zeros(1, len(ids) - 1, dtype=torch.long),
            verifier_last_hidden_states=h[1:, -1][None],
            ttt_steps=3,
            loss_config=resolve_loss_config("kl_div", "eager"),
        )
    assert torch.isfinite(loss)
    assert metrics["full_acc_0_sum"] / metrics["full_acc_0_total"] > 0.05

    # vLLM's own parser of speculators checkpoints turns it into an Eagle3 Llama drafter
    from vllm.transformers_utils.configs.speculators import base

    vcfg = base.SpeculatorsConfig.extract_transformers_pre_trained_config(
        json.loads((drafter / "config.json").read_text())
    )
    assert vcfg["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert vcfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert vcfg["draft_vocab_size"] == 1024 and vcfg["layer_types"] == ["full_attention"]
    spec = base.SpeculatorsConfig.extract_vllm_speculative_config(raw)
    assert spec == {"method": "eagle3", "num_speculative_tokens": 3}


def test_cpu_training_threads_sleep_when_idle_unless_told_otherwise(monkeypatch, tmp_path):
    """CPU training's OpenMP threads sleep when idle (PASSIVE), unless the environment names a
    policy; an empty value leaves the library's default. GPU training and CPU servers keep the
    library's default (benchmarks/cpu_openmp_wait.py: sleeping made CPU decoding slower)."""
    from eagle3_pipeline.runtime.threads import cpu_wait_policy
    from eagle3_pipeline.server import vllm_environment

    assert cpu_wait_policy({})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert cpu_wait_policy({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert "OMP_WAIT_POLICY" not in cpu_wait_policy({"OMP_WAIT_POLICY": " "})
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert launcher.child_env(0)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in launcher.child_env(1)
    assert "OMP_WAIT_POLICY" not in vllm_environment("cpu", 1, tmp_path)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert launcher.child_env(0)["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    assert "OMP_WAIT_POLICY" not in launcher.child_env(0)

"""Session fixtures for training: real SmolLM2 hidden states, one CPU training run that is
killed with SIGKILL right after its first mid-epoch checkpoint and resumed (EAGLE-3), and one
tiny DFlash training. Shared by the train, bench, methods and replay tests (imported in
conftest.py), so each training happens once per session."""

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
from eagle3_pipeline.train import checkpoints, metrics, trainer_config

import hidden_states_fixture

REPO = Path(__file__).resolve().parents[1]

EPOCHS = 2
TRAIN_CFG = {
    "gpus": 0,
    "fsdp": False,
    "epochs": EPOCHS,
    "lr": 0.001,
    "optimizer": "adamw",
    "scheduler": "cosine",
    "warmup_ratio": 0.05,
    "ttt_steps": 3,
    "num_layers": 1,
    "total_seq_len": 128,
    "attn_impl": "auto",
    "sliding_window": None,
    "norm_before_fc": True,
    "norm_output": True,
    "val_fraction": 0.125,
    "hidden_states_dtype": "auto",
    "loss_implementation": "auto",
    "num_workers": "auto",
    "seed": 0,
    "log_freq": 1,
    "extra_args": {},
}


@pytest.fixture(scope="session")
def fixture_data(tmp_path_factory, target_dir, tokenizer):
    rows, masks = hidden_states_fixture.chat_rows(tokenizer, 32)
    out = tmp_path_factory.mktemp("train_inputs")
    paths = hidden_states_fixture.build(
        target_dir, out, rows, masks, samples_per_shard=8, draft_vocab_size=1024
    )
    return paths


def run_kwargs(root: Path, target_json: Path, data: dict) -> dict:
    return dict(
        target_json=str(target_json),
        dataset_dir=str(data["dataset"]),
        manifest_path=str(data["manifest"]),
        d2t=str(data["d2t"]),
        t2d=str(data["t2d"]),
        drafter_dir=str(root / "drafter"),
        metrics_out=str(root / "drafter/metrics.json"),
        plot_out=str(root / "drafter/loss.png"),
        cfg=dict(TRAIN_CFG),
        work_dir=str(root / "train_work"),
        log_path=str(root / "train.log"),
    )


def _records(work: Path) -> list[dict]:
    return metrics.read_records(work / metrics.RECORDS)


@pytest.fixture(scope="session")
def resumed_run(tmp_path_factory, target_json, fixture_data):
    """Start training, SIGKILL the training process right after its first mid-epoch checkpoint,
    then run the stage again to completion."""
    root = tmp_path_factory.mktemp("train_run")
    kwargs = run_kwargs(root, target_json, fixture_data)
    work = Path(kwargs["work_dir"])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    code = (
        "import json, sys, logging; logging.basicConfig(level=logging.INFO); "
        "from eagle3_pipeline import train; train.run(**json.loads(sys.argv[1]))"
    )
    t0 = time.monotonic()
    outer_log = open(root / "outer.log", "wb")  # noqa: SIM115
    outer = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(kwargs)],
        env=env,
        stdout=outer_log,
        stderr=subprocess.STDOUT,
    )
    killed_state = None
    try:
        while time.monotonic() - t0 < 300 and outer.poll() is None:
            for d in checkpoints.epoch_dirs(work / checkpoints.CHECKPOINTS):
                try:
                    state = json.loads((d / "training_state.json").read_text())
                except (OSError, ValueError):
                    continue
                if state["local_step"] > 0:
                    killed_state = state
                    break
            if killed_state:
                break
            time.sleep(0.05)
        assert killed_state, "no mid-epoch checkpoint appeared (or the run ended first)"
        starts = [r for r in _records(work) if r["kind"] == "start"]
        os.kill(starts[-1]["pid"], signal.SIGKILL)  # the training process itself
        killed_at = time.monotonic() - t0
        assert outer.wait(timeout=60) != 0  # the stage failed with the kill
    finally:
        if outer.poll() is None:
            outer.kill()
        outer_log.close()
    records_before = _records(work)
    t1 = time.monotonic()
    train_metrics = train.run(**kwargs)
    return {
        "root": root,
        "kwargs": kwargs,
        "metrics": train_metrics,
        "killed_state": killed_state,
        "records_before": records_before,
        "first_run_s": killed_at,
        "resume_run_s": time.monotonic() - t1,
    }


# A tiny DFlash shape: 2 layers, block 4 (3 drafted tokens), 32 anchors per batch, on two of the
# three extracted aux layers (so that the hidden-states backend selects columns).
DFLASH_CFG = {
    **TRAIN_CFG,
    "method": "dflash",
    "epochs": 2,
    "total_seq_len": 256,
    "num_layers": 2,
    "block_size": 4,
    "max_anchors": 32,
    "mask_token_id": None,
    "layer_ids": [15, 27],
}


@pytest.fixture(scope="session")
def dflash_run(tmp_path_factory, target_json, fixture_data):
    """A DFlash drafter trained on the CPU at :data:`DFLASH_CFG` (tests/test_methods.py checks
    what it exports, tests/test_replay.py how vLLM serves it)."""
    root = tmp_path_factory.mktemp("dflash")
    # as a job gets it: EAGLE-3's keys are there and unused
    kwargs = {**run_kwargs(root, target_json, fixture_data), "cfg": dict(DFLASH_CFG)}
    return {"root": root, "metrics": train.run(**kwargs), "kwargs": kwargs}


def trainer_args_of(cfg: dict, **kw) -> tuple[dict, dict]:
    """speculators' fields and backend args of a train config, at fixed example paths."""
    base = dict(
        verifier_path="/m/target",
        dataset_dir="/r/prepare/dataset",
        hidden_states_root="/r/hidden_states",
        aux_layer_ids=[2, 15, 27],
        d2t_path="/r/vocab/d2t.npy",
        t2d_path="/r/vocab/t2d.npy",
        draft_vocab_size=8192,
        save_path="/w/checkpoints",
        log_dir="/w/logs",
        cpus=16,
    )
    base.update(kw)
    return trainer_config.trainer_args(cfg, **base)

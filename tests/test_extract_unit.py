"""Extract-stage logic without a server: verification, shard bookkeeping, disk budget, gather."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from eagle3_pipeline import extract
from eagle3_pipeline.hidden_states import checks as verify
from eagle3_pipeline.hidden_states import shards
from eagle3_pipeline.hidden_states.disk import sample_bytes
from eagle3_pipeline.runtime import disk
from eagle3_pipeline.runtime.files import write_json
from eagle3_pipeline.runtime.results import EXTRACT_PART, format_tag


@pytest.fixture(scope="module")
def greedy_row(target_dir, tokenizer):
    """A prompt and the target's own greedy answer, with real hidden states as vLLM captures
    them (aux layers 2, 15, 27 and the final layer 30 before the norm)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}],
        add_generation_prompt=True,
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    ids = out[0].tolist()
    mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
    layers = [2, 15, 27, 30]
    hidden = torch.stack(verify.reference_hidden_states(model, ids, layers), dim=1)
    return {"ids": ids, "mask": mask, "hidden": hidden, "layers": layers, "model": model}


@pytest.fixture(scope="module")
def probe(target_json, target_dir):
    from eagle3_pipeline.target.stage import load_info

    return verify.NextTokenProbe(target_dir, load_info(target_json)["architecture"])


def test_probe_agrees_with_greedy_answers(greedy_row, probe):
    hits, checked = probe.agreement(
        greedy_row["hidden"][:, -1], greedy_row["ids"], greedy_row["mask"], 256
    )
    assert checked == 24 and hits == checked


@pytest.mark.parametrize("positions", [16, 256])  # the default, and every position
@pytest.mark.parametrize("corruption", ["shift", "zero", "wrong_layer"])
def test_probe_catches_corrupted_hidden_states(greedy_row, probe, corruption, positions):
    h = greedy_row["hidden"][:, -1]
    if corruption == "shift":  # off by one position: the failure that silently costs weeks
        h = torch.roll(h, shifts=1, dims=0)
    elif corruption == "zero":
        h = torch.zeros_like(h)
    else:  # an aux layer stored where the final layer belongs
        h = greedy_row["hidden"][:, 0]
    hits, checked = probe.agreement(h, greedy_row["ids"], greedy_row["mask"], positions)
    assert checked == min(positions, 24) and hits / checked < 0.5


def test_check_sample_rejects_bad_samples(greedy_row):
    h, ids = greedy_row["hidden"], greedy_row["ids"]
    tok = torch.tensor(ids)
    assert verify.check_sample(h, tok, ids, 4, 576) == {"tokens": len(ids)}
    with pytest.raises(verify.VerificationError, match="shape"):
        verify.check_sample(h[:, :3], tok, ids, 4, 576)
    with pytest.raises(verify.VerificationError, match="token_ids"):
        verify.check_sample(h, torch.roll(tok, 1), ids, 4, 576)
    bad = h.clone()
    bad[3, 1, 7] = float("nan")
    with pytest.raises(verify.VerificationError, match="NaN"):
        verify.check_sample(bad, tok, ids, 4, 576)
    bad = h.clone()
    bad[5, 2] = 0
    with pytest.raises(verify.VerificationError, match="all-zero"):
        verify.check_sample(bad, tok, ids, 4, 576)


@pytest.mark.slow  # more than the quick tier has room for
def test_reference_errors_flag_wrong_layers(greedy_row, target_dir):
    ids, h = greedy_row["ids"], greedy_row["hidden"]
    good = verify.reference_errors(target_dir, [(ids, h)], greedy_row["layers"])
    assert good["max_rel_error"] < 1e-5
    swapped = h[:, [1, 0, 2, 3]]  # layers 2 and 15 swapped
    bad = verify.reference_errors(target_dir, [(ids, swapped)], greedy_row["layers"])
    assert bad["max_rel_error_per_layer"]["2"] > 0.5
    assert bad["max_rel_error_per_layer"]["30"] < 1e-5


def test_part_ranges_cover_every_sample_once_in_whole_shards():
    for n, s, jobs in [(10, 3, 1), (10, 3, 2), (10, 3, 4), (1000, 128, 3), (5, 8, 3)]:
        ranges = [shards.part_range(n, s, jobs, k) for k in range(jobs)]
        covered = [i for r in ranges for i in r]
        assert covered == list(range(n))
        for r in ranges:
            if len(r):
                assert r.start % s == 0  # parts never share a shard directory


def test_resolve_layers_and_disk_estimate():
    arch = {"num_layers": 30, "default_layer_ids": [2, 15, 27], "hidden_size": 576}
    default = [2, 15, 27]
    assert extract.resolve_layers({"layer_ids": None}, arch) == (default, default, 30)
    assert extract.resolve_layers({"layer_ids": [1, 29]}, arch) == ([1, 29], [1, 29], 30)
    # another method's layers are captured too (one extraction for every method)
    union = extract.resolve_layers({"layer_ids": None, "method_layer_ids": [1, 15, 20]}, arch)
    assert union == (default, [1, 2, 15, 20, 27], 30)
    with pytest.raises(extract.LayerIdError, match="out of range"):
        extract.resolve_layers({"layer_ids": [30]}, arch)
    with pytest.raises(extract.LayerIdError, match="out of range"):
        extract.resolve_layers({"layer_ids": None, "method_layer_ids": [31]}, arch)
    bf16 = sample_bytes(1000, 4, 4096, "bf16")
    fp8 = sample_bytes(1000, 4, 4096, "fp8")
    assert bf16 == 1000 * 4 * 4096 * 2 + 8000 + 512
    assert 0.5 < fp8 / bf16 < 0.51


def test_disk_budget_fails_before_any_work(tmp_path):
    info = disk.check_disk(tmp_path, 1024, 1.2)
    assert info["free_bytes"] > 1024
    with pytest.raises(disk.DiskBudgetError, match="GiB free") as err:
        disk.check_disk(tmp_path, 10**18, 1.2)
    assert "extract.storage: fp8" in str(err.value)


def _fake_sample(root: Path, i: int, s: int, payload: bytes) -> dict:
    p = shards.sample_path(root, i, s)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(payload)
    return {
        "index": i,
        "tokens": 3,
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "agree": [3, 3],
    }


def test_shard_book_seals_resumes_and_redoes_corrupt_files(tmp_path):
    rows = range(0, 7)
    book = extract.ShardBook(tmp_path, 3, rows)
    for i in range(5):
        book.record(_fake_sample(tmp_path, i, 3, f"sample-{i}".encode()))
    book.close()
    assert (shards.shard_dir(tmp_path, 0) / "shard.json").exists()  # 0..2 complete
    assert not (shards.shard_dir(tmp_path, 1) / "shard.json").exists()  # 3..5 open
    # A file written right before a kill but never journaled is not trusted.
    shards.sample_path(tmp_path, 5, 3).write_bytes(b"torn")
    # Bit rot inside a sealed shard: same size, different content.
    shards.sample_path(tmp_path, 1, 3).write_bytes(b"sample-X")

    again = extract.ShardBook(tmp_path, 3, rows)
    again.scan()
    assert sorted(again.done) == [0, 2, 3, 4]
    assert again.corrupt == [1]
    assert not shards.sample_path(tmp_path, 5, 3).exists()
    assert not (shards.shard_dir(tmp_path, 0) / "shard.json").exists()  # reopened
    again.record(_fake_sample(tmp_path, 1, 3, b"sample-1"))
    assert (shards.shard_dir(tmp_path, 0) / "shard.json").exists()
    again.close()


def test_gather_checks_parts_agree_and_cover_all(tmp_path):
    def part(k, lo, hi, **kw):
        m = {
            "part": k,
            "samples": [lo, hi],
            "tokens": 10,
            "bytes": 100,
            "root": "/r",
            "layer_ids": [2, 15, 27, 30],
            "aux_layer_ids": [2, 15, 27],
            "final_layer_id": 30,
            "hidden_size": 576,
            "storage": "bf16",
            "samples_per_shard": 4,
            "shards": [],
            "this_run": {},
            "verification": {
                "samples_checked": hi - lo,
                "next_token_agreement": 1.0,
                "next_token_positions": 5,
                "reference": None,
            },
        }
        m.update(kw)
        write_json(tmp_path / f"part_{k}.json", {"format": format_tag(EXTRACT_PART), **m})
        return tmp_path / f"part_{k}.json"

    cfg = {"storage": "bf16"}
    m = extract.gather([part(0, 0, 4), part(1, 4, 6)], tmp_path / "manifest.json", cfg)
    assert m["num_samples"] == 6 and m["verification"]["next_token_agreement"] == 1.0
    assert json.loads((tmp_path / "manifest.json").read_text())["format"] == shards.MANIFEST_FORMAT
    with pytest.raises(extract.ExtractError, match="starts at sample"):
        extract.gather([part(0, 0, 4), part(1, 5, 6)], tmp_path / "m2.json", cfg)
    with pytest.raises(extract.ExtractError, match="disagree on layer_ids"):
        extract.gather([part(0, 0, 4), part(1, 4, 6, layer_ids=[1, 2])], tmp_path / "m3.json", cfg)

    # 12 parts, listed as Snakemake expands them (0, 1, ..., 11): each part's provenance names
    # its own file, though part_10 and part_11 sort before part_2 as text
    many = [part(k, 4 * k, 4 * k + 4, tokens=k) for k in range(12)]
    m = extract.gather(list(reversed(many)), tmp_path / "m12.json", cfg)
    assert m["num_samples"] == 48 and [p["part"] for p in m["parts"]] == list(range(12))
    inputs = m["provenance"]["inputs"]
    for k in range(12):
        assert inputs[f"part_{k}"]["path"] == str(tmp_path / f"part_{k}.json")
        assert json.loads(Path(inputs[f"part_{k}"]["path"]).read_text())["part"] == k


def test_one_batched_probe_call_gives_each_sample_its_own_agreement(greedy_row, probe):
    """The validator probes many samples in one call: a corrupted sample among good ones
    still scores as it does alone, and the good ones keep full agreement."""
    ids, mask, h = greedy_row["ids"], greedy_row["mask"], greedy_row["hidden"][:, -1]
    positions = verify.probe_positions(ids, mask, 256)
    targets = [ids[p + 1] for p in positions]
    shifted = torch.roll(h, shifts=1, dims=0)
    batch = [(x[positions], targets) for x in (h, shifted, h, torch.zeros_like(h))]
    hits = probe.agreement_batch(batch, rows_per_call=7)  # chunks that split samples
    alone = [probe.agreement(x, ids, mask, 256)[0] for x in (h, shifted, h, torch.zeros_like(h))]
    assert hits == alone
    assert hits[0] == hits[2] == len(positions) and hits[1] < len(positions) / 2


def test_the_client_switches_threads_often_while_it_extracts(tmp_path, monkeypatch):
    """The validator threads would wait up to Python's 5 ms switch interval for the lock at
    every torch op beside a busy request loop: the client shortens it for its run and puts
    Python's back afterwards, also when nothing is left to extract."""
    import asyncio
    import sys

    from eagle3_pipeline import config as cfglib
    from eagle3_pipeline.extract.client import SWITCH_INTERVAL_S
    from eagle3_pipeline.runtime import Progress

    seen = []
    set_interval = sys.setswitchinterval
    monkeypatch.setattr(sys, "setswitchinterval", lambda s: (seen.append(s), set_interval(s)))
    before = sys.getswitchinterval()
    book = extract.ShardBook(tmp_path / "hs", 64, range(0))
    cfg = cfglib.validate({})["extract"]
    ex = extract.Extractor([], book, None, [2, 15, 27, 30], 576, cfg, tmp_path)
    asyncio.run(ex.run("http://127.0.0.1:9", "m", [], Progress(0, "x"), lambda: None))
    assert seen == [SWITCH_INTERVAL_S, before] and sys.getswitchinterval() == before
    assert before > SWITCH_INTERVAL_S


def test_a_staged_path_is_taken_only_from_an_answer_for_the_same_tokens():
    """The client reads the server's completion answer as plain JSON: the staged file's path
    comes back only when the server prefilled exactly the row's tokens; a wrong answer is
    speculators' InvalidResponseError, which its retries never repeat."""
    from speculators.data_generation.vllm_client import InvalidResponseError

    from eagle3_pipeline.extract.client import staged_path

    ids = [1, 2, 3, 4]

    def answer(prompt_ids=ids, params=None):
        params = {"hidden_states_path": "/s/a.safetensors"} if params is None else params
        return {"choices": [{"prompt_token_ids": prompt_ids}], "kv_transfer_params": params}

    assert staged_path(answer(), ids) == "/s/a.safetensors"
    assert staged_path(answer(params={"handle": "/s/b"}), ids) == "/s/b"
    wrong = {
        "missing prompt_token_ids": answer(prompt_ids=None),
        "first difference at 2": answer(prompt_ids=[1, 2, 9, 4]),
        "missing kv_transfer_params": {"choices": [{"prompt_token_ids": ids}]},
        "'hidden_states_path'": answer(params={"other": 1}),
    }
    for message, bad in wrong.items():
        with pytest.raises(InvalidResponseError) as e:
            staged_path(bad, ids)
        assert message in str(e.value), str(e.value)

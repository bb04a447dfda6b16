"""The extraction validator off the request path: bit checks on the stored tensors catch what
the float checks catch, the batched probe gives each sample the hits of its own probe, and
a staged file is checked, hashed and moved into its shard unchanged."""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from eagle3_pipeline.extract import validator
from eagle3_pipeline.hidden_states import checks as verify
from eagle3_pipeline.hidden_states import shards

T, L, H = 12, 4, 64


def sample(storage: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, L, H, generator=g)
    if storage == "fp8":
        q, scale = shards.quantize_fp8(h)
        return {"hidden_states": q, shards.SCALES_KEY: scale, "token_ids": torch.arange(T)}
    return {"hidden_states": h.to(torch.bfloat16), "token_ids": torch.arange(T)}


def float_check(t: dict):
    return verify.check_sample(shards.dequantize(t).float(), t["token_ids"], list(range(T)), L, H)


def stored_check(t: dict):
    return verify.check_stored(t, list(range(T)), L, H, shards.SCALES_KEY)


def corrupt(t: dict, how: str) -> dict:
    t = {k: v.clone() for k, v in t.items()}
    h = t["hidden_states"]
    fp8 = h.dtype == torch.float8_e4m3fn
    if how == "nan":
        h.view(torch.uint8 if fp8 else torch.int16)[3, 1, 7] = 0x7F if fp8 else 0x7FC0
    elif how == "inf":
        if fp8:  # fp8 has no Inf: an infinite scale
            t[shards.SCALES_KEY][2] = float("inf")
        else:
            h[2, 0, 5] = float("-inf")
    elif how == "zero_row":
        h.view(torch.uint8 if fp8 else torch.int16)[5, 2] = 0
    elif how == "negative_zero_row":  # -0.0 everywhere is a zero row too
        h.view(torch.uint8 if fp8 else torch.int16)[5, 2] = 0x80 if fp8 else -0x8000
    elif how == "zero_scale":
        t[shards.SCALES_KEY][4] = 0.0
    elif how == "token_ids":
        t["token_ids"] = torch.roll(t["token_ids"], 1)
    elif how == "shape":
        t["hidden_states"] = h[:, :3]
    return t


CORRUPTIONS = ["nan", "inf", "zero_row", "negative_zero_row", "token_ids", "shape"]


@pytest.mark.parametrize(
    "storage, how",
    # a zero scale only where there are scales: fp8 (bf16 samples have none)
    [("bf16", how) for how in CORRUPTIONS] + [("fp8", how) for how in [*CORRUPTIONS, "zero_scale"]],
)
def test_bit_checks_reject_what_the_float_checks_reject(storage, how):
    good = sample(storage)
    assert stored_check(good) == float_check(good) == {"tokens": T}
    bad = corrupt(good, how)
    with pytest.raises(verify.VerificationError) as float_err:
        float_check(bad)
    with pytest.raises(verify.VerificationError) as bit_err:
        stored_check(bad)
    assert str(bit_err.value) == str(float_err.value)


def test_bit_checks_keep_the_sample_bytes(tmp_path):
    """check_stored reads the tensors without writing to them."""
    t = sample("bf16")
    before = t["hidden_states"].clone()
    stored_check(t)
    assert torch.equal(t["hidden_states"].view(torch.int16), before.view(torch.int16))


def test_the_reused_scratch_buffer_never_mixes_samples():
    """The bit checks write into a buffer each thread keeps (verify._masked): a sample of
    another size or dtype, after a larger or a corrupt one, and samples checked side by side
    in threads, each get exactly their own verdict."""
    big = {"hidden_states": torch.randn(4 * T, L, H).to(torch.bfloat16)}
    big["token_ids"] = torch.arange(4 * T)
    order = [
        (big, None),
        (corrupt(sample("bf16"), "nan"), "NaN or Inf"),
        (sample("bf16", 1), None),
        (corrupt(sample("fp8"), "zero_row"), "all-zero"),
        (sample("fp8", 2), None),
        (corrupt(sample("bf16", 3), "negative_zero_row"), "all-zero"),
    ]

    def verdict(t: dict):
        ids = t["token_ids"].tolist()
        try:
            verify.check_stored(t, ids, L, H, shards.SCALES_KEY)
        except verify.VerificationError as e:
            return str(e)
        return None

    empty = torch.empty(0, L, H, dtype=torch.int16)  # no tokens: no buffer, the same answer
    assert verify._masked(empty, 0x7FFF).shape == empty.shape
    for t, expected in order:
        got = verdict(t)
        assert (got is None) if expected is None else (expected in got)
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(verdict, [t for t, _ in order] * 20))
    assert [g is None for g in got] == [e is None for _, e in order] * 20


class CountingProbe:
    """A probe whose lm_head is an identity over a tiny vocabulary, counting its calls."""

    def __init__(self):
        self.calls = 0

    def agreement_batch(self, samples):
        self.calls += 1
        return [int((rows.argmax(-1) == torch.tensor(t)).sum()) for rows, t in samples]


def test_batched_probe_gives_each_sample_its_own_hits():
    """Every sample gets the hits its own rows score, and samples that wait for a running
    batch go together as the next one (fewer probe calls than samples)."""
    probe = CountingProbe()
    rows = [torch.eye(8)[i : i + 3] for i in range(5)]  # argmax: i, i+1, i+2
    targets = [[i, i + 1, 2] for i in range(5)]  # 2 hits each, 3 for the first (i + 2 == 2)

    async def go():
        with ThreadPoolExecutor(1) as ex:
            b = validator.ProbeBatcher(probe, ex, validator.Timings())
            hits = await asyncio.gather(*(b.hits(r, t) for r, t in zip(rows, targets, strict=True)))
            return hits, b.batches

    hits, batches = asyncio.run(go())
    assert hits == [3, 2, 2, 2, 2]
    assert batches == probe.calls == 2  # the first alone, the four that waited together


def test_batched_probe_passes_a_probe_failure_to_every_waiting_sample():
    class Broken:
        def agreement_batch(self, samples):
            raise RuntimeError("CUDA out of memory")

    async def go():
        with ThreadPoolExecutor(1) as ex:
            b = validator.ProbeBatcher(Broken(), ex, validator.Timings())
            return await asyncio.gather(
                *(b.hits(torch.zeros(1, 2), [0]) for _ in range(3)), return_exceptions=True
            )

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(go()))


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_take_sample_moves_the_staged_file_unchanged(tmp_path, storage):
    from safetensors.torch import save

    t = sample(storage, seed=1)
    data = save(t)
    staged = tmp_path / "staged.safetensors"
    staged.write_bytes(data)
    row = {"input_ids": list(range(T)), "loss_mask": [0] * 4 + [1] * (T - 4)}
    timings = validator.Timings()
    got = validator.take_sample(str(staged), 7, row, L, H, 64, tmp_path / "hs", 4, timings)
    dest = shards.sample_path(tmp_path / "hs", 7, 4)
    assert dest.read_bytes() == data and not staged.exists()
    assert got.entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert got.entry["bytes"] == len(data)
    positions = verify.probe_positions(row["input_ids"], row["loss_mask"], 64)
    assert positions == list(range(3, T - 1)) and got.targets == [p + 1 for p in positions]
    # the probed rows are the dequantized final layer at those positions, as before
    assert torch.equal(got.rows, shards.dequantize(t).float()[positions, -1])
    assert set(timings.seconds) == set(validator.PHASES)


def test_take_sample_rejects_a_corrupted_file_and_keeps_it_out_of_the_shards(tmp_path):
    from safetensors.torch import save

    staged = tmp_path / "staged.safetensors"
    staged.write_bytes(save(corrupt(sample("bf16"), "zero_row")))
    row = {"input_ids": list(range(T)), "loss_mask": [1] * T}
    with pytest.raises(verify.VerificationError, match="all-zero"):
        validator.take_sample(
            str(staged), 0, row, L, H, 64, tmp_path / "hs", 4, validator.Timings()
        )
    assert not (tmp_path / "hs").exists()


def test_sample_bytes_parse_as_safetensors_loads_them_without_copies():
    """shards.tensors_from_bytes gives the tensors safetensors' load gives, as views of the
    bytes (no copy while holding the interpreter lock)."""
    from safetensors.torch import load, save

    for t in (sample("bf16"), sample("fp8"), {"x": torch.zeros(0, 3), "y": torch.ones(2)}):
        data = bytearray(save(t))
        got, want = shards.tensors_from_bytes(data), load(bytes(data))
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            assert torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))
    data = bytearray(save(sample("bf16")))
    hidden = shards.tensors_from_bytes(data)["hidden_states"]
    assert hidden.view(torch.int16).any()
    data[:] = bytes(len(data))  # a view: the tensor sees its bytes change
    assert not hidden.view(torch.int16).any()
    # a dtype it does not list goes through safetensors' own load
    flags = shards.tensors_from_bytes(bytearray(save({"m": torch.tensor([True, False])})))
    assert flags["m"].tolist() == [True, False]


@pytest.mark.parametrize("damage", ["truncated", "header", "offsets", "fields", "short"])
def test_a_malformed_sample_file_is_an_error_not_a_sample(damage):
    import json as json_lib

    from safetensors.torch import save

    data = bytearray(save(sample("bf16")))
    n = int.from_bytes(data[:8], "little")
    header = json_lib.loads(bytes(data[8 : 8 + n]))
    if damage == "truncated":
        data = data[: len(data) - 100]
    elif damage == "header":
        data[9] = ord("!")
    elif damage == "offsets":  # hidden_states claims one element fewer than its shape
        header["hidden_states"]["data_offsets"][1] -= 2
        raw = json_lib.dumps(header).encode().ljust(n)
        data[8 : 8 + n] = raw[:n]
    elif damage == "fields":  # a tensor entry without its offsets
        del header["token_ids"]["data_offsets"]
        data[8 : 8 + n] = json_lib.dumps(header).encode().ljust(n)
    elif damage == "short":
        data = data[:5]
    with pytest.raises(ValueError):
        shards.tensors_from_bytes(data)


def test_a_thread_reads_each_file_into_its_buffer_exactly(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(bytes(range(256)) * 64)
    small.write_bytes(b"abc")
    assert bytes(validator.read_into_thread_buffer(str(big))) == big.read_bytes()
    view = validator.read_into_thread_buffer(str(small))
    assert bytes(view) == b"abc" and len(view) == 3


def held_lock(staged) -> int:
    """The connector's exclusive flock on ``staged.lock``, as it holds it while writing."""
    import fcntl
    import os

    fd = os.open(f"{staged}.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_waiting_for_the_writer_sleeps_until_it_releases_its_lock(tmp_path):
    import os
    import threading
    import time

    staged = tmp_path / "s.safetensors"
    staged.write_bytes(b"")
    fd = held_lock(staged)
    timings = validator.Timings()
    waiter = threading.Thread(target=validator.wait_written, args=(str(staged), timings))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # still writing
    os.close(fd)  # the connector is done
    waiter.join(10)
    assert not waiter.is_alive() and not os.path.exists(f"{staged}.lock")
    assert timings.seconds["wait_write"] >= 0.2


def test_written_now_takes_a_free_lock_and_leaves_a_held_one(tmp_path):
    import os

    staged = tmp_path / "s.safetensors"
    assert validator.written_now(str(staged))  # no lock made: nothing to wait for
    fd = held_lock(staged)
    assert not validator.written_now(str(staged)) and os.path.exists(f"{staged}.lock")
    os.close(fd)
    assert validator.written_now(str(staged)) and not os.path.exists(f"{staged}.lock")


@pytest.mark.parametrize(
    ("in_validator", "late", "waited"),
    [(False, True, "wait"), (True, True, "validate"), (False, False, None)],
)
def test_the_client_waits_for_the_servers_writes_outside_its_validator_pool(
    tmp_path, monkeypatch, in_validator, late, waited
):
    """A validator thread sleeping on the writer's lock is one fewer checking samples: the
    client waits in threads of its own (``wait_in_validator`` puts it back, for the
    benchmark's comparison), a sample already written waits nowhere, and every sample is
    checked only once it is written."""
    import itertools
    import os
    import threading

    from safetensors.torch import save

    from eagle3_pipeline import config as cfglib
    from eagle3_pipeline import extract
    from eagle3_pipeline.extract import client as client_mod
    from eagle3_pipeline.runtime import Progress

    waited_in, real = [], validator.wait_written

    def spy(staged, timings=None):
        waited_in.append(threading.current_thread().name)
        return real(staged, timings)

    monkeypatch.setattr(validator, "wait_written", spy)
    monkeypatch.setattr(client_mod, "wait_written", spy)
    data, counter = save(sample("bf16", seed=1)), itertools.count()

    async def request(client, model, input_ids, *, timeout, max_retries):
        staged = tmp_path / f"staged{next(counter)}.safetensors"
        fd = held_lock(staged)
        if not late:
            staged.write_bytes(data)
            os.close(fd)
            return str(staged)
        staged.write_bytes(data[: len(data) // 2])  # half written when the answer comes
        threading.Timer(0.1, lambda: (staged.write_bytes(data), os.close(fd))).start()
        return str(staged)

    class Probe:
        def agreement_batch(self, samples):
            return [len(targets) for _, targets in samples]

    rows = [{"input_ids": list(range(T)), "loss_mask": [0] * 4 + [1] * (T - 4)}] * 3
    book = extract.ShardBook(tmp_path / "hs", 4, range(3))
    cfg = cfglib.validate({})["extract"]
    ex = extract.Extractor(
        rows,
        book,
        Probe(),
        list(range(L)),
        H,
        cfg,
        tmp_path,
        request=request,
        wait_in_validator=in_validator,
    )
    asyncio.run(ex.run("http://127.0.0.1:9", "m", [0, 1, 2], Progress(3, "x"), lambda: None))
    book.close()
    if waited is None:
        assert waited_in == []
    else:
        assert len(waited_in) == 3 and all(n.startswith(waited) for n in waited_in), waited_in
        assert ex.timings["wait_write"] >= 0.05
    positions = verify.probe_positions(rows[0]["input_ids"], rows[0]["loss_mask"], 64)
    assert ex.checked == 3 * len(positions) and not ex.failures  # whole files checked
    assert not list(tmp_path.glob("*.lock"))

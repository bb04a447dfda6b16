"""A CPU-capable variant of vLLM's ``ExampleHiddenStatesConnector``.

vLLM loads this module inside the server (``kv_connector_module_path``); it imports only the
light ``shards`` module of the pipeline. The stock connector copies hidden states off the GPU
through a CUDA stream into pinned memory, which fails on a CPU build (``pin_memory=True requires
a CUDA ... backend``). On CUDA with bf16 storage of a bf16 server this class behaves exactly like
the stock one; for other storage (fp8, or bf16 of a float32 server) it converts on the stock
path's side stream before the same asynchronous copy into pinned memory, so the engine step
does not wait for it; on a CPU build it converts and copies in place. With
``kv_connector_extra_config.storage = "fp8"`` it stores per-token scaled float8 like
hs-connectors' ``FP8HiddenStatesConnector`` (same keys, so ``FP8Transfer`` reads it). With
``kv_connector_extra_config.transport = "mooncake"`` the same bytes go into a Mooncake store
under the file's name instead of into the file (:mod:`eagle3_pipeline.hidden_states.mooncake`).
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save, save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

from eagle3_pipeline.hidden_states import mooncake
from eagle3_pipeline.hidden_states.shards import SCALES_KEY, quantize_fp8

try:  # vLLM >= 0.32 reports GPU syncs in its debug mode unless allowed; 0.26 has no such check
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed
except ImportError:
    from contextlib import nullcontext as gpu_sync_allowed


class _Done:
    """Stands in for a CUDA event once a CPU copy has finished."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class PipelineHiddenStatesConnector(ExampleHiddenStatesConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._storage = self._kv_transfer_config.get_from_extra_config("storage", "bf16")
        self._transport = self._kv_transfer_config.get_from_extra_config("transport", "file")
        self._mooncake_cfg = self._kv_transfer_config.get_from_extra_config("mooncake", None)
        self._store = None
        if self._transport == "mooncake":
            self.use_lock = False  # a store entry appears whole: no lock file to wait on

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        super().register_kv_caches(kv_caches)  # knows the TP rank from here on
        if self._transport == "mooncake" and self._is_tp_rank_zero:
            # at the server's start, so that a wrong master fails it, not its first request
            self._store = mooncake.open_store(
                self._mooncake_cfg, self._mooncake_cfg["segment_mib"] * mooncake.MIB
            )

    def get_finished_count(self) -> int:
        # Only tensor-parallel rank 0 writes, so a request gets one "finished sending" report.
        # vLLM 0.26's stock connector leaves this at None, which makes the engine wait for one
        # report per rank: under TP > 1 no request would ever finish (vLLM 0.32 returns 1 too).
        return 1

    def _on_cpu(self) -> bool:
        return self._kv_cache is not None and self._kv_cache.device.type == "cpu"

    def _write(self, tensors: dict[str, torch.Tensor], filename: str) -> None:
        if self._store is not None:
            mooncake.put(self._store, filename, save(tensors))
            return
        tmp = filename + ".partial"
        save_file(tensors, tmp)
        os.replace(tmp, filename)

    def _write_tensors_bound(self, tensors, event, filename, lock_fd) -> None:
        try:
            event.synchronize()
            self._write(tensors, filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    def _slots(self, pending: PendingSave) -> torch.Tensor:
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        return (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()

    def _stored(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """A sample's hidden states in the storage format, on their device."""
        if self._storage == "fp8":
            q, scale = quantize_fp8(hidden_states)
            return {"hidden_states": q, SCALES_KEY: scale}
        return {"hidden_states": hidden_states.to(torch.bfloat16)}

    def _copy_on_cpu(self, pending: PendingSave):
        # The KV blocks are freed and reused once this request reports done, so the written
        # tensors must not alias them: extract_from_kv_cache indexes with tensors, which
        # always copies, so no second copy is needed.
        hs = extract_from_kv_cache(self._kv_cache, self._slots(pending), len(pending.token_ids))
        return self._stored(hs), _Done()

    def _copy_on_stream(self, pending: PendingSave):
        """Like the stock path: convert on the copy stream once it has seen the default
        stream's writes, copy into pinned memory without blocking, and let the writer thread
        wait for the event: the engine step goes on while the copy runs."""
        stream = self._get_copy_stream()
        ready = torch.cuda.Event()
        ready.record()
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            with gpu_sync_allowed():
                slots = self._slots(pending).to(self._kv_cache.device, non_blocking=True)
            hs = extract_from_kv_cache(self._kv_cache, slots, len(pending.token_ids))
            tensors = {}
            for key, value in self._stored(hs).items():
                tensors[key] = torch.empty_like(value, device="cpu", pin_memory=True)
                tensors[key].copy_(value, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return tensors, done

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        if self._on_cpu():
            tensors, done = self._copy_on_cpu(pending)
        elif (
            self._storage == "bf16"
            and self._kv_cache.dtype == torch.bfloat16
            and self._store is None
        ):
            return super()._submit_async_write(pending)  # the stock asynchronous GPU path
        else:
            tensors, done = self._copy_on_stream(pending)
        tensors["token_ids"] = pending.token_ids.clone()
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if self._store is None:
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(
            self._write_tensors_bound, tensors, done, pending.filename, lock_fd
        )
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(lambda f, rid=pending.req_id: self._on_write_done(rid, f))

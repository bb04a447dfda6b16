"""The training process's side of online and hybrid mode: the backend it reads its hidden
states through.

Training reads hidden states through a registered ``hs_connectors`` backend
(:data:`BACKEND_NAME`). Where the stored mode's backend reads a sample file written by the
extract jobs, this one asks an extraction server for the sample when speculators' dataset
wants it: the same request as the extract job
(:func:`eagle3_pipeline.extract.client.request_hidden_states`), the same checks on what comes
back (:func:`eagle3_pipeline.extract.validator.check_staged`: shapes, token ids, NaN/Inf,
all-zero rows; the next-token probe at up to ``extract.agreement_positions_per_sample``
completion positions), then the file is deleted, or, in hybrid mode for the first
:func:`.job.kept_rows` rows, moved into a cache of this train job and read from there in later
epochs. A sample that fails its checks fails training, as it fails the extract job; the
agreement is enforced on what each process has probed and, by the train stage, over the whole
training (:func:`.spec.served_summary`).

speculators' own ``--on-missing generate`` is not used: it hands the backend only the
server's answer (``get_generated``), not the row, so the probe (which needs the row's loss
mask) could not run, and it asks one endpoint. Here ``get_cached`` does the round trip, with
the row at hand, over every endpoint (sample i goes to endpoint i mod n): speculators'
dataset, sampler, collation and resume (its fast-skip slices the sampler's batch list, so
skipped batches ask no server) stay unchanged.

Every sample served is a line of a ledger per process (``<work>/online/served/``): which row,
from where (generated or the hybrid cache), its bytes and probe hits. The train stage sums it
up for metrics.json; the tests read from it which rows each attempt trained.

The transfer is pickled into spawned DataLoader workers: it holds plain values and opens its
event loop, HTTP clients, probe and dataset lazily in the process that uses them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer

from ..extract.capture import ExtractError
from ..extract.client import request_hidden_states
from ..extract.validator import check_staged
from ..hidden_states import mooncake, shards
from ..hidden_states.checks import NextTokenProbe, VerificationError
from ..hidden_states.dataset import PathBackend, layer_columns, register_backend, training_sample
from ..runtime.files import AppendLog, atomic_path
from ..runtime.results import ONLINE_SPEC, read_result
from ..server import client as client_lib
from .spec import SPEC_FILE

BACKEND_NAME = "eagle3-pipeline-online"
# A process checks the next-token agreement of what it has probed once it has this many
# positions: fewer say little (a handful of hard tokens), and the train stage checks the whole
# training's agreement at the end anyway.
ENFORCE_AFTER_POSITIONS = 128


class OnlineError(ExtractError):
    pass


class OnlineTransfer(HiddenStatesTransfer):
    """Produces sample ``i`` on demand (see the module docstring); in hybrid mode rows below
    ``kept_rows`` are read from the cache once they are there."""

    def __init__(self, spec: dict, dequantize_dtype: str = "bfloat16", columns=None):
        self.spec = spec
        self.dequantize_dtype = dequantize_dtype
        self.columns = columns
        self._state: dict[str, Any] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_state": None}  # a worker opens its own

    # -- per process ---------------------------------------------------------------------
    def _opened(self) -> dict[str, Any]:
        if self._state is not None and self._state["pid"] == os.getpid():
            return self._state
        from datasets import load_from_disk

        s = self.spec
        loop = asyncio.new_event_loop()

        async def clients():
            return [
                client_lib.async_client(
                    e["base_url"],
                    api_key=os.environ.get(e.get("api_key_env") or "") or None,
                    timeout=s["request_timeout_s"],
                    max_retries=0,
                )
                for e in s["endpoints"]
            ]

        device = "cpu" if s["verify_device"] == "auto" else s["verify_device"]
        ledger = AppendLog(Path(s["ledger"]) / f"{s['attempt']}-{os.getpid()}.jsonl")
        ledger.open()
        clients_of_loop = loop.run_until_complete(clients())

        def close() -> None:  # at the process's exit: the HTTP sessions, then the loop
            for c in clients_of_loop:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(c.close())
            loop.close()

        atexit.register(close)
        self._state = {
            "pid": os.getpid(),
            "loop": loop,
            "clients": clients_of_loop,
            "probe": NextTokenProbe(s["model_path"], s["arch"], device),
            # extract.transport mooncake: a client that takes samples and lends no memory
            "store": mooncake.open_store(s["mooncake"], 0)
            if s["transport"] == "mooncake"
            else None,
            "rows": load_from_disk(s["dataset_dir"]).with_format(None),
            "ledger": ledger,
            "hits": 0,
            "checked": 0,
        }
        return self._state

    def _cache_path(self, index: int) -> Path:
        return shards.sample_path(self.spec["cache"], index, self.spec["samples_per_shard"])

    # -- HiddenStatesTransfer --------------------------------------------------------------
    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        from safetensors.torch import load_file

        file_idx = int(file_idx)  # the sampler's numpy integer
        if not 0 <= file_idx < self.spec["num_samples"]:
            return None
        if file_idx < self.spec["kept_rows"]:
            path = self._cache_path(file_idx)
            if path.exists():
                tensors = load_file(str(path))
                self._record(file_idx, "cache", bytes=path.stat().st_size)
                return training_sample(tensors, self.dequantize_dtype, self.columns)
        return self.generate(file_idx)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> None:
        raise RuntimeError(
            f"backend {BACKEND_NAME!r} produces samples in get_cached; train with on_missing=raise"
        )

    def generate(self, index: int) -> dict[str, Any]:
        """Ask a server for row ``index``'s hidden states, check them, delete or keep the file,
        record it; the sample as training takes it."""
        st, s = self._opened(), self.spec
        row = st["rows"][index]
        k = index % len(s["endpoints"])
        endpoint = s["endpoints"][k]
        t0 = time.perf_counter()
        try:
            staged = st["loop"].run_until_complete(
                request_hidden_states(
                    st["clients"][k],
                    endpoint["model"],
                    row["input_ids"],
                    timeout=s["request_timeout_s"],
                    max_retries=s["retries"],
                )
            )
        except Exception as e:  # after request_hidden_states' own retries (extract.retries)
            raise OnlineError(
                f"sample {index}: the extraction server at {endpoint['base_url']} returned no "
                f"hidden states ({type(e).__name__}: {e}). It must serve the target with the "
                "pipeline's connector (extract.endpoints: scripts/extraction_server.py); a "
                "server the train job started died (its log is the train job's)."
            ) from e
        try:
            # through a Mooncake store the server's answer names an entry, not a file
            data = None if st["store"] is None else self._take(st["store"], staged, endpoint)
            sample = check_staged(
                staged,
                row,
                len(s["layer_ids"]),
                s["hidden_size"],
                s["positions_per_sample"],
                data=data,
            )
        except (VerificationError, ValueError) as e:
            if st["store"] is None:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
            raise OnlineError(
                f"sample {index} from the extraction server at {endpoint['base_url']}: {e}. "
                f"The hidden states are wrong (expected layers {s['layer_ids']} of hidden size "
                f"{s['hidden_size']}): is the server started with the pipeline's connector "
                "and these layers (scripts/extraction_server.py)? Not trained on."
            ) from e
        tensors = {name: t.clone() for name, t in sample.tensors.items()}  # out of the buffer
        (hits,) = st["probe"].agreement_batch([(sample.rows, sample.targets)])
        size = len(sample.data)
        keep = index < s["kept_rows"]
        if keep:
            dest = self._cache_path(index)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if st["store"] is None:
                os.replace(staged, dest)  # atomic: a kill leaves it whole or absent
            else:
                with atomic_path(dest) as tmp:
                    tmp.write_bytes(bytes(sample.data))
        elif st["store"] is None:
            os.unlink(staged)
        self._record(
            index,
            "generated",
            bytes=size,
            tokens=len(row["input_ids"]),
            hits=hits,
            checked=len(sample.targets),
            kept=keep,
            endpoint=k,
            seconds=round(time.perf_counter() - t0, 4),
        )
        st["hits"] += hits
        st["checked"] += len(sample.targets)
        self._enforce(st)
        return training_sample(tensors, self.dequantize_dtype, self.columns)

    def _take(self, store: Any, key: str, endpoint: dict) -> bytes:
        try:
            return mooncake.take(store, key, self.spec["request_timeout_s"])
        except mooncake.MooncakeError as e:
            raise OnlineError(f"{e} (extraction server {endpoint['base_url']})") from e

    def _record(self, index: int, source: str, **fields: Any) -> None:
        st = self._opened()
        st["ledger"].append(
            {"index": index, "source": source, "attempt": self.spec["attempt"], "t": time.time()}
            | fields
        )

    def _enforce(self, st: dict) -> None:
        s = self.spec
        if not s["enforce_agreement"] or st["checked"] < ENFORCE_AFTER_POSITIONS:
            return
        agreement = st["hits"] / st["checked"]
        if agreement < s["min_next_token_agreement"]:
            raise OnlineError(
                f"next-token agreement {agreement:.3f} over the {st['checked']} positions probed "
                f"so far < extract.min_next_token_agreement {s['min_next_token_agreement']}: "
                "lm_head(norm(h_final)) does not predict the greedy synth tokens, so the hidden "
                "states the servers return are shifted, zeroed or from the wrong layers. "
                "Training stopped."
            )


class OnlineBackend(PathBackend):
    """``--hidden-states-backend eagle3-pipeline-online --hidden-states-path <dir>``: ``<dir>``
    holds :data:`SPEC_FILE`, written by the train stage before each launch."""

    path_help = "directory of the online spec (online.json)"

    @staticmethod
    def from_train_args(args, data_path: str) -> OnlineTransfer:
        root, dtype = PathBackend.root_and_dtype(args, BACKEND_NAME)
        spec = read_result(root / SPEC_FILE, ONLINE_SPEC)
        aux = getattr(args, "target_layer_ids", None) or spec["layer_ids"][:-1]
        return OnlineTransfer(
            spec, dtype, layer_columns({"layer_ids": spec["layer_ids"]}, [int(i) for i in aux])
        )

    @staticmethod
    def build_kv_transfer_config(args) -> dict[str, Any]:
        raise NotImplementedError("the train stage configures its extraction servers itself")


def register() -> type[HiddenStatesBackend]:
    """Register :class:`OnlineBackend` under :data:`BACKEND_NAME` (idempotent)."""
    return register_backend(BACKEND_NAME, OnlineBackend)


register()

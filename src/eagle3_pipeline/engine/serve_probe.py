"""What a served EAGLE-3 drafter is fed: the target's aux hidden states at serve time, recorded
inside vLLM and compared with what extraction stored for the same tokens.

Extraction (method ``extract_hidden_states``) and serving (method ``eagle3``) both take the aux
layers from the target's forward, but through different engine paths: the prefill of a whole
row against the verification of a few drafted tokens, vLLM's V1 model runner against its V2
one (vLLM 0.26 serves dense targets with V2, MoE targets and extraction with V1), a prefill
attention kernel against a decode kernel (MLA's absorbed path). A drafter trained on one and
fed the other accepts less, and acceptance alone barely shows it. So the bench stage asks the
drafter's server for one extracted row and compares, per aux layer, what the drafter received
with what it was trained on (:func:`compare`).

The recording side is a vLLM general plugin (``pyproject.toml``): in each vLLM process,
:func:`register` wraps the proposer's ``propose`` when ``EAGLE3_PIPELINE_SERVE_PROBE`` names a
directory. While ``<dir>/active`` exists, each call of tensor-parallel rank 0 writes its token
ids, positions and aux features to ``<dir>/call_NNNNN.safetensors`` (up to
:data:`MAX_TOKENS` tokens in all); afterwards the wrapper costs one ``os.path.exists``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENV = "EAGLE3_PIPELINE_SERVE_PROBE"
ENTRY_POINT = f"{__name__}:register"
ACTIVE = "active"
MAX_TOKENS = 16384
PATCHED = "_eagle3_pipeline_serve_probe"
LOG_LINE = "eagle3_pipeline: recording the drafter's input features"


class _Recorder:
    def __init__(self, directory: str):
        self.dir = Path(directory)
        self.calls = 0
        self.tokens = 0

    def wanted(self) -> bool:
        return self.tokens < MAX_TOKENS and (self.dir / ACTIVE).exists()

    def write(self, token_ids, positions, features) -> None:
        import torch
        from safetensors.torch import save_file

        n = min(token_ids.shape[0], features.shape[0], positions.shape[-1])
        if n == 0:
            return
        tensors = {
            "token_ids": token_ids[:n].detach().to("cpu", torch.int64).contiguous(),
            "positions": positions[..., :n].detach().to("cpu", torch.int64).contiguous(),
            "features": features[:n].detach().to("cpu", torch.float32).contiguous(),
        }
        path = self.dir / f"call_{self.calls:05d}.safetensors"
        save_file(tensors, str(path) + ".partial")
        os.replace(str(path) + ".partial", path)
        self.calls += 1
        self.tokens += n


def _rank_zero() -> bool:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:  # not initialized (single process): the only rank
        return True


def _wrap_v1(cls, recorder: _Recorder) -> None:
    """V1 model runner: ``propose(num_speculative_tokens, target_token_ids, target_positions,
    target_hidden_states, ...)``, the aux layers concatenated on the last dimension."""
    import functools

    original = cls.propose

    @functools.wraps(original)
    def propose(self, *args, **kwargs):
        if getattr(self, "method", None) == "eagle3" and recorder.wanted() and _rank_zero():
            names = ("num_speculative_tokens", "target_token_ids", "target_positions")
            bound = dict(zip((*names, "target_hidden_states"), args, strict=False)) | kwargs
            recorder.write(
                bound["target_token_ids"],
                bound["target_positions"],
                bound["target_hidden_states"],
            )
        return original(self, *args, **kwargs)

    setattr(propose, PATCHED, True)
    cls.propose = propose


def _wrap_v2(cls, recorder: _Recorder) -> None:
    """V2 model runner (vLLM 0.26 serves dense targets with it): ``propose(input_batch,
    attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, ...)``."""
    import functools

    import torch

    original = cls.propose

    @functools.wraps(original)
    def propose(self, input_batch, *args, **kwargs):
        aux = kwargs.get("aux_hidden_states", args[3] if len(args) > 3 else None)
        dummy = kwargs.get("dummy_run") or kwargs.get("is_profile")
        if aux and not dummy and recorder.wanted() and _rank_zero():
            n = int(input_batch.num_tokens)
            recorder.write(
                input_batch.input_ids[:n],
                input_batch.positions[:n],
                torch.cat([h[:n] for h in aux], dim=-1),
            )
        return original(self, input_batch, *args, **kwargs)

    setattr(propose, PATCHED, True)
    cls.propose = propose


def register() -> None:
    """The plugin's entry point: with ``EAGLE3_PIPELINE_SERVE_PROBE`` set, record what the
    EAGLE-3 drafter is fed (once per process); without it, nothing."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    recorder = _Recorder(directory)
    wrapped = []
    try:
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        if not getattr(SpecDecodeBaseProposer.propose, PATCHED, False):
            _wrap_v1(SpecDecodeBaseProposer, recorder)
        wrapped.append("V1")
    except ImportError:
        pass
    try:
        from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import (
            AutoRegressiveSpeculator,
        )

        if not getattr(AutoRegressiveSpeculator.propose, PATCHED, False):
            _wrap_v2(AutoRegressiveSpeculator, recorder)
        wrapped.append("V2")
    except ImportError:
        pass
    from vllm.logger import init_logger

    logger = init_logger(f"vllm.plugins.{__name__}")
    logger.info("%s (%s model runner) into %s", LOG_LINE, "/".join(wrapped) or "no", directory)


def installed() -> bool:
    """Whether vLLM will load this plugin (the package installed with its entry points)."""
    from importlib.metadata import entry_points

    return any(e.value == ENTRY_POINT for e in entry_points(group="vllm.general_plugins"))


def read_calls(directory: str | Path) -> list[dict[str, Any]]:
    """The recorded calls in order: ``{"token_ids", "positions", "features"}`` numpy arrays
    (positions: the last row of M-RoPE's three)."""
    from safetensors.numpy import load_file

    calls = []
    for path in sorted(Path(directory).glob("call_*.safetensors")):
        t = load_file(str(path))
        positions = t["positions"]
        calls.append(
            {
                "token_ids": t["token_ids"],
                "positions": positions if positions.ndim == 1 else positions[-1],
                "features": t["features"],
            }
        )
    return calls


def served_features(calls: list[dict[str, Any]], token_ids) -> tuple[Any, Any]:
    """For one sequence ``token_ids`` (sent as a prompt, or a prompt and what the server then
    generated), the features the drafter received at each position: ``(features [n, aux *
    hidden], NaN rows where none was recorded; whether each position was recorded)``. Within a
    call, a run of consecutive positions counts up to its first token that is not the
    sequence's: a verification step's rejected drafts, and everything computed after them, are
    features of another prefix."""
    import numpy as np

    token_ids = np.asarray(token_ids)
    n = len(token_ids)
    width = max((c["features"].shape[1] for c in calls), default=0)
    feats = np.full((n, width), np.nan, dtype=np.float32)
    seen = np.zeros(n, dtype=bool)
    for call in calls:
        ok, previous = False, None
        for row, (pos, tok) in enumerate(zip(call["positions"], call["token_ids"], strict=True)):
            pos = int(pos)
            if previous is None or pos != previous + 1:
                ok = True  # a new request (or a new run) starts here
            previous = pos
            ok = ok and 0 <= pos < n and int(token_ids[pos]) == int(tok)
            if ok:
                feats[pos] = call["features"][row]
                seen[pos] = True
    return feats, seen


def compare(served, seen, stored, slots: list[int]) -> dict[str, Any]:
    """Per aux layer i, ‖served_i - stored[:, slots[i]]‖ / ‖stored[:, slots[i]]‖ over the
    positions recorded, and which stored slot each served layer is closest to (a shifted or
    reordered layer shows there). ``stored`` is the extraction's ``[n, captured layers,
    hidden]``; ``slots`` the slots of the layers the drafter was trained on, in its order."""
    import numpy as np

    stored = np.asarray(stored, dtype=np.float32)
    n, num_slots, hidden = stored.shape
    mask = np.asarray(seen[:n])
    result: dict[str, Any] = {"positions": int(mask.sum()), "expected_slots": list(slots)}
    if not mask.any():
        return {**result, "rel_err_per_layer": [], "closest_slot": [], "max_rel_err": None}
    got = np.asarray(served[:n][mask]).reshape(-1, len(slots), hidden)
    want = stored[mask]
    rel, closest, margin = [], [], []
    for i, slot in enumerate(slots):
        ref = np.linalg.norm(want[:, slot])
        dist = [float(np.linalg.norm(got[:, i] - want[:, j])) for j in range(num_slots)]
        rel.append(dist[slot] / max(float(ref), 1e-30))
        closest.append(int(np.argmin(dist)))
        others = [d for j, d in enumerate(dist) if j != slot]
        # how much nearer the trained-on layer is than any other captured one
        margin.append(dist[slot] / max(min(others), 1e-30) if others else 0.0)
    return {
        **result,
        "rel_err_per_layer": rel,
        "closest_slot": closest,
        "distance_ratio_to_next_layer": margin,
        "max_rel_err": max(rel),
    }

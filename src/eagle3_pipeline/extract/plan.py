"""What an extraction captures and where: layers, sample sizes, the disk budget, a row's key,
the capture fingerprint and the extraction server's spec."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..fileio import sha256_bytes, stable_hash
from ..server import spec_for_target

log = logging.getLogger(__name__)

CONNECTOR = "PipelineHiddenStatesConnector"
CONNECTOR_MODULE = "eagle3_pipeline.vllm_connector"
BYTES_PER_VALUE = {"bf16": 2, "fp8": 1}


class ExtractError(RuntimeError):
    pass


class DiskBudgetError(ExtractError):
    pass


def resolve_layers(cfg: dict, arch: dict) -> tuple[list[int], list[int], int]:
    """(aux layer ids, captured aux layer ids, final layer id). The aux ids are
    ``extract.layer_ids`` (or the target's default), the ones every drafter method without
    layers of its own trains on; the captured ones add the layers other methods ask for
    (``method_layer_ids``: one extraction serves them all). The final id N is the last
    layer's output before the final norm; vLLM captures the ids in increasing order, so the
    final one comes last."""
    n = arch["num_layers"]
    aux = list(cfg["layer_ids"] or arch["default_layer_ids"])
    captured = sorted({*aux, *(cfg.get("method_layer_ids") or [])})
    bad = [i for i in captured if not 0 <= i < n]
    if bad:
        raise ExtractError(
            f"layer ids {bad} (extract.layer_ids, train.<method>.layer_ids) out of range: the "
            f"target has {n} layers (valid ids 0..{n - 1}; the final layer {n} is added "
            "automatically)"
        )
    return aux, captured, n


def sample_bytes(tokens: int, num_layers: int, hidden: int, storage: str) -> int:
    """Bytes of one sample file (tensor data plus a small safetensors header)."""
    data = tokens * num_layers * hidden * BYTES_PER_VALUE[storage] + tokens * 8
    if storage == "fp8":
        data += tokens * 4  # per-token float32 scales
    return data + 512


def check_disk(root: Path, needed: int, margin: float) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    info = {"estimated_bytes": needed, "free_bytes": free, "margin": margin}
    if needed * margin > free:
        raise DiskBudgetError(
            f"hidden states need about {needed / 2**30:.1f} GiB (x{margin} margin = "
            f"{needed * margin / 2**30:.1f} GiB) but {root} has {free / 2**30:.1f} GiB free. "
            "Free space, point results_dir at a bigger disk, use extract.storage: fp8 "
            "(half the size), or lower prepare.seq_length / the number of prompts."
        )
    log.info("disk: %.2f GiB needed, %.1f GiB free", needed / 2**30, free / 2**30)
    return info


def row_key(input_ids) -> str:
    """A row's key for reuse: its token ids (what the target is asked to prefill)."""
    return sha256_bytes(np.asarray(input_ids, dtype=np.int64).tobytes())


# Bump when a change alters what a stored sample holds for the same row (the capture, its
# storage format): every stored sample is then extracted again.
CAPTURE_FORMAT = 1


def capture_fingerprint(target: dict, layer_ids: list[int], cfg: dict, vllm_cfg: dict) -> str:
    """What a stored sample depends on besides its row's token ids."""
    return stable_hash(
        {
            "format": CAPTURE_FORMAT,
            "target": target["identity"],
            "layer_ids": layer_ids,
            "storage": cfg["storage"],
            "device": vllm_cfg["device"],
            "dtype": vllm_cfg["dtype"],
        }
    )


def _capture_modules() -> None:
    """Never called. The server runs the connector that writes the samples (by module path,
    CONNECTOR_MODULE); importing it here puts it into this stage's code hash
    (eagle3_pipeline.workflow.code_hash)."""
    from .. import vllm_connector  # noqa: F401


def server_spec(vllm_cfg: dict, target: dict, layer_ids: list[int], staging: Path, cfg: dict):
    return spec_for_target(
        vllm_cfg,
        target,
        extra_args=cfg["server_args"],
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
        },
        kv_transfer_config={
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {
                "shared_storage_path": str(staging),
                "storage": cfg["storage"],
            },
        },
    )

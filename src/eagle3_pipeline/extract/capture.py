"""What an extraction captures and where: layers, a row's key, the capture fingerprint and the
extraction server's spec."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..engine.spec import spec_for_target
from ..hidden_states.layers import LayerIdError, resolve_layers  # noqa: F401  (re-exported)
from ..runtime.files import sha256_bytes, stable_hash

log = logging.getLogger(__name__)

CONNECTOR = "PipelineHiddenStatesConnector"
CONNECTOR_MODULE = "eagle3_pipeline.hidden_states.connector"


class ExtractError(RuntimeError):
    pass


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
    (eagle3_pipeline.staleness.code.code_hash)."""
    from ..hidden_states import connector as vllm_connector  # noqa: F401


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
                **transport_config(cfg),
            },
        },
    )


def transport_config(cfg: dict) -> dict:
    """The connector's settings for ``extract.transport`` (none for files): with mooncake,
    its store's master, as the train job resolved it (``extract.mooncake.master``)."""
    if cfg.get("transport", "file") != "mooncake":
        return {}
    return {"transport": "mooncake", "mooncake": dict(cfg["mooncake"])}

"""What hidden states fill on the disk: one sample file's bytes (:func:`sample_bytes`, the
layout of :mod:`.shards`) and what one sample asked for and not yet loaded fills in online
training (:func:`staged_sample_bytes`). The plan sums them before a run; the extract and train
jobs on their real rows before their servers start (the check itself:
:func:`eagle3_pipeline.runtime.disk.check_disk`)."""

from __future__ import annotations

BYTES_PER_VALUE = {"bf16": 2, "fp8": 1}


def sample_bytes(tokens: int, num_layers: int, hidden: int, storage: str) -> int:
    """Bytes of one sample file (tensor data plus a small safetensors header)."""
    data = tokens * num_layers * hidden * BYTES_PER_VALUE[storage] + tokens * 8
    if storage == "fp8":
        data += tokens * 4  # per-token float32 scales
    return data + 512


def staged_sample_bytes(extract_cfg: dict, sample_bytes: int) -> int:
    """What one sample asked for and not yet loaded fills on the disk: its file, or nothing
    when a Mooncake store holds it (extract.transport mooncake)."""
    return 0 if extract_cfg["transport"] == "mooncake" else sample_bytes

"""On-disk layout of extracted hidden states, shared by the extract (writer) and train (reader).

    <root>/manifest.json                          written last by extract_gather
    <root>/parts/part_<k>.json                    one per extract job, written last by it
    <root>/shards/shard_<s:05d>/hs_<i>.safetensors  sample i (= row i of prepare/dataset)
    <root>/shards/shard_<s:05d>/shard.json        seal: per-sample bytes/sha256, written last

Sample i lives in shard i // samples_per_shard, which keeps directories small. Each file holds
``hidden_states`` [seq, n_layers, hidden] (bf16, or float8_e4m3fn plus ``hidden_states_scales``
[seq, 1, 1] float32 in fp8 mode) and ``token_ids`` [seq] int64: the layout speculators'
``FileTransfer`` reads, the final layer last.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..runtime.results import HIDDEN_STATES, format_tag

MANIFEST_FORMAT = format_tag(HIDDEN_STATES)
SCALES_KEY = "hidden_states_scales"


def quantize_fp8(hidden_states):
    """Per-token float8_e4m3fn quantization: (fp8 tensor, float32 scale [seq, 1, 1]).
    Identical to hs_connectors.fp8_utils, so its FP8Transfer reads our files too."""
    import torch

    fp8 = torch.float8_e4m3fn
    fp32 = hidden_states.float()
    dims = tuple(range(1, fp32.dim()))
    amax = fp32.abs().amax(dim=dims, keepdim=True)
    scale = (amax / torch.finfo(fp8).max).clamp(min=1e-12)
    return (fp32 / scale).to(fp8), scale


def dequantize(tensors: dict, device=None):
    """The hidden states of a loaded sample file, on ``device``: fp8 files are scaled back to
    float32; bf16 ones keep their dtype (no copy on the CPU)."""
    hidden = tensors["hidden_states"]
    if device is not None:
        hidden = hidden.to(device, non_blocking=True)
    if SCALES_KEY in tensors:
        return hidden.float() * tensors[SCALES_KEY].to(hidden.device).float()
    return hidden


_thread_buffers = threading.local()


def thread_buffer(name: str, nbytes: int) -> memoryview:
    """``nbytes`` of a buffer the calling thread keeps under ``name``, grown when too small:
    a fresh buffer the size of a sample is fresh memory, page-faulted and zeroed by the kernel
    for every sample. What was in it is overwritten by the thread's next use."""
    buf = getattr(_thread_buffers, name, None)
    if buf is None or len(buf) < nbytes:
        buf = bytearray(nbytes)
        setattr(_thread_buffers, name, buf)
    return memoryview(buf)[:nbytes]


# safetensors dtype names -> torch dtype names, for the tensors a sample file holds
_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
}


def tensors_from_bytes(data) -> dict:
    """The tensors of a safetensors file's bytes (``bytes``, ``bytearray`` or a memoryview),
    as views of those bytes, not copies: safetensors' own ``load`` copies every tensor while it
    holds the interpreter lock (2.8 ms a sample at the 8B width, most of the extraction
    validator's share of the lock). Checked as ``load`` checks them: a header that does not
    parse, offsets outside the data or out of order, or a size that does not match the shape
    raise ValueError. A dtype not listed here goes through ``load``."""
    import json
    import math

    import torch

    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise ValueError(f"not a safetensors file: {len(view)} bytes")
    n = int.from_bytes(view[:8], "little")
    if n > len(view) - 8:
        raise ValueError(f"safetensors header of {n} bytes in a file of {len(view)}")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"safetensors header does not parse: {e}") from e
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a mapping")
    header.pop("__metadata__", None)
    body = len(view) - 8 - n
    fields = {"dtype", "shape", "data_offsets"}
    if any(not isinstance(v, dict) or not fields <= v.keys() for v in header.values()):
        raise ValueError("safetensors header: a tensor without dtype, shape or data_offsets")
    if any(v["dtype"] not in _DTYPES for v in header.values()):
        from safetensors.torch import load

        return load(bytes(view))
    out, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        (begin, stop), shape = info["data_offsets"], info["shape"]
        dtype = getattr(torch, _DTYPES[info["dtype"]])
        size = dtype.itemsize
        if begin != end or stop < begin or stop > body or stop - begin != math.prod(shape) * size:
            raise ValueError(f"safetensors tensor {name!r}: offsets {begin}-{stop} do not fit")
        end = stop
        count = (stop - begin) // size
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(view, dtype=dtype, count=count, offset=8 + n + begin)
        out[name] = flat.reshape(shape)
    if end != body:
        raise ValueError(f"safetensors data of {body} bytes, tensors of {end}")
    return out


def shard_index(sample: int, samples_per_shard: int) -> int:
    return sample // samples_per_shard


def shard_dir(root: str | Path, shard: int) -> Path:
    return Path(root) / "shards" / f"shard_{shard:05d}"


def sample_path(root: str | Path, sample: int, samples_per_shard: int) -> Path:
    return shard_dir(root, shard_index(sample, samples_per_shard)) / f"hs_{sample}.safetensors"


def part_range(num_samples: int, samples_per_shard: int, jobs: int, part: int) -> range:
    """Samples of extract job ``part`` of ``jobs``: contiguous and whole shards, so two jobs
    never write into the same shard directory."""
    num_shards = -(-num_samples // samples_per_shard)
    per_part = -(-num_shards // jobs) if num_shards else 0
    first_shard = min(part * per_part, num_shards)
    last_shard = min(first_shard + per_part, num_shards)
    return range(first_shard * samples_per_shard, min(last_shard * samples_per_shard, num_samples))


def samples_digest(sample_sha256: list[str]) -> str:
    """Content id of a whole extraction: its sample files' sha256 in sample order, the same
    however the samples are split into shards and parts (training keys its reuse on it)."""
    import hashlib

    return hashlib.sha256("\n".join(sample_sha256).encode()).hexdigest()

"""Checks on extracted hidden states that catch silently wrong data at any model size.

* ``check_sample``: shapes, token ids equal to the row, finite values, no all-zero rows.
  ``check_stored`` does the same checks on a sample file's tensors as stored (bf16, or fp8
  with per-token scales) by their bits, on the CPU, without converting them to float.
* ``NextTokenProbe``: ``lm_head(final_norm(h_final))`` must predict the next token of the row
  at completion positions. For greedy synth data that is ~100%; shifted, zeroed or
  mis-ordered hidden states fall to ~0. Needs only the norm and lm_head weights, so it works
  for a 1T-parameter target on the CPU of the extraction host.
* ``reference_errors``: a transformers forward on a few rows where the model fits; relative
  error per layer.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from .shards import thread_buffer

log = logging.getLogger(__name__)


class VerificationError(ValueError):
    pass


def _check_layout(hidden, token_ids, row_ids: list[int], num_layers: int, hidden_size: int):
    """The sample holds one hidden state per token and layer, for the row's own tokens."""
    if list(hidden.shape) != [len(row_ids), num_layers, hidden_size]:
        raise VerificationError(
            f"hidden_states shape {list(hidden.shape)}, expected "
            f"[{len(row_ids)}, {num_layers}, {hidden_size}]"
        )
    if token_ids.tolist() != list(row_ids):
        raise VerificationError("token_ids differ from the training row")


def check_sample(
    hidden: Any, token_ids: Any, row_ids: list[int], num_layers: int, hidden_size: int
) -> dict[str, Any]:
    """Structural checks of one sample; raises VerificationError on the first failure."""
    import torch

    _check_layout(hidden, token_ids, row_ids, num_layers, hidden_size)
    lo, hi = torch.aminmax(hidden)  # NaN and Inf propagate; 15x cheaper than isfinite().all()
    if not bool(torch.isfinite(torch.stack((lo, hi))).all()):
        raise VerificationError("hidden states contain NaN or Inf")
    zero_rows = int((hidden.abs().amax(dim=-1) == 0).any(dim=-1).sum())
    if zero_rows:
        raise VerificationError(f"{zero_rows} positions have an all-zero hidden state")
    return {"tokens": len(row_ids)}


# Per stored dtype: (integer view, mask clearing the sign bit, smallest |bits| of a NaN or Inf).
# float8_e4m3fn has no Inf; its NaN is 0x7F (|bits| 0x7F).
_BITS = {
    "bfloat16": ("int16", 0x7FFF, 0x7F80),
    "float16": ("int16", 0x7FFF, 0x7C00),
    "float32": ("int32", 0x7FFFFFFF, 0x7F800000),
    "float8_e4m3fn": ("uint8", 0x7F, 0x7F),
}


def _masked(bits, mask: int):
    """``bits & mask``, written into a buffer this thread keeps (:func:`shards.thread_buffer`):
    at the 8B width a sample is 6 MB, in each of the extraction client's validator threads."""
    import torch

    if not bits.numel():  # a buffer of no bytes cannot hold a tensor
        return bits & mask
    out = thread_buffer("mask", bits.numel() * bits.element_size())
    out = torch.frombuffer(out, dtype=bits.dtype).view(bits.shape)
    return torch.bitwise_and(bits, mask, out=out)


def check_stored(
    tensors: dict, row_ids: list[int], num_layers: int, hidden_size: int, scales_key: str
) -> dict[str, Any]:
    """:func:`check_sample` on a sample file's tensors as stored, on the CPU: NaN/Inf and
    all-zero rows are read from the bits (one masked pass and one reduction over the data),
    so a sample is never converted to float nor copied to a GPU to be checked. fp8 samples
    are scaled per token: a scale that is not finite, is zero, or would overflow float32 at
    the largest fp8 value makes the dequantized sample fail as it would in check_sample."""
    import torch

    hidden, token_ids = tensors["hidden_states"], tensors["token_ids"]
    _check_layout(hidden, token_ids, row_ids, num_layers, hidden_size)
    dtype = str(hidden.dtype).removeprefix("torch.")
    if dtype not in _BITS:  # another dtype: the float checks
        return check_sample(hidden.float(), token_ids, row_ids, num_layers, hidden_size)
    view, abs_mask, special = _BITS[dtype]
    row_max = _masked(hidden.view(getattr(torch, view)), abs_mask).amax(dim=-1)  # [tokens, layers]
    if len(row_ids) and int(row_max.max()) >= special:
        raise VerificationError("hidden states contain NaN or Inf")
    zero = row_max == 0
    scales = tensors.get(scales_key)
    if scales is not None:
        s = scales.double().reshape(len(row_ids), -1)  # [tokens, 1] (or one per layer)
        largest = torch.finfo(torch.float8_e4m3fn).max * s.abs()
        if not bool((largest <= torch.finfo(torch.float32).max).all()):  # also NaN, Inf
            raise VerificationError("hidden states contain NaN or Inf")
        zero = zero | (s == 0)
    zero_rows = int(zero.any(dim=-1).sum())
    if zero_rows:
        raise VerificationError(f"{zero_rows} positions have an all-zero hidden state")
    return {"tokens": len(row_ids)}


def probe_positions(input_ids: list[int], loss_mask: list[int], max_positions: int) -> list[int]:
    """Positions p whose next token p+1 is a completion token, at most ``max_positions`` of
    them, evenly spaced (deterministic)."""
    positions = [p for p in range(len(input_ids) - 1) if loss_mask[p + 1]]
    if len(positions) > max_positions:
        step = len(positions) / max_positions
        positions = [positions[int(i * step)] for i in range(max_positions)]
    return positions


def _find_tensor_file(model_dir: Path, pattern: str) -> tuple[str, Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        for name, fname in weight_map.items():
            if re.search(pattern, name):
                return name, model_dir / fname
    for f in sorted(model_dir.glob("*.safetensors")):
        from safetensors import safe_open

        with safe_open(f, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                if re.search(pattern, name):
                    return name, f
    raise FileNotFoundError(f"no tensor matching {pattern!r} in {model_dir}")


def load_tensor(model_dir: Path, pattern: str):
    from safetensors import safe_open

    name, f = _find_tensor_file(model_dir, pattern)
    with safe_open(f, framework="pt") as fh:
        return fh.get_tensor(name)


class NextTokenProbe:
    """Predict the next token from the final-layer hidden state, as the target would."""

    def __init__(self, model_dir: str | Path, arch: dict[str, Any], device: str = "auto"):
        import torch

        if device == "auto":  # the server leaves room for a float32 lm_head on GPU hosts
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        model_dir = Path(model_dir)
        self.norm_w = load_tensor(model_dir, r"(^|\.)model\.norm\.weight$").float().to(self.device)
        try:
            head = load_tensor(model_dir, r"(^|\.)lm_head\.weight$")
        except FileNotFoundError:
            if not arch.get("tie_word_embeddings"):
                raise
            head = load_tensor(model_dir, r"(^|\.)embed_tokens\.weight$")
        self.head = head.to(self.device).float()
        self.eps = float(arch.get("rms_norm_eps") or 1e-6)
        # Gemma-family norms scale by (1 + w).
        self.offset = 1.0 if str(arch.get("model_type", "")).startswith("gemma") else 0.0

    def predict(self, h_final):
        import torch

        # no autograd graph, locally: the probe also runs inside training (extract.mode
        # online), where gradients must stay on
        with torch.no_grad():
            x = h_final.to(self.device).float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return (x * (self.norm_w + self.offset)) @ self.head.T

    def agreement(
        self, h_final, input_ids: list[int], loss_mask: list[int], max_positions: int
    ) -> tuple[int, int]:
        """(hits, checked) over positions p whose next token p+1 is a completion token."""
        import torch

        positions = probe_positions(input_ids, loss_mask, max_positions)
        if not positions:
            return 0, 0
        rows = h_final[torch.tensor(positions)]
        (hits,) = self.agreement_batch([(rows, [input_ids[p + 1] for p in positions])])
        return hits, len(positions)

    def agreement_batch(self, samples: list, rows_per_call: int = 512) -> list[int]:
        """Hits per sample of ``samples``, each (final hidden states at its probed positions
        [n, hidden], the tokens that follow them): one norm and lm_head product for the rows
        of many samples, in chunks of ``rows_per_call`` rows (their logits are what takes the
        memory: rows x vocabulary floats)."""
        import torch

        sizes = [len(t) for _, t in samples]
        if not sum(sizes):
            return [0] * len(samples)
        rows = torch.cat([r.reshape(len(t), -1) for (r, t) in samples if len(t)])
        target = torch.tensor([x for _, t in samples for x in t])
        pred = torch.cat(
            [
                self.predict(rows[i : i + rows_per_call]).argmax(-1).cpu()
                for i in range(0, len(rows), rows_per_call)
            ]
        )
        hit = (pred == target).tolist()
        out, at = [], 0
        for n in sizes:
            out.append(sum(hit[at : at + n]))
            at += n
        return out


def decoder_layers(model):
    """The decoder layers of a causal LM (``model.model.layers``) or of the language model
    inside a multimodal wrapper (Kimi-K2.5's ``model.model.language_model.layers``)."""
    inner = model.model
    return inner.layers if hasattr(inner, "layers") else inner.language_model.layers


def reference_hidden_states(model, input_ids: list[int], layer_ids: list[int]):
    """Hidden states as vLLM captures them, from a transformers model: aux layer i is HF's
    ``hidden_states[i]``; the final id (= num layers) is the last decoder layer's output
    *before* the final norm (HF's last hidden_states entry is after it)."""
    import torch

    captured = {}
    layers = decoder_layers(model)
    hook = layers[-1].register_forward_hook(
        lambda mod, args, out: captured.__setitem__(
            "last", out[0] if isinstance(out, tuple) else out
        )
    )
    try:
        with torch.no_grad():
            out = model(torch.tensor([input_ids], device=model.device), output_hidden_states=True)
    finally:
        hook.remove()
    n = len(layers)
    return [captured["last"][0] if lid == n else out.hidden_states[lid][0] for lid in layer_ids]


def wrapped_language_model(model_dir: str | Path, text_config, trust_remote_code: bool):
    """The language model of a multimodal wrapper (Kimi-K2.5: a DeepSeek-V3 under
    ``language_model.``), built from its text config with the checkpoint's text weights:
    what vLLM serves with --language-model-only, without the vision tower, whose layout
    transformers' wrapper class need not share with the checkpoint."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    weights_args = packed_weight_args(model_dir, getattr(text_config, "quantization_config", None))
    prefix = "language_model."
    state = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        state |= {
            k[len(prefix) :]: v for k, v in load_file(str(path)).items() if k.startswith(prefix)
        }
    if weights_args is not None:
        state = dequantized(state, weights_args)
    model = AutoModelForCausalLM.from_config(
        text_config, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    state = fuse_experts(state, model.state_dict().keys())
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False
    )
    tied = {"lm_head.weight"} if getattr(text_config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"{model_dir}: the language model's weights do not fit its text config "
            f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    return model


def packed_weight_args(model_dir, quantization_config) -> dict | None:
    """The weight arguments of a compressed-tensors ``pack-quantized`` checkpoint with one
    weight-only group (Kimi-K2.5's W4A16 experts), None when unquantized; any other
    quantization is refused."""
    if not quantization_config:
        return None
    q = quantization_config if isinstance(quantization_config, dict) else vars(quantization_config)
    groups = list((q.get("config_groups") or {}).values())
    if (
        q.get("quant_method") != "compressed-tensors"
        or q.get("format") != "pack-quantized"
        or len(groups) != 1
        or groups[0].get("input_activations")
    ):
        raise ValueError(
            f"{model_dir}: the reference forward reads unquantized weights and compressed-tensors "
            f"pack-quantized weight-only ones, not {q.get('quant_method')}/{q.get('format')}: "
            "set extract.reference_forward: never, or point target.path at an unquantized copy"
        )
    return groups[0]["weights"]


def dequantized(state: dict, weights_args: dict) -> dict:
    """``state`` with every packed Linear (``weight_packed``, ``weight_scale``,
    ``weight_shape``) replaced by the float32 ``weight`` the quantized kernel computes with:
    the reference then checks the served kernels, not the quantization."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights_args))
    suffixes = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")
    out = {k: v for k, v in state.items() if not k.endswith(suffixes)}
    for key in state:
        if key.endswith("weight_packed"):
            base = key[: -len("weight_packed")]
            parts = {s: state[base + s] for s in suffixes if base + s in state}
            out[base + "weight"] = unpack_linear(parts, scheme)
    return out


def unpack_linear(parts: dict, scheme):
    """The float32 weight [out, in] of one packed Linear (``weight_packed``, ``weight_scale``,
    ``weight_shape``) under a compressed-tensors ``scheme``."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    state = {**parts, "weight_scale": parts["weight_scale"].to(torch.float32)}
    return PackedQuantizationCompressor.decompress(state, scheme)["weight"]


def fuse_experts(state: dict, wanted) -> dict:
    """Per-expert checkpoint weights (``experts.N.{gate,up,down}_proj.weight``, as Kimi and
    DeepSeek ship them) stacked into the fused ``experts.gate_up_proj`` / ``experts.down_proj``
    of a transformers model that has those (what its from_pretrained converts on loading)."""
    import torch

    pattern = re.compile(r"(.+\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    per: dict[str, dict[int, dict[str, Any]]] = {}
    out = {}
    for key, value in state.items():
        m = pattern.match(key)
        if m and f"{m[1]}.gate_up_proj" in wanted:
            per.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = value
        else:
            out[key] = value
    for prefix, experts in per.items():
        order = sorted(experts)
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate"], experts[e]["up"]]) for e in order]
        )
        out[f"{prefix}.down_proj"] = torch.stack([experts[e]["down"] for e in order])
    return out


def model_fits(model_dir: str | Path, fraction_of_ram: float = 0.4) -> bool:
    """Whether a float32 copy of the model fits comfortably in this machine's memory."""
    import os

    weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    dtype_factor = 2.0  # stored weights are usually 16-bit; the reference runs in float32
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return weights * dtype_factor < fraction_of_ram * ram


def reference_model(model_dir: str | Path, trust_remote_code: bool = False):
    """The float32 transformers model the reference check runs: on the GPUs when the job has
    them (transformers spreads the layers over them), else on the CPU; a multimodal wrapper's
    language model alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {"device_map": "auto"} if torch.cuda.is_available() else {}
    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    if hasattr(config, "text_config"):
        model = wrapped_language_model(model_dir, config.text_config, trust_remote_code)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, trust_remote_code=trust_remote_code, **kwargs
        )
    return model.eval()


def reference_errors(
    model_dir: str | Path,
    samples: list[tuple[list[int], Any]],
    layer_ids: list[int],
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Max relative error (Frobenius over each row) per layer between extracted and reference
    hidden states. ``samples`` are (input_ids, hidden [seq, layers, hidden]).

    The reference (:func:`reference_model`) runs once the extraction server has stopped."""
    model = reference_model(model_dir, trust_remote_code)
    per_layer = {str(layer): 0.0 for layer in layer_ids}
    for ids, hidden in samples:
        refs = reference_hidden_states(model, ids, layer_ids)
        for j, (lid, ref) in enumerate(zip(layer_ids, refs, strict=True)):
            ref = ref.float().cpu()
            got = hidden[:, j].float().cpu()
            err = float((got - ref).norm() / ref.norm().clamp_min(1e-12))
            per_layer[str(lid)] = max(per_layer[str(lid)], err)
    del model
    return {
        "rows": len(samples),
        "max_rel_error_per_layer": per_layer,
        "max_rel_error": max(per_layer.values()) if per_layer else None,
    }

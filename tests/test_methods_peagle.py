"""P-EAGLE, the method added as one module (eagle3_pipeline.methods.peagle): its config
section, its trainer fields, and a tiny drafter trained for real on the CPU whose config.json
vLLM's own parser turns into an EAGLE-3 drafter with parallel drafting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import methods, train
from eagle3_pipeline.methods import consistency
from eagle3_pipeline.target.stage import load_info

from train_fixtures import TRAIN_CFG, run_kwargs, trainer_args_of


def peagle_job(gpus: int = 0, **own) -> dict:
    """The peagle train job's config (config.train_job_section) of a config that trains it."""
    cfg = cfglib.validate({"train": {"methods": ["peagle"], "gpus": gpus, "peagle": own}})
    return cfglib.drafter_train_config(cfg, "peagle")


def test_its_keys_are_its_own_and_its_k_is_bounded_by_its_depths():
    cfg = peagle_job(num_depths=3)
    assert cfg["method"] == "peagle" and cfg["num_depths"] == 3
    assert "ttt_steps" not in cfg and "block_size" not in cfg  # other methods' keys
    eagle3 = cfglib.validate({"train": {"peagle": {"num_depths": 3}}})
    # a peagle key does not reach EAGLE-3's training
    assert "num_depths" not in cfglib.result_config(eagle3, "train", method="eagle3")["train"]
    with pytest.raises(cfglib.ConfigError, match=r"peagle drafts at most num_depths = 3 tokens"):
        cfglib.validate(
            {
                "train": {"methods": ["peagle"], "peagle": {"num_depths": 3}},
                "bench": {"num_speculative_tokens": [5]},
            }
        )
    with pytest.raises(cfglib.ConfigError, match=r"`train\.peagle\.num_depth`: unknown key"):
        cfglib.validate({"train": {"peagle": {"num_depth": 3}}})


def test_trainer_fields():
    args = trainer_args_of(peagle_job(mask_token_id=7), draft_vocab_size=8)[0]
    assert args["speculator_type"] == "peagle" and args["draft_arch"] == "llama"
    assert args["num_depths"] == 4  # auto on the CPU
    assert args["norm_output"] is False  # vLLM's P-EAGLE model has no output norm
    assert args["mask_token_id"] == 7 and "max_anchors" not in args
    assert (args["down_sample_ratio"], args["down_sample_ratio_min"]) == (0.7, 0.2)
    assert "ttt_steps" not in args and "block_size" not in args
    gpu = trainer_args_of(peagle_job(gpus=1, max_anchors=64), draft_vocab_size=8, cpus=16)[0]
    assert gpu["num_depths"] == 8 and gpu["max_anchors"] == 64


def test_served_as_eagle3_with_parallel_drafting():
    own = methods.get("peagle")
    assert own.speculative_config() == {"method": "eagle3", "parallel_drafting": True}
    assert own.predicted_acceptance_length({"position_acc": [0.5, 0.5]}, 2) == 1.75
    assert own.predicted_acceptance_length({"position_acc": [0.5]}, 2) is None


PEAGLE_CFG = {
    **TRAIN_CFG,
    "method": "peagle",
    "total_seq_len": 256,
    "num_depths": 3,
    "down_sample_ratio": 0.7,
    "down_sample_ratio_min": 0.2,
    "max_anchors": 32,
    "mask_token_id": None,
    "norm_before_fc": False,
}


@pytest.mark.training
def test_peagle_trains_on_the_cpu_and_exports_what_vllm_reads(tmp_path, target_json, fixture_data):
    kwargs = {**run_kwargs(tmp_path, target_json, fixture_data), "cfg": dict(PEAGLE_CFG)}
    m = train.run(**kwargs)
    assert m["method"] == "peagle" and m["config"]["positions"] == 3
    assert m["best_by"] == "validation lowest loss"
    for e in m["epochs"]:
        assert len(e["val"]["position_acc"]) == 3
    assert m["prediction"]["method"] == "peagle"
    assert m["consistency"]["ok"], m["consistency"]["problems"]
    assert m["consistency"]["checks"]["is_peagle"]
    raw = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert raw["speculators_model_type"] == "peagle"
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert isinstance(raw["mask_token_id"], int)
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    # vLLM's parser of speculators checkpoints: an EAGLE-3 drafter with parallel drafting
    from vllm.transformers_utils.configs.speculators import base

    vcfg = base.SpeculatorsConfig.extract_transformers_pre_trained_config(raw)
    assert vcfg["architectures"] == ["PeagleLlamaForCausalLM"]
    assert vcfg["pard_token"] == raw["mask_token_id"]
    spec = base.SpeculatorsConfig.extract_vllm_speculative_config(raw)
    assert spec == {"method": "eagle3", "parallel_drafting": True, "num_speculative_tokens": 3}
    # a drafter without its mask token is caught structurally
    raw["mask_token_id"] = None
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(raw))
    manifest = json.loads(Path(fixture_data["manifest"]).read_text())
    check = consistency.check(tmp_path / "drafter", manifest, load_info(target_json))
    assert not check["checks"]["mask_token_set"]

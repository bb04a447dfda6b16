"""A real, throw-away Slurm cluster on localhost, for tests.

    with LocalSlurm(nodes=1, gpus_per_node=8) as slurm:   # or slurm.start(tmpdir) / slurm.stop()
        subprocess.run(["sbatch", "--gpus=1", "--wrap", "true"], env=slurm.environ())

Everything runs as root from the Debian 12 packages (Slurm 22.05, MUNGE, MariaDB), started
directly (no systemd) with every file in a temporary directory: config, state, logs, database.
Nothing under /etc is read or written except by apt-get when the packages are missing.
Only the Python standard library is used.

Pieces and why they are needed:
  munged      Slurm authenticates every RPC with MUNGE; a private munged with its own key and
              socket (named in slurm.conf: AuthInfo / AccountingStoragePass).
  mariadbd    slurmdbd stores accounting in MySQL/MariaDB; without it `sacct` answers
              "Slurm accounting storage is disabled" and snakemake-executor-plugin-slurm, which
              polls job states with `sacct` and validates the account with `sacctmgr`, cannot
              follow its jobs. A private server on a free 127.0.0.1 port.
  slurmdbd    accounting daemon (sacct, sacctmgr).
  slurmctld   controller.
  slurmd      one per node. N nodes are N slurmd processes on this machine (`slurmd -N name`,
              each with its own Port), which Debian's build supports.

GPUs: no hardware is needed. gres.conf names character devices that this module creates
(mknod, major 195 = the NVIDIA driver's, minor = index) so slurmd reports gpu:N; a GPU gres
without File= is ignored by slurmd ("gres/gpu count reported lower than configured (0 < N)").
Jobs get CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS as on a real GPU node.

CPUs/memory: SlurmdParameters=config_overrides makes slurmd accept the configured CPUs and
RealMemory even when the machine has fewer, so a 2-core VM can pose as an 8-GPU, 128-CPU node.
No cgroups (proctrack/linuxproc, task/none): nothing is bound or enforced.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# binary -> Debian 12 package, to decide whether apt-get is needed at all; slurmdbd and
# mariadb-server only for accounting.
_BINARIES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "munged": "munge",
}
_ACCOUNTING_BINARIES = {
    "slurmdbd": "slurmdbd",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
}
# Searched in addition to PATH: daemons live in /usr/sbin, which a non-login PATH may lack.
_SBIN = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]

# Client commands that get a wrapper in <dir>/bin (see _write_client_wrappers).
_CLIENTS = [
    "sacct",
    "sacctmgr",
    "salloc",
    "sattach",
    "sbatch",
    "sbcast",
    "scancel",
    "scontrol",
    "sdiag",
    "sinfo",
    "sprio",
    "squeue",
    "sreport",
    "srun",
    "sshare",
    "sstat",
    "strigger",
]

# Environment variables that would leak an outer allocation or user defaults into the
# cluster's clients (e.g. tests run inside a Slurm job, SBATCH_ACCOUNT set by a site profile).
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SACCT_", "SINFO_")


class LocalSlurmError(RuntimeError):
    pass


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))


def _free_port() -> int:
    # The port is released again before the daemon binds it: a small race, fine for tests.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"  ({path}: missing)"
    return "\n".join(f"  {line}" for line in text[-lines:]) or f"  ({path}: empty)"


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the daemon when the process that started it dies (PR_SET_PDEATHSIG),
    so a killed pytest does not leave a cluster behind. Note: tied to the starting *thread*."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def apt_install(missing: list[str], timeout: float = 900) -> None:
    """apt-get install the packages ``missing`` (root and a Debian/Ubuntu apt needed)."""
    if os.geteuid() != 0:
        raise LocalSlurmError(f"packages {missing} are missing and installing them needs root")
    if not shutil.which("apt-get"):
        raise LocalSlurmError(f"packages {missing} are missing and there is no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Without systemd, package scripts start munge/mariadb/slurm through invoke-rc.d unless a
    # policy-rc.d forbids it: add one for the install (Docker images usually have one).
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# added by the tests during apt-get\nexit 101\n")
        policy.chmod(0o755)
        added_policy = True
    try:
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
        subprocess.run([*apt, "update"], env=env, check=False, capture_output=True, timeout=timeout)
        proc = subprocess.run(
            [*apt, "install", "-y", "--no-install-recommends", *missing],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise LocalSlurmError(
                f"apt-get install {' '.join(missing)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)


def ensure_installed(accounting: bool = True, timeout: float = 900) -> float:
    """apt-get install the packages whose binaries are missing; returns the seconds it took
    (0.0 when nothing was missing). Idempotent; needs root and a Debian/Ubuntu apt."""
    wanted = dict(_BINARIES)
    if accounting:
        wanted.update(_ACCOUNTING_BINARIES)
    missing = sorted({pkg for binary, pkg in wanted.items() if not _which(binary)})
    if not missing:
        return 0.0
    t0 = time.monotonic()
    apt_install(missing, timeout)
    return time.monotonic() - t0


class LocalSlurm:
    """A single-machine Slurm cluster with accounting, for a pytest session fixture.

    Args:
        nodes: number of Slurm nodes (one slurmd each, all on this machine).
        gpus_per_node: fake GPUs per node (gres gpu), 0 for none.
        cpus_per_node / mem_mb_per_node: what each node declares; default the machine's CPUs
            and half its memory. May exceed the hardware (config_overrides).
        node_names: default: the short hostname for one node (as on a real cluster); for two
            nodes the hostname and "localhost", names that resolve to this machine, so job
            scripts may use a node name as an address (torchrun's MASTER_ADDR); node1..nodeN
            for more (those do not resolve: use 127.0.0.1, see node_addr).
        partition, account: created in slurm.conf / sacctmgr; the current user gets the
            account as default (the slurm plugin checks it with `sacctmgr`). The defaults
            "gpu" and "testacct"; account="my_account" matches the project's slurm profile.
        extra_partitions: more partitions over the same nodes (e.g. "cpu").
        accounting: slurmdbd + MariaDB (needed for sacct). False: no database, sacct fails,
            only squeue knows jobs (for up to MinJobAge after they end).
        start_timeout: seconds to wait for each daemon / for the nodes to be idle.
        install: apt-get install missing packages on start().
        export_env: set SLURM_CONF in os.environ while the cluster is up (restored on stop).
        debug: Slurm daemons' log level (info, verbose, debug, debug2, ...).
    """

    def __init__(
        self,
        nodes: int = 1,
        gpus_per_node: int = 8,
        cpus_per_node: int | None = None,
        mem_mb_per_node: int | None = None,
        node_names: list[str] | None = None,
        partition: str = "gpu",
        extra_partitions: tuple[str, ...] = (),
        account: str = "testacct",
        cluster_name: str = "localtest",
        accounting: bool = True,
        start_timeout: float = 60,
        install: bool = True,
        export_env: bool = False,
        debug: str = "info",
    ):
        self.hostname = socket.gethostname().split(".")[0]  # what slurmd calls this machine
        if node_names is None:
            if nodes == 1:
                node_names = [self.hostname]
            elif nodes == 2 and self.hostname != "localhost":
                # both resolve to this machine without touching /etc/hosts, so scripts may use
                # `scontrol show hostnames $SLURM_JOB_NODELIST | head -1` as MASTER_ADDR
                node_names = [self.hostname, "localhost"]
            else:
                node_names = [f"node{i + 1}" for i in range(nodes)]
        if len(node_names) != nodes or len(set(node_names)) != nodes:
            raise ValueError(f"need {nodes} distinct node names, got {node_names}")
        self.node_names = list(node_names)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node or os.cpu_count() or 1
        self.mem_mb_per_node = mem_mb_per_node or max(
            1024, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2
        )
        self.partition = partition
        self.extra_partitions = tuple(extra_partitions)
        self.account = account
        self.cluster_name = cluster_name
        self.accounting = accounting
        self.start_timeout = start_timeout
        self.install = install
        self.export_env = export_env
        self.debug = debug
        self.user = getpass.getuser()

        self.dir: Path | None = None  # configs, logs, state, database
        self.run_dir: Path | None = None  # sockets and slurmd spool: short, world-traversable
        self.conf_dir: Path | None = None
        self.log_dir: Path | None = None
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self._procs: list[tuple[str, subprocess.Popen, Path]] = []  # (name, process, log)
        self._old_slurm_conf: str | None = None
        self._own_dir = False
        self._started = False

    # ---- public interface ---------------------------------------------------------------

    @property
    def slurm_conf(self) -> Path:
        assert self.conf_dir is not None, "not started"
        return self.conf_dir / "slurm.conf"

    @property
    def bin_dir(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "bin"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: SLURM_CONF (the MUNGE socket is named in slurm.conf),
        and bin_dir first in PATH (wrappers that set SLURM_CONF, for callers that strip
        SLURM_* variables - snakemake-executor-plugin-slurm-jobstep does before `srun`)."""
        return {
            "SLURM_CONF": str(self.slurm_conf),
            "PATH": os.pathsep.join([str(self.bin_dir), os.environ.get("PATH", "")]),
        }

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A full environment for clients (sbatch, snakemake, ...): `base` (os.environ) without
        inherited Slurm job/client variables, plus SLURM_CONF and the wrappers' PATH."""
        base = dict(os.environ if base is None else base)
        clean = {k: v for k, v in base.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}
        clean["SLURM_CONF"] = str(self.slurm_conf)
        clean["PATH"] = os.pathsep.join([str(self.bin_dir), base.get("PATH", os.defpath)])
        return clean

    node_addr = "127.0.0.1"  # every node's NodeAddr

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.node_names)

    def start(self, tmpdir: str | os.PathLike | None = None) -> LocalSlurm:
        """Write the configs into `tmpdir` (a fresh temp dir if None), start the daemons and
        wait until every node is idle. Raises LocalSlurmError with the daemons' log tails."""
        if self._started:
            raise LocalSlurmError("already started")
        if os.geteuid() != 0:
            raise LocalSlurmError("LocalSlurm runs the Slurm daemons as root: run as root")
        t_all = time.monotonic()
        if self.install:
            self.timings["install"] = ensure_installed(self.accounting)
        self._own_dir = tmpdir is None
        self.dir = Path(tmpdir or tempfile.mkdtemp(prefix="local-slurm-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        # munged insists that every directory above its socket is executable by all (a pytest
        # tmp dir under /tmp/pytest-of-root, mode 0700, is not), and Unix socket paths (slurmd's
        # step sockets in its spool dir) are limited to 108 bytes: keep those in a short dir.
        self.run_dir = Path(tempfile.mkdtemp(prefix="lslurm-", dir="/tmp"))
        self.run_dir.chmod(0o755)
        self.conf_dir, self.log_dir = self.dir / "etc", self.dir / "log"
        for d in (self.conf_dir, self.log_dir, self.dir / "state", self.dir / "munge"):
            d.mkdir(parents=True, exist_ok=True)
        self._started = True
        try:
            self._write_configs()
            self._timed("munged", self._start_munge)
            if self.accounting:
                self._timed("mariadb", self._start_mariadb)
                self._timed("slurmdbd", self._start_slurmdbd)
            self._timed("slurmctld", self._start_slurmctld)
            self._timed("slurmd", self._start_slurmds)
        except BaseException:
            self.stop(remove_dir=False)  # keep the logs the error message points to
            raise
        if self.export_env:
            self._old_slurm_conf = os.environ.get("SLURM_CONF")
            os.environ["SLURM_CONF"] = str(self.slurm_conf)
        self.timings["start_total"] = time.monotonic() - t_all
        return self

    def stop(self, cancel_timeout: float = 30, remove_dir: bool | None = None) -> None:
        """Cancel all jobs, stop the daemons (newest first), kill what the cluster left, remove
        the socket dir. remove_dir: also remove the config/log dir; default only when start()
        made it itself (tmpdir None)."""
        if not self._started:
            return
        if remove_dir is None:
            remove_dir = self._own_dir
        try:
            if self._alive("slurmctld") and self._alive("slurmd-"):
                self._cancel_all(cancel_timeout)
        finally:
            for _, proc, _ in reversed(self._procs):
                self._terminate(proc)
            self._procs.clear()
            self._kill_leftover_job_processes()
            if self.export_env:
                if self._old_slurm_conf is None:
                    os.environ.pop("SLURM_CONF", None)
                else:
                    os.environ["SLURM_CONF"] = self._old_slurm_conf
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            if remove_dir and self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
            self._started = False

    def __enter__(self) -> LocalSlurm:
        return self if self._started else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # Small helpers for tests -----------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 60, **kw):
        """Run a Slurm client command against this cluster, output captured as text."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        proc = subprocess.run(list(args), env=self.environ(), timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise LocalSlurmError(
                f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str, cwd: str | os.PathLike | None = None) -> str:
        """Submit; returns the job id. Adds partition and account unless given."""
        extra = []
        if not any(a.startswith(("-p", "--partition")) for a in args):
            extra += ["-p", self.partition]
        if self.accounting and not any(a.startswith(("-A", "--account")) for a in args):
            extra += ["-A", self.account]
        out = self.run("sbatch", "--parsable", *extra, *args, cwd=cwd or self.dir).stdout
        return out.strip().split(";")[0]

    ACCOUNTING_FIELDS = (
        "JobIDRaw",
        "State",
        "NNodes",
        "AllocCPUS",
        "ReqMem",
        "Elapsed",
        "Timelimit",
        "AllocTRES",
        "WorkDir",
        "Comment",
    )

    def accounted_jobs(self, workdir: str | os.PathLike | None = None) -> list[dict[str, str]]:
        """sacct's record of every job (allocations, not steps) of the last day, as dicts of
        ACCOUNTING_FIELDS; with ``workdir``, only the jobs submitted from there."""
        rows = self.run(
            "sacct",
            "-X",
            "--allusers",
            "--noheader",
            "--parsable2",
            "--starttime=now-1day",
            f"--format={','.join(self.ACCOUNTING_FIELDS)}",
        ).stdout
        jobs = [
            dict(zip(self.ACCOUNTING_FIELDS, r.split("|"), strict=True)) for r in rows.splitlines()
        ]
        if workdir is not None:
            jobs = [j for j in jobs if j["WorkDir"] == str(Path(workdir).resolve())]
        return jobs

    def job_state(self, job_id: str) -> str | None:
        """State of a job as sacct reports it ("CANCELLED by 0" -> "CANCELLED"); None while
        slurmdbd does not know it yet. Without accounting: squeue's state."""
        if self.accounting:
            out = self.run(
                "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State", check=False
            ).stdout.split()
        else:
            out = self.run(
                "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False
            ).stdout.split()
        return out[0] if out else None

    def wait_job(
        self,
        job_id: str,
        states=(
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "OUT_OF_MEMORY",
            "NODE_FAIL",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
        ),
        timeout: float = 180,
    ) -> str:
        """Wait until the job is in one of `states` (default: any final state); returns it."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise LocalSlurmError(f"job {job_id} still {state} after {timeout}s; wanted {states}")

    def wait_queue_empty(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
                return
            time.sleep(0.5)
        raise LocalSlurmError(
            f"jobs still queued after {timeout}s:\n" + self.run("squeue", check=False).stdout
        )

    def log_tails(self, lines: int = 25) -> str:
        """The end of every daemon's log, for error messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*")) if self.log_dir else []:
            parts.append(f"--- {log}\n{_tail(log, lines)}")
        return "\n".join(parts)

    # ---- configuration ------------------------------------------------------------------

    def _write_configs(self) -> None:
        d, r, c = self.dir, self.run_dir, self.conf_dir
        self.ports = {"slurmctld": _free_port(), "slurmdbd": _free_port(), "mysql": _free_port()}
        for n in self.node_names:
            self.ports[f"slurmd-{n}"] = _free_port()
        self.munge_socket = r / "munge" / "munge.socket"
        self.munge_socket.parent.mkdir(mode=0o755)
        (r / "spool").mkdir()
        for n in self.node_names:
            (r / "spool" / n).mkdir()

        # MUNGE key: 1024 random bits, readable by its owner (root) only.
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)

        # Fake GPU device files, one set per node (so each node has its own "devices").
        gres_lines = ["AutoDetect=off"]
        if self.gpus_per_node:
            dev = r / "dev"
            dev.mkdir()
            for i, n in enumerate(self.node_names):
                first = i * self.gpus_per_node
                for k in range(first, first + self.gpus_per_node):
                    path = dev / f"nvidia{k}"
                    try:
                        os.mknod(path, 0o600 | 0o020000, os.makedev(195, k))  # S_IFCHR
                    except PermissionError:
                        # no CAP_MKNOD (some containers): a symlink to a char device works too
                        path.symlink_to("/dev/null")
                last = first + self.gpus_per_node - 1
                files = f"nvidia{first}" if first == last else f"nvidia[{first}-{last}]"
                gres_lines.append(f"NodeName={n} Name=gpu File={dev / files}")
        (c / "gres.conf").write_text("\n".join(gres_lines) + "\n")

        multi = len(self.node_names) > 1 or self.node_names[0] != self.hostname
        node_lines = []
        for n in self.node_names:
            # explicit one-socket topology: with CPUs= alone Slurm assumes one core per socket
            line = (
                f"NodeName={n} NodeAddr=127.0.0.1 CPUs={self.cpus_per_node} Sockets=1 "
                f"CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 "
                f"RealMemory={self.mem_mb_per_node} State=UNKNOWN"
            )
            if multi:
                # several slurmd on one host: each its own name (slurmd -N) and port
                line += f" NodeHostname={self.hostname} Port={self.ports[f'slurmd-{n}']}"
            if self.gpus_per_node:
                line += f" Gres=gpu:{self.gpus_per_node}"
            node_lines.append(line)

        accounting = (
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['slurmdbd']}",
                # the MUNGE socket for slurmdbd connections (AuthInfo does not cover them)
                f"AccountingStoragePass={self.munge_socket}",
                "AccountingStorageTRES=gres/gpu",  # sacct's AllocTRES shows gres/gpu=N
                # sacct's Comment: snakemake-executor-plugin-slurm names the rule there
                "AccountingStoreFlags=job_comment",
                "JobAcctGatherType=jobacct_gather/linux",
            ]
            if self.accounting
            else [
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
            ]
        )
        slurm_conf = [
            f"ClusterName={self.cluster_name}",
            # must name this host (slurmctld refuses to run elsewhere); address 127.0.0.1
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            # default slurmd port; nodes of a multi-node setup override it with Port=
            f"SlurmdPort={self.ports[f'slurmd-{self.node_names[0]}']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            f"SlurmctldDebug={self.debug}",
            f"SlurmdDebug={self.debug}",
            # no cgroups: works in containers/VMs whatever their cgroup setup; nothing enforced
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",  # needed for --gpus / --cpus-per-gpu
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            "GresTypes=gpu",
            # trust the configured CPUs/RealMemory/Gres even if the hardware has less
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            # jobs without a memory request get a share, not the whole node (which would run
            # them one at a time)
            f"DefMemPerCPU={max(1, self.mem_mb_per_node // self.cpus_per_node)}",
            # quick cancellation / timeout: SIGKILL 5 s after SIGTERM, no grace over time limit
            "KillWait=5",
            "OverTimeLimit=0",
            "InactiveLimit=0",
            "MailProg=/bin/true",  # the default /usr/bin/mail is absent ("MailProg is invalid")
            *accounting,
            *node_lines,
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            *(
                f"PartitionName={p} Nodes=ALL MaxTime=INFINITE State=UP"
                for p in self.extra_partitions
            ),
        ]
        (c / "slurm.conf").write_text("\n".join(slurm_conf) + "\n")

        self._write_client_wrappers()

        if self.accounting:
            dbd = c / "slurmdbd.conf"  # found next to slurm.conf (SLURM_CONF's directory)
            dbd.write_text(
                "\n".join(
                    [
                        "AuthType=auth/munge",
                        f"AuthInfo=socket={self.munge_socket}",
                        "DbdHost=localhost",
                        "DbdAddr=127.0.0.1",
                        f"DbdPort={self.ports['slurmdbd']}",
                        "SlurmUser=root",
                        f"DebugLevel={self.debug}",
                        f"LogFile={self.log_dir / 'slurmdbd.log'}",
                        f"PidFile={r / 'slurmdbd.pid'}",
                        "StorageType=accounting_storage/mysql",
                        "StorageHost=127.0.0.1",  # TCP: the client library ignores our socket path
                        f"StoragePort={self.ports['mysql']}",
                        "StorageUser=root",  # root@127.0.0.1 without password (install-db "normal")
                        "StorageLoc=slurm_acct_db",
                    ]
                )
                + "\n"
            )
            dbd.chmod(0o600)  # slurmdbd refuses a config others can read

    def _write_client_wrappers(self) -> None:
        """<dir>/bin/<client> runs the real client with SLURM_CONF set to this cluster.
        Needed because snakemake-executor-plugin-slurm-jobstep (0.6.1) removes every SLURM_*
        variable but the job ids before it runs `srun` inside the job; srun then looks for
        /etc/slurm/slurm.conf, then configless DNS SRV records, and fails:
        "srun: fatal: Could not establish a configuration source". The alternative would be
        writing /etc/slurm/slurm.conf, which is global."""
        self.bin_dir.mkdir(exist_ok=True)
        for name in _CLIENTS:
            real = _which(name)
            if real is None:
                continue
            wrapper = self.bin_dir / name
            wrapper.write_text(
                f'#!/bin/sh\nexport SLURM_CONF="{self.slurm_conf}"\nexec "{real}" "$@"\n'
            )
            wrapper.chmod(0o755)

    # ---- daemons ------------------------------------------------------------------------

    def _daemon_env(self) -> dict[str, str]:
        env = self.environ()
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), *_SBIN])
        return env

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """Start a daemon in the foreground as our child: we know its pid, see it die early,
        and its stdout/stderr land in log/<name>.out."""
        out = self.log_dir / f"{name}.out"
        binary = _which(argv[0])
        if binary is None:
            raise LocalSlurmError(f"{argv[0]} not found (install={self.install})")
        with open(out, "ab") as fh:
            proc = subprocess.Popen(
                [binary, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                cwd=self.dir,
                preexec_fn=_die_with_parent,
            )
        self._procs.append((name, proc, out))
        return proc

    def _wait(self, what: str, ready, procs: list[str], timeout: float | None = None) -> None:
        """Poll `ready()` until true; fail early when one of `procs` died."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            try:
                if ready():
                    return
            except LocalSlurmError:
                raise
            except Exception:  # a probe failing just means "not yet"
                pass
            for name, proc, _ in self._procs:
                if name in procs and proc.poll() is not None:
                    self._fail(f"{name} exited with {proc.returncode} while waiting for {what}")
            if time.monotonic() > deadline:
                self._fail(f"timed out after {timeout or self.start_timeout}s waiting for {what}")
            time.sleep(0.2)

    def _fail(self, msg: str):
        raise LocalSlurmError(f"{msg}\nconfig and logs in {self.dir}\n{self.log_tails()}")

    def _timed(self, name: str, fn) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - t0

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={m / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.run_dir / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
        )
        munge, unmunge = _which("munge"), _which("unmunge")

        def ready():
            cred = subprocess.run(
                [munge, "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=5
            )
            return (
                cred.returncode == 0
                and subprocess.run(
                    [unmunge, "-S", str(self.munge_socket)],
                    input=cred.stdout,
                    capture_output=True,
                    timeout=5,
                ).returncode
                == 0
            )

        self._wait("munged", ready, ["munged"])

    def _start_mariadb(self) -> None:
        data = self.dir / "mysql"
        opts = [
            "--no-defaults",  # ignore /etc/mysql: only what is given here
            f"--datadir={data}",
            "--user=root",
            # values slurmdbd checks (it logs "Database settings not recommended" otherwise)
            "--innodb-buffer-pool-size=1024M",
            "--innodb-log-file-size=64M",
            "--innodb-lock-wait-timeout=900",
        ]
        install = subprocess.run(
            [
                _which("mariadb-install-db"),
                *opts,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            cwd=self.dir,
            timeout=self.start_timeout,
        )
        (self.log_dir / "mariadb-install-db.out").write_text(install.stdout + install.stderr)
        if install.returncode != 0:
            self._fail(f"mariadb-install-db failed ({install.returncode})")
        sock = self.run_dir / "mysqld.sock"
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                *opts,
                f"--socket={sock}",
                f"--port={self.ports['mysql']}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.run_dir / 'mysqld.pid'}",
                f"--log-error={self.log_dir / 'mariadbd.log'}",
                "--skip-log-bin",
            ],
        )
        self._wait(
            "mariadbd", lambda: sock.exists() and _port_open(self.ports["mysql"]), ["mariadbd"]
        )

    def _start_slurmdbd(self) -> None:
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(
            "slurmdbd",
            lambda: (
                self.run("sacctmgr", "-n", "list", "cluster", check=False, timeout=10).returncode
                == 0
            ),
            ["slurmdbd", "mariadbd"],
        )
        # The cluster, an account, and the current user in it: the slurm plugin runs
        # `sacctmgr -n -s list user $USER format=account` and refuses unknown accounts.
        self.run("sacctmgr", "-i", "add", "cluster", self.cluster_name)
        self.run(
            "sacctmgr",
            "-i",
            "add",
            "account",
            self.account,
            f"cluster={self.cluster_name}",
            "description=test",
            "organization=test",
        )
        self.run(
            "sacctmgr",
            "-i",
            "add",
            "user",
            self.user,
            f"account={self.account}",
            f"defaultaccount={self.account}",
            f"cluster={self.cluster_name}",
        )

    def _start_slurmctld(self) -> None:
        # -i: ignore (absent) state files; -D: foreground
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.slurm_conf)])
        self._wait(
            "slurmctld",
            lambda: self.run("scontrol", "ping", check=False, timeout=10).stdout.count("is UP") > 0,
            ["slurmctld"],
        )

    def _start_slurmds(self) -> None:
        multi = len(self.node_names) > 1 or self.node_names[0] != self.hostname
        for n in self.node_names:
            argv = ["slurmd", "-D", "-f", str(self.slurm_conf)]
            if multi:
                argv += ["-N", n]
            self._spawn(f"slurmd-{n}", argv)

        def ready():
            out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E", check=False, timeout=10).stdout
            states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
            for node, state in states.items():
                if state.split("|")[0].startswith(("inval", "drain", "fail")):
                    self._fail(f"node {node} is {state}")
            return len(states) == len(self.node_names) and all(
                s.split("|")[0] == "idle" for s in states.values()
            )

        self._wait(
            "the nodes to be idle", ready, ["slurmctld"] + [f"slurmd-{n}" for n in self.node_names]
        )

    # ---- teardown -----------------------------------------------------------------------

    def _alive(self, prefix: str) -> bool:
        return any(n.startswith(prefix) and p.poll() is None for n, p, _ in self._procs)

    def _cancel_all(self, timeout: float) -> None:
        try:
            self.run("scancel", "--full", "-u", self.user, check=False, timeout=15)
            jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=15).stdout.split()
            if jobs:
                self.run("scancel", "--full", *jobs, check=False, timeout=15)
            self.wait_queue_empty(timeout)
        except (LocalSlurmError, subprocess.TimeoutExpired):
            pass  # the daemons are stopped anyway; leftovers are killed below

    @staticmethod
    def _terminate(proc: subprocess.Popen, timeout: float = 15) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def _kill_leftover_job_processes(self) -> None:
        """SIGKILL slurmstepd and job processes of *this* cluster that survived (e.g. after a
        timed-out cancel). They are recognised by SLURM_CONF=<our slurm.conf> in their
        environment (inherited from our slurmd, resp. from the submitting client) together
        with being a slurmstepd or carrying SLURM_JOB_ID, so nothing else is touched."""
        marker = f"SLURM_CONF={self.slurm_conf}".encode()
        me = os.getpid()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == me:
                continue
            try:
                environ = (p / "environ").read_bytes().split(b"\0")
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if marker in environ and (
                comm == "slurmstepd" or any(e.startswith(b"SLURM_JOB_ID=") for e in environ)
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(p.name), signal.SIGKILL)


def ci_cluster() -> LocalSlurm:
    """The cluster the CI-sized run goes through (the tests' `slurm` fixture, and the benchmarks
    that repeat that run): two nodes of 8 GPU devices, 128 CPUs and 1 TB each, as the Slurm
    profile's jobs ask for them (nothing is enforced), with the profile's account."""
    return LocalSlurm(
        nodes=2,
        gpus_per_node=8,
        cpus_per_node=128,
        mem_mb_per_node=1_000_000,
        account="my_account",
    )

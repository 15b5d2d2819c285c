"""A real one-node Slurm for tests: slurmctld, slurmd and munged started as daemons from a private
folder, on loopback and on ports of their own, so nothing in /etc is changed and a Slurm already on
the machine is left alone. The packages (Debian's slurmctld, slurmd, slurm-client, munge) are
installed by .ci/system-deps.sh (run by .ci/run), never by a test; running slurmd needs root. The node is this
machine, as `slurmd -C` sees it (its CPUs, 90% of its memory)."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
TOOLS = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "munged"]
FINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def install() -> None:
    """A clear failure naming what is missing and how to install it. Tests install nothing: CI's
    `.ci/system-deps.sh` (run by `.ci/run`) apt-gets the packages."""
    missing = [t for t in TOOLS if _which(t) is None]
    if missing:
        pytest.fail(
            f"a real Slurm is needed and {', '.join(missing)} are missing: install them with"
            f" `sudo bash .ci/system-deps.sh` (apt-get install {' '.join(PACKAGES)}), or run the fast suite:"
            " pytest -m 'not slow'"
        )


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 4200:
            return port


@dataclass
class Slurm:
    folder: Path
    env: dict[str, str]  # SLURM_CONF: add it to the environment of every Slurm command

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(list(args), capture_output=True, text=True, env={**os.environ, **self.env}, timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {out.returncode}: {out.stderr}")
        return out.stdout

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` of a job (an array: one record per task), each as {field: value}."""
        text = self.run("scontrol", "--oneliner", "show", "job", job_id, check=False)
        return [dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line)) for line in text.splitlines() if line.strip()]

    def wait(self, *job_ids: str, timeout: float = 180) -> dict[str, dict[str, str]]:
        """Wait until every task of these jobs has ended; return each by its id (`123` or `123_4`)."""
        deadline = time.monotonic() + timeout
        while True:
            records = {}
            for job_id in job_ids:
                for r in self.jobs(job_id):
                    task = r.get("ArrayTaskId", "N/A")
                    records[r["JobId"] if task == "N/A" else f"{r['ArrayJobId']}_{task}"] = r
            states = {k: r["JobState"] for k, r in records.items()}
            # a pending array record ("123_[2-3]") stands for tasks not yet started
            if records and all(s in FINAL for s in states.values()) and not any("[" in k for k in states):
                return records
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs {job_ids} not done after {timeout}s: {states}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} (last 2,000 characters)\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.folder.glob("*.log"))
        )


def _conf(folder: Path, munge_socket: Path) -> str:
    node = subprocess.run([_which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, check=True)
    fields = dict(re.findall(r"(\w+)=(\S+)", node.stdout.splitlines()[0]))
    name = fields["NodeName"]
    memory = int(int(fields["RealMemory"]) * 0.9)
    hardware = " ".join(
        f"{k}={fields[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    )
    return f"""\
ClusterName=moaitest
SlurmctldHost={name}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
NodeName={name} NodeAddr=127.0.0.1 {hardware} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pid_files: list[Path]) -> None:
    """Stop the daemons whose pids the files hold (those this module started): SIGTERM, then SIGKILL
    to any still there after 10 s."""
    pids = []
    for pid_file in pid_files:
        with contextlib.suppress(OSError, ValueError, IndexError, ProcessLookupError):
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + 10
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def one_node_slurm() -> Iterator[Slurm]:
    """Install (if needed) and start a one-node Slurm; on exit cancel its jobs and stop its daemons."""
    if os.geteuid() != 0:
        pytest.fail("the real-Slurm test runs slurmd, which needs root (CI runs as root)")
    install()
    folder = Path(tempfile.mkdtemp(prefix="moai-slurm-"))  # short: the munge socket path has a length limit
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = folder / "munge.sock"
    conf = folder / "slurm.conf"
    slurm = Slurm(folder, {"SLURM_CONF": str(conf)})
    started: list[Path] = []
    try:
        subprocess.run(
            [
                _which("munged") or "munged",
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={folder / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
        )
        started.append(folder / "munged.pid")
        conf.write_text(_conf(folder, munge_socket))
        name = re.search(r"^NodeName=(\S+)", conf.read_text(), re.M).group(1)
        env = {**os.environ, **slurm.env}
        subprocess.run([_which("slurmctld") or "slurmctld", "-f", str(conf)], check=True, env=env)
        started.append(folder / "slurmctld.pid")
        subprocess.run([_which("slurmd") or "slurmd", "-f", str(conf), "-N", name], check=True, env=env)
        started.append(folder / "slurmd.pid")
        deadline = time.monotonic() + 30
        while slurm.run("sinfo", "--noheader", "--format=%t", check=False).strip() != "idle":
            if time.monotonic() > deadline:
                raise AssertionError(f"the Slurm node is not idle after 30 s\n{slurm.logs()}")
            time.sleep(0.3)
        yield slurm
    finally:
        if (folder / "slurmctld.pid").exists():
            slurm.run("scancel", f"--user={pwd.getpwuid(os.geteuid()).pw_name}", check=False)
            deadline = time.monotonic() + 15
            while slurm.run("squeue", "--noheader", check=False).strip() and time.monotonic() < deadline:
                time.sleep(0.3)
        _stop(started[::-1])
        shutil.rmtree(folder, ignore_errors=True)

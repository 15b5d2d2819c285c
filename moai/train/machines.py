"""Several machines, one run: what only a multi-machine run (train.num_machines > 1) needs.

- `require_shared_output_dir`: before any training, rank 0 writes a marker file with a fresh token
  into train.output_dir and every rank looks for it after a barrier. A machine that does not see it
  has an output_dir of its own (no shared storage): checkpoints, which rank 0 writes and every rank
  reads, would fail at the first save (another machine's folder does not exist) or resume from
  different steps. Every rank raises the same one-line `ConfigError` naming those machines instead.
- `Heartbeat`: the first process of each machine adds 1 to a counter of its machine in the
  rendezvous store (the TCPStore at MASTER_ADDR:MASTER_PORT that `accelerate launch`/torchrun
  already runs on machine 0) every `interval_s`, and watches the other machines' counters. A
  machine whose counter has not moved for `lost_after_s` (killed, powered off, cut off: a hung
  collective would wait for the process group's timeout, 30 minutes) is lost: the watcher prints
  the failure line `moai.launch` reads and ends its process (its machine's other ranks follow, as
  torchrun stops a machine's workers when one fails). A machine that finished says so first.
- `lost_error`: when a collective fails (a peer's sockets closed: gloo's "Connection closed by
  peer"), any rank asks the store which machines stopped beating and raises `MachineLost` naming
  them and their ranks, instead of the socket error that names only this rank.

Ranks are numbered machine by machine (torchrun's static rendezvous: machine m runs ranks
m x per_machine to (m + 1) x per_machine - 1). Costs: one store round trip per machine every
`interval_s` on one process per machine; a marker file and two collectives at the start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from moai.config import ConfigError
from moai.errors import MoaiError

log = logging.getLogger(__name__)

MARKER = ".moai-shared-storage"


class MachineLost(MoaiError, RuntimeError):
    """A machine of the run stopped answering."""


@dataclass(frozen=True)
class Topology:
    """Where this process sits, from the variables torchrun sets for each worker."""

    rank: int
    machine: int
    num_machines: int
    per_machine: int
    local_rank: int
    host: str
    port: int

    @classmethod
    def from_env(cls, num_machines: int) -> Topology:
        env = os.environ
        per = int(env.get("LOCAL_WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        return cls(
            rank=rank,
            machine=int(env.get("GROUP_RANK", str(rank // per))),
            num_machines=num_machines,
            per_machine=per,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            host=env.get("MASTER_ADDR", "127.0.0.1"),
            port=int(env.get("MASTER_PORT", "29500")),
        )


def machine_text(machine: int, per_machine: int) -> str:
    """'machine 1 (ranks 4-7)', 'machine 1 (rank 1)'."""
    first, last = machine * per_machine, (machine + 1) * per_machine - 1
    return f"machine {machine} (rank {first})" if first == last else f"machine {machine} (ranks {first}-{last})"


def require_shared_output_dir(accelerator, out: Path, top: Topology) -> None:
    """Refuse, on every rank and before any training, an output_dir that some machine does not share
    with machine 0; collective."""
    from accelerate.utils import broadcast_object_list, gather_object

    token = [uuid.uuid4().hex if accelerator.is_main_process else None]
    broadcast_object_list(token)
    marker = out / MARKER
    if accelerator.is_main_process:
        marker.write_text(str(token[0]))
    accelerator.wait_for_everyone()
    try:
        sees = marker.read_text() == token[0]
    except OSError:
        sees = False
    seen: list[Any] = gather_object([(top.machine, sees)])
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    blind = sorted({m for m, ok in seen if not ok})
    if blind:
        names = ", ".join(machine_text(m, top.per_machine) for m in blind)
        raise ConfigError(
            f"train.output_dir {out} must be on storage every machine sees (a shared filesystem mounted at the "
            f"same path): {names} does not see what machine 0 writes there, so checkpoints would break; "
            "point train.output_dir on every machine at one shared folder"
        )


class Heartbeat:
    """This machine's beat in the rendezvous store and a watch on the others' (see the module doc)."""

    def __init__(self, top: Topology, interval_s: float = 2.0, lost_after_s: float = 30.0):
        from torch.distributed import TCPStore

        self.top, self.interval_s, self.lost_after_s = top, interval_s, lost_after_s
        self.store = TCPStore(top.host, top.port, is_master=False, timeout=timedelta(seconds=10))
        self.lock = threading.Lock()  # one store client, used by the watcher and by `lost_error`
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        if top.local_rank == 0:
            self.beat()
            self.thread = threading.Thread(target=self._watch, name="moai-heartbeat", daemon=True)
            self.thread.start()

    def _key(self, what: str, machine: int) -> str:
        return f"moai/{what}/{machine}"

    def beat(self) -> None:
        with self.lock:
            self.store.add(self._key("beat", self.top.machine), 1)

    def read(self) -> dict[int, tuple[int, bool]]:
        """Each machine's (beats, finished), as the store has them now."""
        with self.lock:
            return {
                m: (self.store.add(self._key("beat", m), 0), self.store.add(self._key("done", m), 0) > 0)
                for m in range(self.top.num_machines)
            }

    def silent(self, wait_s: float) -> list[int]:
        """The machines (not finished, not this one) whose beats do not move in `wait_s`; all but this
        one when the store does not answer (machine 0, which runs it, is gone)."""
        others = [m for m in range(self.top.num_machines) if m != self.top.machine]
        try:
            before = self.read()
            time.sleep(wait_s)
            after = self.read()
        except Exception:  # the store's machine is gone: the torch error says only "connection refused"
            return [0] if self.top.machine != 0 else others
        return [m for m in others if after[m][0] == before[m][0] and not after[m][1]]

    def _watch(self) -> None:
        moved = {m: time.monotonic() for m in range(self.top.num_machines)}
        last: dict[int, int] = {}
        while not self.stopping.wait(self.interval_s):
            try:
                self.beat()
                now_counts = self.read()
            except Exception:
                # at the end of a run machine 0 closes the store as soon as it is done: this machine is
                # then past the same last barrier and stops the watch within moments
                if self.stopping.wait(2 * self.interval_s):
                    return
                self._lost([0] if self.top.machine != 0 else [], "the rendezvous store on machine 0 does not answer")
                return
            now = time.monotonic()
            for m, (count, done) in now_counts.items():
                if count != last.get(m) or done:
                    last[m], moved[m] = count, now
            lost = [m for m in moved if m != self.top.machine and now - moved[m] > self.lost_after_s]
            if lost and not self.stopping.is_set():
                self._lost(lost, f"no heartbeat for {self.lost_after_s:.0f} s")
                return

    def _lost(self, machines: list[int], why: str) -> None:
        """End this process with the failure line: a collective waiting on a lost machine would hang."""
        err = lost_message(machines, self.top, why)
        print(f"[rank {self.top.rank}] moai.train failed: MachineLost: {err}", file=sys.stderr, flush=True)
        os._exit(1)

    def lost_error(self, wait_s: float | None = None) -> MachineLost | None:
        """After a failed collective: `MachineLost` naming the machines that stopped beating, else None."""
        lost = self.silent(wait_s if wait_s is not None else 2.5 * self.interval_s)
        return MachineLost(lost_message(lost, self.top, "it stopped answering")) if lost else None

    @contextlib.contextmanager
    def watching(self):
        """Turn an error raised inside (a collective failing on a closed socket) into `MachineLost`
        when a machine stopped beating."""
        try:
            yield
        except Exception as err:
            if is_peer_error(err) and (lost := self.lost_error()) is not None:
                raise lost from err
            raise

    def finish(self) -> None:
        """This machine ends normally: say so (the others must not take it for lost), stop beating."""
        self.stopping.set()
        if self.top.local_rank == 0:
            try:
                with self.lock:
                    self.store.add(self._key("done", self.top.machine), 1)
            except Exception as err:  # machine 0 may have finished and closed the store already
                log.debug("could not mark machine %d finished: %s", self.top.machine, err)
        if self.thread is not None:
            self.thread.join(timeout=2 * self.interval_s)


# What gloo and NCCL say when a peer's process is gone (its sockets closed by the kernel).
PEER_ERRORS = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused")


def is_peer_error(err: Exception) -> bool:
    """Whether an error may come from a lost peer: a torch.distributed error or a socket error
    of the collectives; not moai's own errors (a ConfigError raised on every rank stays itself)."""
    if isinstance(err, MoaiError):
        return False
    from torch.distributed import DistError

    text = str(err).lower()
    return isinstance(err, DistError) or "gloo" in text or "nccl" in text or any(e in text for e in PEER_ERRORS)


def lost_message(machines: list[int], top: Topology, why: str) -> str:
    names = ", ".join(machine_text(m, top.per_machine) for m in machines) or "another machine"
    return (
        f"lost {names} of {top.num_machines} machines: {why} (killed, crashed or unreachable; its own log says "
        f"why if it failed); this is {machine_text(top.machine, top.per_machine)}. Rerun moai train on every "
        "machine with the same output_dir to resume from the last checkpoint"
    )

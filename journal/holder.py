"""Who holds a lease, as a process, and whether that process is provably gone.

A lease outlives its holder by design: the holder may be on another machine, and a key with
an expiry needs no one to clean up after a crash. But a crashed process on *this* machine can
be proved dead at once, and waiting out its whole lease then only delays the run (a ``digest
run`` crashed and run again at once, a Celery pool child killed by the OOM killer).

The holder records its host, the kernel's boot id, its pid namespace, its pid and the start
time of that pid (``/proc/PID/stat`` field 22, in clock ticks since boot). An acquirer that
shares host, boot and pid namespace with the holder can look the pid up: if it is absent, a
zombie, or now belongs to a process started at another time (the pid was reused), the holder
can never act again, and the lease may be taken over at once, fenced as usual. In every other
case (another host, another container, no ``/proc``, anything unreadable) nothing is proved,
and the acquirer waits for the lease to expire as it always did.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from journal import codec

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessIdentity:
    """Enough to tell, from the same host, whether a process still exists.

    Attributes:
        host: the host name.
        boot: the kernel's boot id; a pid from another boot proves nothing about this one.
        pidns: the pid namespace (``pid:[4026531836]``); pids are only comparable inside one.
        pid: the process id.
        start: the process start time in clock ticks since boot; tells a reused pid apart.
    """

    host: str
    boot: str
    pidns: str
    pid: int
    start: int

    @classmethod
    def current(cls) -> ProcessIdentity:
        """This process; fields the platform cannot tell are left empty (nothing is proved).

        Read from ``/proc`` once per process (a forked child is another one): every start of
        a run asks, and the reads cost more than the rest of an opening.
        """
        return _identity(os.getpid())

    def encode(self) -> str:
        """The form stored beside the lease."""
        return codec.dumps(
            {
                "host": self.host,
                "boot": self.boot,
                "pidns": self.pidns,
                "pid": self.pid,
                "start": self.start,
            }
        ).decode()

    @classmethod
    def decode(cls, raw: str | bytes | None) -> ProcessIdentity | None:
        """A stored identity, or None when absent or unreadable (nothing is proved)."""
        if not raw:
            return None
        try:
            data = codec.loads(raw)
            return cls(
                host=str(data["host"]),
                boot=str(data["boot"]),
                pidns=str(data["pidns"]),
                pid=int(data["pid"]),
                start=int(data["start"]),
            )
        except (codec.DecodeError, KeyError, TypeError, ValueError):
            return None

    def provably_gone(self, observer: ProcessIdentity | None = None) -> bool:
        """Whether ``observer`` (this process by default) can prove this process has ended.

        Only from the same host, boot and pid namespace; a stopped process (SIGSTOP, a paused
        VM) still exists and is never taken for dead.
        """
        me = observer or ProcessIdentity.current()
        comparable = (self.host, self.boot, self.pidns) == (me.host, me.boot, me.pidns)
        if not comparable or not self.boot or not self.pidns or self.pid <= 0 or self.start <= 0:
            return False
        if self.pid == me.pid and self.start == me.start:
            return False  # ourselves: alive by definition
        fields = _stat_fields(self.pid)
        if fields is None:
            return True  # no such pid in our namespace
        if len(fields) < 20:
            return False  # there but unreadable: nothing proved
        # A zombie cannot act; a different start time means the pid now names another process.
        return fields[0] in ("Z", "X") or int(fields[19]) != self.start


@functools.lru_cache(maxsize=1)
def _identity(pid: int) -> ProcessIdentity:
    return ProcessIdentity(
        host=socket.gethostname(),
        boot=_read(PROC / "sys" / "kernel" / "random" / "boot_id"),
        pidns=_readlink(PROC / "self" / "ns" / "pid"),
        pid=pid,
        start=_start_time(pid) or 0,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/PID/stat``; None when the pid does not exist."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return []  # exists but unreadable: nothing proved either way
    # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20:
        return None
    return int(fields[19])  # field 22: starttime

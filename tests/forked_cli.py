"""``digest`` invocations without paying the SDK's import each time.

A Python process imports the CLI once and forks a child per invocation. Each child runs
``tasks.ops.cli.entry``, the ``digest`` script, in its own process with exactly the environment
it is given, its own output files and its real exit status, a crash's 137 included: three
invocations cost about a second, not six.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support import ROOT

# The child half of ForkedCli: one JSON request per line in, a pid then a status line out.
_ZYGOTE = r"""
import json, os, sys, traceback
import tasks.ops.cli

def child(request):
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    os.dup2(os.open(request["stdout"], flags, 0o600), 1)
    os.dup2(os.open(request["stderr"], flags, 0o600), 2)
    sys.argv = ["digest", *request["args"]]
    try:
        tasks.ops.cli.entry()  # what the `digest` script runs; it ends in sys.exit
        code = 0
    except SystemExit as stop:
        code = stop.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkedCli:
    """Runs ``digest ARGS`` in a fresh child process forked from a pre-imported parent.

    The child gets exactly the environment it is given (nothing of the test process leaks in),
    its own stdout and stderr, and its real exit status, a crash's 137 included.
    """

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._count = 0
        self._buffer = b""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DIGEST_", "CRASH"))}
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )

    def run(
        self, env: Mapping[str, str], *args: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run one command to its end; its exit status is the child's, as a shell sees it."""
        self._count += 1
        out = self._scratch / f"cli-{self._count}.out"
        err = self._scratch / f"cli-{self._count}.err"
        request = {"env": dict(env), "args": list(args), "stdout": str(out), "stderr": str(err)}
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        pid = self._reply(10)["pid"]
        try:
            code = self._reply(timeout)["code"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._reply(10)
            raise AssertionError(
                f"digest {' '.join(args)} did not finish within {timeout}s; "
                f"its output so far: {out.read_text()}{err.read_text()}"
            ) from None
        return subprocess.CompletedProcess(
            ["digest", *args], code, out.read_text(), err.read_text()
        )

    def _reply(self, timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"the CLI parent exited ({self._process.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        """Stop the parent (it exits when its input closes)."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)

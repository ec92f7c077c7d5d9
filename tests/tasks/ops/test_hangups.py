"""A peer that hangs up never ends a ``digest`` process; a closed stdout ends it quietly.

``digest show | head`` must end quietly when ``head`` has read enough, with no traceback. That
was done by restoring SIGPIPE's default action in every ``digest`` process, which also ended
the console, silently, whenever a browser hung up while it was answering: its next write to
that socket killed the whole server. Only a write to stdout may end a command now.
"""

from __future__ import annotations

import socket
import struct
import subprocess

import pytest

from tests.support import BIN, RUN, Deployment
from tests.tasks.ops.test_console_browser import console, free_port
from tests.tasks.ops.test_console_rebinding import ask

pytestmark = pytest.mark.slow

HANGUPS = 30


def hang_up_while_answered(port: int) -> None:
    """Ask for the runs page and reset the connection at once, before its answer is read."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as peer:
        peer.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        # Linger 0: the close is a reset, so the server's next writes fail (EPIPE).
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_the_console_outlives_browsers_that_hang_up_mid_answer(deployment: Deployment) -> None:
    assert deployment.cli("run", RUN).returncode == 0  # a run for the page to list
    port = free_port()
    process = console(deployment, port)

    for _ in range(HANGUPS):
        hang_up_while_answered(port)

    status, page = ask(port, "GET", "/", f"127.0.0.1:{port}")
    assert process.poll() is None, (deployment.state_dir / "console.log").read_text()
    assert status == 200 and RUN in page


def test_a_command_whose_reader_went_away_ends_quietly() -> None:
    command = subprocess.Popen(
        [str(BIN / "digest"), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert command.stdout is not None and command.stderr is not None
    command.stdout.close()  # before the command has started: its first write finds no reader

    errors = command.stderr.read().decode()
    # What a shell reports of a command ended by a closed pipe, and nothing said.
    assert command.wait(timeout=30) == 141
    assert errors == ""

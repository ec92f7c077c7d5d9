"""A cancel never undoes an email already under way: it is refused, and the run finishes.

A slow relay makes a run look stuck inside the send; an operator cancels it. Once the send's
effect is claimed the email may be out, so the cancel is refused in one line (exit 2) and the
run finishes its bookkeeping (mark-seen): the week's items are seen, and the next week does
not email them again. The same holds for a run that crashed after its send, then cancelled.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.fakes.smtp import Inbox
from tests.support import BIN, ROOT, RUN, Deployment

pytestmark = pytest.mark.slow

REFUSED = "digest: run digest:{run}: its email {said}; it will finish; nothing was cancelled\n"
NOTHING_NEW = "nothing-new: 0 items, 0 model calls in this attempt"


def test_a_cancel_while_the_email_is_in_data_is_refused_and_the_run_finishes(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, url = inbox
    deployment.env.update(DIGEST_SMTP_URL=url, DIGEST_OFFLINE="1")
    reached, release = handler.hold("DATA")  # taken by the server, the client not yet told
    running = subprocess.Popen(
        [str(BIN / "digest"), "run", RUN],
        cwd=ROOT,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reached.wait(30)
        cancelled = deployment.cli("cancel", RUN)
        shown_meanwhile = deployment.cli("show", RUN).stdout
    finally:
        release.set()
        out, err = running.communicate(timeout=60)

    assert (cancelled.returncode, cancelled.stdout, cancelled.stderr) == (
        2,
        "",
        REFUSED.format(run=RUN, said="is being sent"),
    )
    assert "email    being sent (the run finishes it)" in shown_meanwhile
    assert running.returncode == 0, out + err
    assert out.splitlines()[-1] == (
        "sent: 8 items, 9 offline summaries (no model calls) in this attempt, "
        f"email sent (digest-{RUN})"
    )
    shown = deployment.cli("show", RUN).stdout
    assert "status   done: sent: 8 items, email sent (digest-2026-w42)\n" in shown
    assert f"email    sent (digest-{RUN})" in shown
    assert "cancel" not in deployment.view(RUN).meta

    next_week = deployment.cli("run", "2026-w43")
    assert (
        next_week.stdout.splitlines()[-1] == "nothing-new: 0 items, 0 model calls in this attempt"
    )
    assert len(handler.messages) == 1


@pytest.mark.parametrize("point", ["before-save:send", "after:send"])
def test_a_run_crashed_after_its_send_cannot_be_cancelled_into_a_second_email(
    point: str, deployment: Deployment
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    crashed = deployment.cli("run", RUN, env={"CRASH": point})
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr

    cancelled = deployment.cli("cancel", RUN)
    # Its receipt saved either way; its step record waits for the run's next write, so the
    # crash found it unrecorded at both points.
    assert (cancelled.returncode, cancelled.stderr) == (
        2,
        REFUSED.format(run=RUN, said="was sent"),
    ), cancelled.stdout
    assert "email    sent (the run finishes" in deployment.cli("show", RUN).stdout
    resumed = deployment.cli("run", RUN)  # the crashed holder is provably gone: at once
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[-1].startswith("sent: 8 items, 0 model calls")
    assert deployment.view(RUN).status == "done"

    next_week = deployment.cli("run", "2026-w43")
    assert (
        next_week.stdout.splitlines()[-1] == "nothing-new: 0 items, 0 model calls in this attempt"
    )
    assert [path.name for path in deployment.outbox()] == [f"digest-{RUN}.json"]

"""``digest console``: a small server-rendered web app to watch and steer runs.

Two pages answer an operator's questions without reading Redis: the runs page (what ran,
what waits and for what, what failed, what it cost) and a run's page (its steps in order,
who holds it, what it waits for, and the actions: approve, reject, cancel, retry, fork). Every
action calls the same function the command line does (``tasks.ops.actions``).

Flask renders Jinja templates with autoescaping on, so model output and item text, which are
untrusted, reach the page as text; secrets are masked before rendering. The one script is
the console's own ``/console.js`` (times into the reader's zone; the policy allows no other):
plain forms, and a refresh header while something is running. Every action
is a POST carrying a per-process CSRF token that another site cannot read, and checked against
``Sec-Fetch-Site``/``Origin``. Bound to 127.0.0.1 unless told otherwise; any other address
requires ``DIGEST_CONSOLE_TOKEN``, asked once and kept in a same-site cookie.

It answers only to its own names (``Names``): a request whose ``Host`` is not the address it
is bound to, or the public origin configured (``DIGEST_CONSOLE_ORIGIN``), is refused with 421
before anything is read. A page on another site whose name was rebound to 127.0.0.1 (DNS
rebinding) is same-origin to the browser, ``Origin`` and ``Host`` alike, so comparing the two
proves nothing: ``Origin`` is compared with the console's own origins instead.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, abort, flash, redirect, render_template, request, url_for
from markupsafe import Markup

from journal import Record, StepKey, Wait, validate_run_id
from journal.batch import is_batch_look
from journal.errors import ControlRefused, InvalidRunId, JournalError
from journal.logs import redact
from journal.ops.views import (
    STATES,
    Cursor,
    RunRow,
    RunView,
    Wanted,
    holders_gone,
    inspect_run,
    list_runs,
    page_size,
    state_of,
)
from journal.testing import fixture
from tasks.errors import BadInput, DigestError
from tasks.job.claims import holdings
from tasks.job.names import APPROVAL, WORKFLOW
from tasks.job.report import batch_lines, counted
from tasks.llm.cost import dollars, is_completion, usage_of
from tasks.ops import actions
from tasks.ops.run_page import (
    badge,
    outcome_of,
    span,
    stamp,
    step_words,
    waterfall,
    when,
)
from tasks.runtime import Runtime, prepare_metrics, use_runtime

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
TOKEN_COOKIE = "digest_console"
LIVE = ("running", "cancelling", "retrying", "new")
REFRESH_SECONDS = 3


# Times in the reader's zone, with the UTC time kept on hover; the only script the page runs.
LOCAL_TIMES = """document.querySelectorAll("time[datetime]").forEach(function (t) {
  var d = new Date(t.getAttribute("datetime"));
  if (!isNaN(d)) { t.textContent = d.toLocaleString(undefined, {year: "numeric",
    month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    timeZoneName: "short"}); }
});
"""


def preview(result: Any, width: int = 160) -> str:
    """A step's result as one line of text (its ``text`` for a model call), masked."""
    text = result.get("text") if isinstance(result, dict) and "text" in result else result
    flat = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    flat = redact(" ".join(flat.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def detail(meta: Mapping[str, str], wait: dict[str, Any] | None) -> str:
    """What a run's state means now: what it waits for until when, when it retries.

    Times are ``stamp``s, shown in the reader's zone.
    """
    state = state_of(meta)
    if state == "waiting" and wait:
        until = (
            Markup(" until {}").format(stamp(int(wait["until"] * 1000)))
            if wait.get("until")
            else ""
        )
        if wait.get("signal") == APPROVAL:
            return Markup("waiting for approval{}").format(until)
        if wait.get("step") == "send":
            return "the email may have been sent: waiting for your word"
        what = step_words(str(wait.get("step", "")))
        return Markup("waiting ({}){}").format(what, until)
    if state == "retrying":
        return Markup("retries at {}, gives up after {}").format(
            stamp(meta.get("retry_at")), stamp(meta.get("retry_until"))
        )
    if state == "cancelling":
        return "stops before its next step"
    if state in ("failed", "parked"):
        return redact(meta.get("last_error", ""))[:200]
    return ""


def run_context(runtime: Runtime, view: RunView, run_id: str) -> dict[str, Any]:
    """Everything a run's page shows, read from one snapshot (and the recorded email)."""
    from tasks.ops.fork_preview import recorded_email

    now = int(runtime.journal.clock.now() * 1000)
    draft = view.step("draft")
    waiting_approval = view.wait is not None and view.wait.signal == APPROVAL
    usage = usage_of(r.result for r in view.steps)
    said = outcome_of(view, run_id, now)
    email = recorded_email(runtime, run_id) if said.kind in ("sent", "ambiguous") else None
    return {
        "view": view,
        "run_id": run_id,
        "state": view.state,
        "outcome": said,
        "deliveries": waterfall(view, now),
        "inputs": view.meta.args or {},
        "usage": usage,
        "cost": dollars(usage.cost_usd),
        "limits": [state.line() for state in runtime.limit_states()],
        "waited": sum(
            r.result.get("waited_ms", 0) for r in view.steps if isinstance(r.result, dict)
        ),
        "email": _masked(email) if email else None,
        "draft": _masked(draft.result) if waiting_approval and draft else None,
        "held": holdings(runtime).get(view.run, 0),
        "batches": batch_lines(view.steps, view.wait, view.effects),
        "summary": summary,
        "badge": badge,
        "pretty": lambda value: redact(json.dumps(value, indent=2, ensure_ascii=False)),
        "forkable": [r.key for r in view.steps if r.key != "select"],
    }


def summary(record: Record) -> str:
    """A step's result in words: a model call's text, a count of items, a receipt."""
    result = record.result
    if record.key.startswith(StepKey.DEADLINE.value) and isinstance(result, int | float):
        return Markup("answer awaited until {}").format(stamp(int(result * 1000)))
    if isinstance(result, bool):
        return "done" if result else "not done"
    if isinstance(result, int) and record.key == "mark-seen":
        return f"marked sent: {counted(result, 'item')} sent in all weeks so far"
    if isinstance(result, list):
        return counted(len(result), "item")
    if isinstance(result, dict) and "received" in result:
        return "decision received" if result["received"] else "no decision in time"
    if isinstance(result, dict) and {"id", "sent"} <= result.keys():
        return f"sent as {result['id']}" if result["sent"] else f"{result['id']}, sent earlier"
    if isinstance(result, dict) and "subject" in result:
        return f"draft: {result['subject']}"
    if is_completion(result):  # who answered: the primary, a fallback, or offline
        return f"[{result.get('model')}] {preview(result)}"
    if isinstance(result, str | int | float) or (isinstance(result, dict) and "text" in result):
        return preview(result)
    return "recorded: open for its JSON"


def row_summary(row: RunRow, now_ms: int, held: int = 0, gone: bool = False) -> dict[str, Any]:
    """What the runs page shows of one run; ``held``: the items it claims now.

    A live run's duration runs to now; a finished one's to its end. ``gone``: stored as
    running, but its holder's lease has lapsed (a crashed worker): not running, waiting for
    the sweep.
    """
    usage = usage_of(r.result for r in row.steps)
    wait = json.loads(row.meta["wait"]) if row.meta.get("wait") else None
    created = int(row.meta.get("created_at", "0") or 0)
    ended = int(row.meta.get("finished_at", "0") or 0)
    live = row.state in LIVE or row.state in ("waiting", "retrying")
    said = detail(row.meta, wait)
    if wait and is_batch_look(str(wait.get("step", ""))):
        # A batch run's wait, in words: its batch, its counts, when it looks next.
        lines = batch_lines(row.steps, Wait.from_json(wait))
        said = f"batch {lines[-1]}" if lines else said
    if gone:
        said = "holder gone, resumes at the next sweep"
    result = row.result if isinstance(row.result, dict) else {}
    word = badge(row.state, row.meta)
    return {
        "run_id": row.run_id,
        "state": "holder gone" if gone else word,
        "css": "failed" if gone else word.replace(" ", "-"),
        "reason": redact(str(result.get("reason", ""))),
        "detail": said,
        "started": created,
        "duration": span(created, now_ms if live and not ended else ended),
        "live": live and not ended,
        "steps": len(row.steps),
        "calls": usage.calls,
        "tokens": usage.tokens,
        "cost": dollars(usage.cost_usd),
        "held": held,
    }


OUTCOMES = ("sent", "nothing-new", "rejected", "expired")


@dataclass(frozen=True)
class Names:
    """The names a browser reaches this console by, as ``Host`` values and as origins.

    Attributes:
        hosts: every accepted ``Host`` header, lower case, with its port (also without it on
            its scheme's default port, as browsers send it).
        origins: every accepted ``Origin``, ``scheme://host[:port]``.
    """

    hosts: frozenset[str]
    origins: frozenset[str]

    @classmethod
    def bound(cls, host: str, port: int, public: str | None = None) -> Names:
        """The names of a console bound to ``host:port``, and reached at ``public`` if given.

        On loopback, each of 127.0.0.1, localhost and [::1] with the port; on another address,
        that address; on a wildcard one (0.0.0.0, ::), none but ``public``.

        Raises:
            BadInput: ``public`` is not an origin (``http(s)://name[:port]``, no path), or a
                wildcard binding has none.
        """
        names = LOCAL_HOSTS if host in LOCAL_HOSTS else () if host in WILDCARDS else (host,)
        reached = [_reached("http", name, port) for name in names]
        if public:
            parts = urlsplit(public.strip().lower())
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
                raise BadInput(
                    f"DIGEST_CONSOLE_ORIGIN={public}: not an origin; give the scheme, name and "
                    "port browsers use, e.g. https://digest.example.com"
                )
            reached.append(_reached(parts.scheme, parts.hostname, parts.port))
        if not reached:
            raise BadInput(
                f"--host {host} answers to no name a browser sends; set DIGEST_CONSOLE_ORIGIN to "
                f"the origin browsers use (e.g. http://digest.example.com:{port})"
            )
        hosts = frozenset(host for _, each in reached for host in each)
        return cls(hosts, frozenset(origin for origin, _ in reached))


def _reached(scheme: str, name: str, port: int | None) -> tuple[str, set[str]]:
    """The ``Origin`` a browser sends for ``scheme://name:port``, and the ``Host`` values."""
    netloc = f"[{name}]" if ":" in name else name
    default = 443 if scheme == "https" else 80
    port = default if port is None else port
    if port == default:  # browsers leave a default port out of both
        return f"{scheme}://{netloc}", {netloc, f"{netloc}:{port}"}
    return f"{scheme}://{netloc}:{port}", {f"{netloc}:{port}"}


def create_app(runtime: Runtime, names: Names, *, token: str | None = None) -> Flask:
    """The console for one deployment, answering to ``names`` only.

    ``token`` guards it when it is not bound locally. Its replays in memory (a sent email
    rebuilt, a fork previewed) run the workflow with ``runtime``, as ``digest`` commands do,
    never with one the workflow would build from the environment (and connect) itself.
    """
    use_runtime(runtime)
    app = Flask(__name__)
    app.secret_key = secrets.token_bytes(32)
    app.config.update(SESSION_COOKIE_SAMESITE="Strict", SESSION_COOKIE_HTTPONLY=True)
    csrf = secrets.token_urlsafe(32)
    _guard(app, names, token, csrf)
    _listing(app, runtime)
    _run_pages(app, runtime)
    _actions(app, runtime)
    return app


def _guard(app: Flask, names: Names, token: str | None, csrf: str) -> None:
    """Every request: answered only by the console's own names, with the token, same-origin.

    Every answer is hardened (no script, no framing, no caching), and every page shares the
    form's CSRF value and the formatting functions.
    """

    @app.before_request
    def guard() -> Any:
        if request.host.lower() not in names.hosts:
            return Response(
                "digest console: this is not a name it answers to; open it by its own address\n",
                status=421,
                mimetype="text/plain",
            )
        if token is not None and not _authorised(token):
            offered = request.args.get("token", "")
            if offered and hmac.compare_digest(offered, token):
                answer = redirect(request.path)
                answer.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
                return answer
            return Response(
                "digest console: open it with ?token=<DIGEST_CONSOLE_TOKEN> once\n",
                status=401,
                mimetype="text/plain",
            )
        if request.method == "POST" and not _same_origin(csrf, names):
            abort(403)
        return None

    @app.after_request
    def harden(answer: Response) -> Response:
        answer.headers["Content-Security-Policy"] = (
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self'; "
            "form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        answer.headers["X-Content-Type-Options"] = "nosniff"
        answer.headers["Referrer-Policy"] = "same-origin"  # no-referrer would send Origin: null
        answer.headers["Cache-Control"] = "no-store"
        return answer

    @app.context_processor
    def shared() -> dict[str, Any]:
        return {
            "csrf": csrf,
            "when": when,
            "stamp": stamp,
            "span": span,
            "counted": counted,
            "step_words": step_words,
            "states": STATES,
        }

    @app.get("/console.js")
    def local_times() -> Response:
        return Response(LOCAL_TIMES, mimetype="text/javascript")


def _listing(app: Flask, runtime: Runtime) -> None:
    """``/``: the runs, a page at a time; ``/metrics``: the store's gauges for Prometheus."""
    journal = runtime.journal

    @app.get("/")
    def runs() -> Any:
        try:
            wanted, limit, before = _listing_query()
        except ValueError as bad:
            return _refused(str(bad))
        held = holdings(runtime)
        # One row more than the page, to say whether older runs follow.
        found = list_runs(journal, steps=True, limit=limit + 1, before=before, wanted=wanted)
        shown = found[:limit]
        older = None
        query: dict[str, Any] = {
            "status": wanted.state,
            "outcome": wanted.outcome,
            "q": wanted.id_part,
        }
        if len(found) > len(shown):
            older = url_for("runs", **query, limit=limit, before=str(shown[-1].cursor))
        gone = holders_gone(journal, shown)
        now = int(journal.clock.now() * 1000)
        rows = [row_summary(r, now, held.get(r.run, 0), r.run in gone) for r in shown]
        page = render_template(
            "runs.html",
            rows=rows,
            wanted=wanted,
            limit=limit,
            older=older,
            paged=before,
            outcomes=OUTCOMES,
            flower=runtime.config.flower_url,
            query=query,
        )
        return _refreshing(page, any(row["live"] for row in rows))

    @app.get("/metrics")
    def metrics() -> Response:
        # Imported here: the pages need neither prometheus_client nor its directory.
        prepare_metrics(runtime.config.state_dir / "metrics-console")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from tasks.worker import metrics as exported

        return Response(
            generate_latest(
                exported.store_registry(
                    lambda: journal, runtime.config.max_cost_usd, runtime.limit_states
                )
            ),
            mimetype=CONTENT_TYPE_LATEST,
        )


def _run_pages(app: Flask, runtime: Runtime) -> None:
    """``/runs/<run_id>``: one run's page; ``/runs/<run_id>/export``: its journal as a fixture."""
    journal = runtime.journal

    @app.get("/runs/<run_id>")
    def run(run_id: str) -> Any:
        _valid(run_id)
        view = inspect_run(journal, WORKFLOW, run_id)
        if not view.meta:
            abort(404)
        page = render_template("run.html", **run_context(runtime, view, run_id))
        return _refreshing(page, view.state in LIVE)

    @app.get("/runs/<run_id>/fork")
    def fork_preview(run_id: str) -> Any:
        # A rehearsal in memory (``digest fork --dry-run``): nothing is written or sent.
        _valid(run_id)
        step = request.args.get("step", "")
        from tasks.ops.fork_preview import preview_fork

        try:
            rehearsed = preview_fork(runtime, run_id, step)
        except (ControlRefused, DigestError, JournalError) as refused:
            flash(redact(f"no fork from {step!r}: {refused}"), "error")
            return redirect(url_for("run", run_id=run_id), code=303)
        diff = redact(rehearsed.diff()) or "(the same email: this fork would change nothing)"
        return render_template(
            "fork.html",
            run_id=run_id,
            step=step,
            diff=diff,
            ran=[step_words(key) for key in rehearsed.ran],
            calls=rehearsed.model_calls,
            cost=dollars(rehearsed.cost_usd) if rehearsed.cost_usd else "nothing",
        )

    @app.get("/runs/<run_id>/export")
    def export(run_id: str) -> Any:
        # The same document as `digest export`: a read, so a GET; secrets masked by export.
        _valid(run_id)
        try:
            document = fixture.export(journal, WORKFLOW, run_id).dumps()
        except ControlRefused:
            abort(404)
        name = f"{WORKFLOW}-{run_id}.json"
        return Response(
            document,
            mimetype="application/json",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )


def _actions(app: Flask, runtime: Runtime) -> None:
    """The operator's actions on a run, each a POST that flashes its answer and redirects."""

    def act(run_id: str, action: Callable[[], actions.Answer]) -> Any:
        _valid(run_id)
        try:
            answer = action()
        except (ControlRefused, BadInput) as refused:
            flash(redact(str(refused)), "error")
            return redirect(url_for("run", run_id=run_id), code=303)
        except (DigestError, JournalError) as failed:
            flash(redact(f"failed: {failed}"), "error")
            return redirect(url_for("run", run_id=run_id), code=303)
        flash(redact(answer.line), "ok")
        return redirect(url_for("run", run_id=answer.run_id), code=303)

    @app.post("/runs/<run_id>/approve")
    def approve(run_id: str) -> Any:
        return act(run_id, lambda: actions.decide(runtime, run_id, {"approved": True}))

    @app.post("/runs/<run_id>/reject")
    def reject(run_id: str) -> Any:
        reason = request.form.get("reason", "").strip() or "rejected in the console"
        decision = {"approved": False, "reason": reason}
        return act(run_id, lambda: actions.decide(runtime, run_id, decision))

    @app.post("/runs/<run_id>/cancel")
    def cancel(run_id: str) -> Any:
        reason = request.form.get("reason", "").strip() or "cancelled in the console"
        return act(run_id, lambda: actions.cancel(runtime, run_id, reason))

    @app.post("/runs/<run_id>/retry")
    def retry(run_id: str) -> Any:
        return act(run_id, lambda: actions.retry(runtime, run_id))

    @app.post("/runs/<run_id>/mark-sent")
    def mark_sent(run_id: str) -> Any:
        return act(run_id, lambda: actions.mark_sent(runtime, run_id))

    @app.post("/runs/<run_id>/resend")
    def resend(run_id: str) -> Any:
        return act(run_id, lambda: actions.resend(runtime, run_id))

    @app.post("/runs/<run_id>/fork")
    def fork(run_id: str) -> Any:
        step = request.form.get("step", "")
        new = request.form.get("as", "").strip() or None
        return act(run_id, lambda: actions.fork(runtime, run_id, step, new))


def _listing_query() -> tuple[Wanted, int, Cursor | None]:
    """The runs page's query: what to keep, how many, from where.

    Raises:
        ValueError: a parameter no page of the console writes, said in one line.
    """
    args = request.args
    status, outcome = args.get("status") or None, args.get("outcome") or None
    if status is not None and status not in STATES:
        raise ValueError(f"status {status!r} is none of: {', '.join(STATES)}")
    if outcome is not None and outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is none of: {', '.join(OUTCOMES)}")
    try:
        limit = page_size(args.get("limit", "50"))
    except ValueError as bad:
        raise ValueError(f"limit {bad}") from None
    try:
        before = Cursor.parse(args["before"]) if "before" in args else None
    except ValueError as bad:
        raise ValueError(f"before: {bad}; follow the page's own link to older runs") from None
    part = args.get("q", "").strip().removeprefix(f"{WORKFLOW}:") or None
    return Wanted(status, outcome, part), limit, before


def _masked(email: Any) -> dict[str, str]:
    fields = email if isinstance(email, dict) else {}
    return {name: redact(str(fields.get(name, ""))) for name in ("to", "subject", "body")}


def _refused(reason: str) -> Response:
    """A request the console cannot answer, said in one line."""
    return Response(f"digest console: {reason}\n", status=400, mimetype="text/plain")


def _valid(run_id: str) -> None:
    try:
        validate_run_id(run_id)
    except InvalidRunId:
        abort(404)


def _authorised(token: str) -> bool:
    offered = request.cookies.get(TOKEN_COOKIE, "")
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        offered = header.removeprefix("Bearer ")
    return bool(offered) and hmac.compare_digest(offered, token)


def _same_origin(csrf: str, names: Names) -> bool:
    """A POST from this console's own page: its token, and no sign of another site.

    ``Origin`` is compared with the console's own origins, never with ``Host``: under DNS
    rebinding the two agree on the attacker's name.
    """
    if not hmac.compare_digest(request.form.get("csrf", ""), csrf):
        return False
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin.lower().rstrip("/") in names.origins


def _refreshing(page: str, live: bool) -> Response:
    answer = Response(page, mimetype="text/html")
    if live:
        answer.headers["Refresh"] = str(REFRESH_SECONDS)
    return answer


def check_binding(host: str, env: dict[str, str] | None = None) -> str | None:
    """The token a binding needs: none on loopback, ``DIGEST_CONSOLE_TOKEN`` anywhere else.

    Raises:
        BadInput: a non-local address without a token (or with a short one).
    """
    env = dict(os.environ) if env is None else env
    token = env.get("DIGEST_CONSOLE_TOKEN") or None
    if host in LOCAL_HOSTS:
        return token
    if token is None or len(token) < 16:
        raise BadInput(
            f"--host {host}: binding beyond this machine needs DIGEST_CONSOLE_TOKEN (16+ "
            "characters), which the browser gives once as ?token=...; or keep 127.0.0.1"
        )
    return token


def serve(runtime: Runtime, host: str, port: int, names: Names, token: str | None) -> None:
    """Serve the console with waitress (a production WSGI server, pure Python)."""
    from waitress.server import create_server

    app = create_app(runtime, names, token=token)
    try:  # bound before the address is printed: a busy port is refused, never announced
        server = create_server(app, host=host, port=port, threads=4, ident="")
    except OSError as exc:
        raise BadInput(f"--host {host} --port {port}: {exc.strerror}; choose another") from None
    print(f"digest console on http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
    server.run()

"""A fake of Resend's ``POST /emails`` served over real HTTP on 127.0.0.1.

Tests point the real ``ResendMailer`` at it (``base_url=api.url``), so the HTTP client's own
request building, timeouts and error mapping are what gets exercised, and the fake counts both
what it was asked (``requests``, every POST with its headers) and what it actually delivered
(``deliveries``): "1 delivery for 2 requests" is the point of an idempotency key.

Resend's documented semantics, as far as a send needs them:

- ``Authorization: Bearer <key>``: none is 401 ``missing_api_key``, a wrong one 401
  ``validation_error`` "API key is invalid".
- A body that is not a JSON object is 400 ``validation_error``; one missing ``from``, ``to``,
  ``subject``, or both ``text`` and ``html``, is 422 ``missing_required_field``.
- ``Idempotency-Key`` (1-256 characters, else 400 ``invalid_idempotency_key``): the same key with
  the same body answers the first email's id and delivers nothing; the same key with another
  body is 409 ``invalid_idempotent_request``; the same key while its first request is still in
  progress is 409 ``concurrent_idempotent_requests``. Refused requests leave no entry.
- Errors are ``{"statusCode": ..., "message": ..., "name": ...}``; a 200 is ``{"id": ...}``.

Faults, each used once:

- ``fail_next(status, name, message, retry_after=None)``: the next POST is answered with that
  error before anything else is checked; nothing is delivered.
- ``freeze(seconds)``: the next POST that delivers an email records it and its key, then holds
  the answer ``seconds``: a slow provider, whose client times out though the email went out.
- ``drop_next()``: the next POST that delivers closes its connection without an answer.
- ``stall_next(seconds)``: the next POST that would deliver is held *before* it does, its key in
  progress, so a request under the same key meanwhile gets 409
  ``concurrent_idempotent_requests``.

Held answers are let go at once by ``stop()``, so a test never waits out a fault.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

API_KEY = "re_fake_4f9c2a7d1e"
EMAILS_PATH = "/emails"
MAX_KEY_LENGTH = 256


@dataclass(frozen=True)
class Received:
    """One POST as the server saw it: headers by lower-case name, the body if it was JSON."""

    number: int
    path: str
    headers: dict[str, str]
    body: Any
    status: int

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get("idempotency-key")


@dataclass(frozen=True)
class Delivery:
    """An email the fake actually sent: one per idempotency key (or per keyless request)."""

    id: str
    key: str | None
    body: dict[str, Any]


@dataclass(frozen=True)
class _Fault:
    status: int
    name: str
    message: str
    retry_after: float | None


@dataclass
class _Entry:
    """The idempotency table's row for one key."""

    body: dict[str, Any]
    id: str | None = None  # None while the first request is in progress


class FakeResend:
    """A running fake API; thread-safe records of what it received and delivered.

    Args:
        api_key: the one key it accepts.
    """

    def __init__(self, api_key: str = API_KEY) -> None:
        self.api_key = api_key
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._received: list[Received] = []
        self._deliveries: list[Delivery] = []
        self._keys: dict[str, _Entry] = {}
        self._faults: list[_Fault] = []
        self._freeze: float | None = None
        self._drop = False
        self._stall: float | None = None
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def start(self) -> FakeResend:
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; held answers are let go first so their threads can end."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeResend:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the fake Resend API is not started; call start() first")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    # --- what was received

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> None:
        """Block until ``count`` POSTs have arrived (answered or not)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._received) >= count, timeout):
                raise TimeoutError(
                    f"expected {count} requests at the fake Resend API within {timeout} s, "
                    f"got {len(self._received)}"
                )

    # --- scripting

    def fail_next(
        self, status: int, name: str, message: str, retry_after: float | None = None
    ) -> None:
        """Answer the next POST with this error (and ``retry-after``, if given)."""
        with self._lock:
            self._faults.append(_Fault(status, name, message, retry_after))

    def freeze(self, seconds: float) -> None:
        """Hold the next POST's answer ``seconds`` after its email was delivered."""
        with self._lock:
            self._freeze = seconds

    def drop_next(self) -> None:
        """Close the next POST's connection without an answer, after its email was delivered."""
        with self._lock:
            self._drop = True

    def stall_next(self, seconds: float) -> None:
        """Hold the next POST ``seconds`` before it delivers, its idempotency key in progress."""
        with self._lock:
            self._stall = seconds

    def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the server is stopping."""
        self._stopping.wait(seconds)

    # --- the API

    def handle(self, path: str, headers: Mapping[str, str], raw: bytes) -> _Answer:
        """Answer one POST; what is held or dropped is the handler's to carry out."""
        headers = {name.lower(): value for name, value in headers.items()}
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            answer = self._fault() or self._check(path, headers, body)
            if answer is None:
                answer = self._admit(headers.get("idempotency-key"), body)
            self._received.append(
                Received(len(self._received) + 1, path, headers, body, answer.status)
            )
            self._arrived.notify_all()
        if answer.stall:
            self.hold(answer.stall)
            answer = self._deliver(headers.get("idempotency-key"), body, answer)
        return answer

    def _fault(self) -> _Answer | None:
        """Under the lock: the error scripted for this POST, if any."""
        if not self._faults:
            return None
        fault = self._faults.pop(0)
        answer = _error(fault.status, fault.name, fault.message)
        if fault.retry_after is not None:
            answer.headers["retry-after"] = f"{fault.retry_after:g}"
        return answer

    def _check(self, path: str, headers: Mapping[str, str], body: Any) -> _Answer | None:
        """The refusals that come before the idempotency table: nothing is recorded."""
        if path.rstrip("/") != EMAILS_PATH:
            return _error(404, "not_found", "The requested endpoint does not exist.")
        authorization = headers.get("authorization", "")
        if not authorization.startswith("Bearer ") or not authorization[7:].strip():
            return _error(401, "missing_api_key", "Missing API key in the authorization header.")
        if authorization[7:] != self.api_key:
            return _error(401, "validation_error", "API key is invalid")
        key = headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= MAX_KEY_LENGTH:
            return _error(400, "invalid_idempotency_key", "The key must be between 1-256 chars.")
        if not isinstance(body, dict):
            return _error(400, "validation_error", "The request body must be a JSON object.")
        for name in ("from", "to", "subject"):
            if not body.get(name):
                return _error(422, "missing_required_field", f"Missing `{name}` field.")
        if not body.get("text") and not body.get("html"):
            return _error(422, "missing_required_field", "Missing `html` or `text` field.")
        return None

    def _admit(self, key: str | None, body: dict[str, Any]) -> _Answer:
        """Under the lock: the idempotency table's answer, or a delivery to make."""
        if key is not None and key in self._keys:
            entry = self._keys[key]
            if entry.body != body:
                return _error(
                    409,
                    "invalid_idempotent_request",
                    "Same idempotency key used with a different request payload.",
                )
            if entry.id is None:
                return _error(
                    409,
                    "concurrent_idempotent_requests",
                    "Same idempotency key used while original request is still in progress.",
                )
            return _Answer(200, {"id": entry.id})
        if key is not None:
            self._keys[key] = _Entry(body)
        answer = _Answer(200, {}, stall=self._stall or 0.0)
        self._stall = None
        if not answer.stall:
            answer = self._deliver_locked(key, body, answer)
        return answer

    def _deliver(self, key: str | None, body: dict[str, Any], answer: _Answer) -> _Answer:
        with self._lock:
            return self._deliver_locked(key, body, answer)

    def _deliver_locked(self, key: str | None, body: dict[str, Any], answer: _Answer) -> _Answer:
        email_id = str(uuid.uuid4())
        self._deliveries.append(Delivery(email_id, key, body))
        if key is not None:
            self._keys[key].id = email_id
        answer.payload = {"id": email_id}
        answer.freeze = self._freeze or 0.0
        answer.drop = self._drop
        self._freeze, self._drop = None, False
        return answer


@dataclass
class _Answer:
    """What one POST gets, and the fault its handler carries out before (or instead of) it."""

    status: int
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    stall: float = 0.0
    freeze: float = 0.0
    drop: bool = False


def _error(status: int, name: str, message: str) -> _Answer:
    return _Answer(status, {"statusCode": status, "message": message, "name": name})


class _Server(ThreadingHTTPServer):
    fake: FakeResend
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 10  # a client that connects and sends nothing must not pin a thread forever

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        fake = self.server.fake
        answer = fake.handle(self.path, dict(self.headers), raw)
        if answer.freeze:
            fake.hold(answer.freeze)
        if answer.drop:
            self.close_connection = True
            return  # the connection closes with no status line: a response lost on the way
        self._send(answer)

    def do_GET(self) -> None:
        self._send(
            _error(405, "method_not_allowed", "Method is not allowed for the requested path.")
        )

    def _send(self, answer: _Answer) -> None:
        # One request per connection: stop() then never waits on an idle keep-alive socket.
        self.close_connection = True
        payload = json.dumps(answer.payload).encode()
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out while the answer was held: nobody is left to read it

    def log_message(self, format: str, *args: Any) -> None:
        pass

"""The eval server's HTTP layer: slime's eval-delegate API over the job queue (quanteval.evalserver.jobs).

    GET  /health        200 {"status": "ok", ...} when the backend can run; 503 "not_ready" (with a hint) or "stopping"
    POST /evaluate      slime's payload; blocks; slime's response shape plus `metrics` (flat) and `errors`
    POST /jobs          same payload; 202 {"job_id", "status", "attached"} at once; the job runs to the end
    GET  /jobs/<id>     status, runs and metrics of one job

Status codes: 400 for a payload that can never succeed (slime's client retries these too, pointlessly);
401 without the bearer token when one is required; 413 for a body over MAX_BODY_BYTES; 429 when the caller already has
MAX_BODY_READS_PER_CALLER bodies arriving; 502 when a benchmark failed (the good benchmarks'
metrics are still in the body; `allow_partial` answers 200 when at least one succeeded); 503 while
shutting down (in-flight requests get it with the reason).

Connections: a fixed pool of HTTP_WORKERS threads handles requests. A new connection waits in a selector (no thread)
until its request line and headers are all in (read there, without blocking); one that has not sent them within
`idle_timeout_s` is closed, and a client with MAX_PENDING_PER_CLIENT half-sent requests open gets no more.
So half-sent requests hold no worker, and /health answers through any number of them. A worker then reads the body
(within the same deadline) and answers; each connection carries one request. Thousands of idle sockets cost file
descriptors, not threads.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import os
import queue
import select
import selectors
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

from pydantic import ValidationError

from quanteval.evalserver.backend import EvalRequest, ServerSettings, payload_errors, token_refusal
from quanteval.evalserver.jobs import EvalService, Job, KeyReused, ShuttingDown
from quanteval.localproc import is_loopback
from quanteval.models import ToolError

log = logging.getLogger("quanteval.faces.evalserver")

MAX_BODY_BYTES = 1_000_000
MAX_JSON_DEPTH = 32  # slime's payload nests 3 levels; deeper is an attack on the parser and the validators
# Requests handled at once. A POST /evaluate holds its worker while its job runs (max_concurrent_jobs <= 32 run, the
# rest queue), so this leaves room for pollers and retries; beyond it, ready connections wait for a free worker.
HTTP_WORKERS = 64
MAX_HEADER_BYTES = 64 * 1024  # request line and headers, read in the waiting room
MAX_PENDING_PER_CLIENT = 32  # connections of one address that sent part of their headers and no more
# Bodies read at once for one caller (the bearer token's holders, or one address where no token is required): a body
# holds its worker while it arrives, so token holders trickling bodies must leave workers for /health and the rest.
MAX_BODY_READS_PER_CALLER = HTTP_WORKERS // 4
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout)


def required_token(settings: ServerSettings) -> str | None:
    """The bearer token clients must send; refuses to serve beyond loopback without one (it runs commands), or with
    one short enough to guess."""
    token = os.environ.get(settings.token_env, "").strip()
    if refusal := token_refusal(token, settings.token_env, loopback=is_loopback(settings.bind_host)):
        raise ToolError(f"refusing to bind {settings.bind_host}: {refusal}")
    return token or None


def job_http_status(job: Job, settings: ServerSettings) -> int:
    if job.status == "cancelled":
        return 503
    if job.status == "succeeded":
        return 200
    succeeded = any(run["status"] == "succeeded" for run in job.runs)
    return 200 if settings.allow_partial and succeeded else 502


class _Server(HTTPServer):
    """HTTPServer with a bounded worker pool: accepted connections wait in a selector, without a thread, until they
    send something; silent ones are closed after the idle timeout (see the module docstring)."""

    request_queue_size = 128  # the default listen backlog of 5 resets clients when many connect at once

    def __init__(self, address: tuple[str, int], handler: type[EvalHandler], idle_timeout_s: float) -> None:
        super().__init__(address, handler)
        self.idle_timeout_s = idle_timeout_s
        self._workers = ThreadPoolExecutor(HTTP_WORKERS, thread_name_prefix="eval-http")
        self._arrivals: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._wake_read, self._wake_write = socket.socketpair()
        self._closed = threading.Event()
        # Connections a worker is still reading a request from, with the moment they must be done by: the waiting
        # room shuts those that are late, so a client trickling its headers cannot hold a worker.
        self._reading: dict[socket.socket, float] = {}
        self._reading_lock = threading.Lock()
        self._heads: dict[socket.socket, bytes] = {}
        self._heads_lock = threading.Lock()
        self._body_reads: dict[str, int] = {}  # bodies being read now, by caller
        self._body_reads_lock = threading.Lock()
        self._waiting_room = threading.Thread(target=self._watch_idle, name="eval-http-idle", daemon=True)
        self._waiting_room.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the new connection to the waiting room (the accept loop never blocks on a client)."""
        self._arrivals.put(request)
        self._wake_write.send(b"\0")

    def _watch_idle(self) -> None:
        """Read each connection's request line and headers without blocking; give it to a worker once they are in.
        Close those not in by the idle timeout, those over MAX_HEADER_BYTES, and a client's beyond its share."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_read, selectors.EVENT_READ)
            deadlines: dict[socket.socket, float] = {}
            received: dict[socket.socket, bytearray] = {}
            partial: dict[str, set[socket.socket]] = {}  # connections that sent part of their headers, by address

            def drop(connection: socket.socket, handed: bool = False) -> None:
                selector.unregister(connection)
                del deadlines[connection], received[connection]
                for address in [a for a, held in partial.items() if connection in held]:
                    partial[address].discard(connection)
                    if not partial[address]:
                        del partial[address]
                if not handed:
                    self.shutdown_request(connection)

            while not self._closed.is_set():
                for key, _ in selector.select(timeout=0.5):
                    connection = key.fileobj
                    if connection is self._wake_read:
                        self._wake_read.recv(4096)
                        continue
                    assert isinstance(connection, socket.socket)
                    head = received[connection]
                    state = self._read_head(connection, head)
                    if state == "in":
                        drop(connection, handed=True)
                        connection.setblocking(True)
                        self._workers.submit(self._work, connection, bytes(head))
                    elif state == "closed":
                        drop(connection)
                    elif connection not in (held := partial.setdefault(self._address(connection), set())):
                        if len(held) >= MAX_PENDING_PER_CLIENT:  # one more half-sent request from this client: no
                            log.warning("a client has %d half-sent requests open; closing another", len(held))
                            drop(connection)
                        else:
                            held.add(connection)
                while not self._arrivals.empty():
                    connection = self._arrivals.get()
                    deadlines[connection] = time.monotonic() + self.idle_timeout_s
                    received[connection] = bytearray()
                    connection.setblocking(False)
                    selector.register(connection, selectors.EVENT_READ)
                now = time.monotonic()
                for connection in [c for c, deadline in deadlines.items() if deadline <= now]:
                    drop(connection)
                self._cut_slow_readers(now)
            for connection in list(deadlines):
                drop(connection)

    @staticmethod
    def _read_head(connection: socket.socket, head: bytearray) -> str:
        """Read what the connection has sent into `head`: "in" once its headers are, "closed" when it hung up or sent
        more than MAX_HEADER_BYTES without ending them, else "waiting"."""
        try:
            chunk = connection.recv(65536)
        except (BlockingIOError, InterruptedError):
            return "waiting"
        except OSError:
            chunk = b""
        if not chunk:
            return "closed"
        head += chunk
        if b"\r\n\r\n" in head or b"\n\n" in head:
            return "in"
        if len(head) > MAX_HEADER_BYTES:
            log.warning("a client sent over %d bytes of headers; closing it", MAX_HEADER_BYTES)
            return "closed"
        return "waiting"

    @staticmethod
    def _address(connection: socket.socket) -> str:
        try:
            return str(connection.getpeername()[0])
        except OSError:
            return "?"

    def reading(self, connection: socket.socket, deadline: float | None) -> None:
        """Mark a connection as being read until `deadline` (None: its request is in)."""
        with self._reading_lock:
            if deadline is None:
                self._reading.pop(connection, None)
            else:
                self._reading[connection] = deadline

    def _cut_slow_readers(self, now: float) -> None:
        with self._reading_lock:
            late = [connection for connection, deadline in self._reading.items() if deadline <= now]
            for connection in late:
                del self._reading[connection]
        for connection in late:
            if not self._closed.is_set():  # at shutdown every read is cut, late or not
                log.warning("a client did not send its request within %.0f s; closing it", self.idle_timeout_s)
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RD)  # the worker's blocked read returns at once; it closes the socket

    def _work(self, connection: socket.socket, head: bytes) -> None:
        try:
            address = connection.getpeername()
        except OSError:
            address = ("?", 0)
        try:
            with self._heads_lock:
                self._heads[connection] = head
            self.finish_request(connection, address)
        except Exception:
            self.handle_error(connection, address)
        finally:
            with self._heads_lock:
                self._heads.pop(connection, None)
            self.shutdown_request(connection)

    @contextlib.contextmanager
    def body_read(self, caller: str) -> Any:
        """Yields whether this caller may read one more body now (MAX_BODY_READS_PER_CALLER at once)."""
        with self._body_reads_lock:
            allowed = self._body_reads.get(caller, 0) < MAX_BODY_READS_PER_CALLER
            if allowed:
                self._body_reads[caller] = self._body_reads.get(caller, 0) + 1
        try:
            yield allowed
        finally:
            if allowed:
                with self._body_reads_lock:
                    self._body_reads[caller] -= 1
                    if not self._body_reads[caller]:
                        del self._body_reads[caller]

    def head(self, connection: socket.socket) -> bytes:
        """What the waiting room read of this connection's request (its line, headers, maybe some body)."""
        with self._heads_lock:
            return self._heads.get(connection, b"")

    def server_close(self) -> None:
        super().server_close()
        self._closed.set()
        self._wake_write.send(b"\0")
        self._waiting_room.join(5)
        # A worker blocked reading a slow body would hold the exit for its whole deadline (the pool's threads are
        # joined at exit): cut those reads now.
        self._cut_slow_readers(float("inf"))
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._wake_read.close()
        self._wake_write.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up is one log line, not a BrokenPipe traceback."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, CLIENT_GONE):
            log.info("client %s went away: %s", client_address[0], type(exc).__name__)
            return
        log.exception("error while handling a request from %s", client_address[0])


class _Prefixed(io.RawIOBase):
    """A connection's bytes: what was already read from it, then the socket itself (its timeout applies)."""

    def __init__(self, prefix: bytes, connection: socket.socket) -> None:
        self._prefix = memoryview(prefix)
        self._connection = connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            count = min(len(buffer), len(self._prefix))
            buffer[:count] = self._prefix[:count]
            self._prefix = self._prefix[count:]
            return count
        return self._connection.recv_into(buffer)


class Inflight:
    """Counts requests that hold a job, so shutdown can let them answer before the process exits."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            self._count += 1

    def __exit__(self, *_: object) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def drain(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout=timeout_s)


class EvalHandler(BaseHTTPRequestHandler):
    """slime's eval-delegate API on one connection; make_handler binds a subclass to one server's job service,
    bearer token and in-flight counter (the server builds a handler per request from the class alone)."""

    server_version = "quanteval-eval/2"
    eval_service: ClassVar[EvalService]
    bearer_token: ClassVar[str | None]
    inflight: ClassVar[Inflight]

    def log_message(self, fmt: str, *args: Any) -> None:  # to logging (stderr), not stdout
        log.info("%s %s", self.address_string(), fmt % args)

    def setup(self) -> None:
        """Each read and write on the connection times out after the idle timeout, and the whole request (headers
        and body) must be in within it from its first byte."""
        self.timeout = self.server.idle_timeout_s  # type: ignore[attr-defined]
        self.request_deadline = time.monotonic() + self.timeout
        self.server.reading(self.request, self.request_deadline)  # type: ignore[attr-defined]
        super().setup()
        # the request line and headers the waiting room read come first, then the socket
        self.rfile = io.BufferedReader(_Prefixed(self.server.head(self.request), self.connection))  # type: ignore[attr-defined]

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        # The headers are in. No body to wait for, or _read_body enforces the deadline itself (and answers 408): the
        # waiting room's cut stays only as a backstop.
        backstop = None if self.command != "POST" else self.request_deadline + 2
        self.server.reading(self.request, backstop)  # type: ignore[attr-defined]
        return parsed

    def finish(self) -> None:
        self.server.reading(self.request, None)  # type: ignore[attr-defined]
        super().finish()

    # --- Routes ---

    def do_GET(self) -> None:
        if self.path == "/health":
            self._health()
        elif not self._authorized():
            return
        elif self.path.startswith("/jobs/"):
            job = self.eval_service.get(self.path.removeprefix("/jobs/"))
            if job is None:
                self._send(404, {"error": "no such job"})
            else:
                self._send(200, job.response())
        else:
            self._send(404, {"error": f"no route GET {self.path}"})

    def do_POST(self) -> None:
        if self.path not in ("/evaluate", "/jobs"):
            self._send(404, {"error": f"no route POST {self.path}"})
            return
        if not self._authorized():
            return
        request = self._payload()
        if request is None:
            return
        with self.inflight:
            self._submit(request)

    def _health(self) -> None:
        service = self.eval_service
        backend = service.backend_status()
        if service.stopping:
            status, code = "stopping", 503
        else:
            status, code = ("ok", 200) if backend["backend_ready"] else ("not_ready", 503)
        self._send(code, {"status": status, **backend, "jobs": service.counts()})

    def _submit(self, request: EvalRequest) -> None:
        """Start the job (or attach to the one with the same key); /jobs answers at once, /evaluate when it ends."""
        key = self.headers.get("Idempotency-Key")
        try:
            job, attached = self.eval_service.submit(request, key=f"key-{key}" if key else None, detached=self.path == "/jobs")
        except ShuttingDown as exc:
            self._send(503, {"error": f"the eval server is shutting down ({exc}); retry against its successor"})
            return
        except KeyReused as exc:
            self._send(409, {"error": f"Idempotency-Key {key!r} names job {exc} of another payload; send a new key "
                                      "for a new evaluation (a retry of that job sends its payload unchanged)"})
            return
        if attached:
            log.info("rollout %s: request attached to job %s (%s)", request.rollout_id, job.id, job.status)
        if self.path == "/jobs":
            self._send(202, {"job_id": job.id, "status": job.status, "attached": attached})
        else:
            self._wait_and_answer(request, job)

    def _wait_and_answer(self, request: EvalRequest, job: Job) -> None:
        settings = self.eval_service.settings
        if not self.eval_service.wait(job, self._client_gone):
            log.warning("rollout %s: client went away while job %s ran; it is cancelled unless a retry attaches "
                        "within %.0f s", request.rollout_id, job.id, settings.orphan_grace_s)
            self.close_connection = True
            return
        body = job.response()
        code = job_http_status(job, settings)
        if code != 200:
            body["error"] = "; ".join(body["errors"]) or job.status
        self._send(code, body)

    # --- Request checks ---

    def _authorized(self) -> bool:
        if self.bearer_token is None:
            return True
        # RFC 7235: the scheme is case-insensitive (`bearer`, `BEARER`).
        scheme, _, sent = self.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), self.bearer_token.encode()):
            return True
        self._send(401, {"error": f"missing or wrong bearer token (Authorization: Bearer <${self.eval_service.settings.token_env}>)"})
        return False

    def _json_body(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None once an error has been sent: 400 (no body, not JSON, not an object),
        413 (over MAX_BODY_BYTES, not read), 408 (not sent within the idle timeout)."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            self._send(413, {"error": f"the body ({length} bytes) is over the limit of {MAX_BODY_BYTES} bytes"})
            self._discard_what_is_in_flight()
            return None
        if length <= 0:
            self._send(400, {"error": f"a JSON body of 1..{MAX_BODY_BYTES} bytes is required (with Content-Length)"})
            return None
        # the bearer token's holders are one caller (a stolen or shared token is still one budget); else one address
        caller = "token" if self.bearer_token is not None else self.client_address[0]
        with self.server.body_read(caller) as allowed:  # type: ignore[attr-defined]
            if not allowed:
                self.close_connection = True
                self._send(429, {"error": f"{MAX_BODY_READS_PER_CALLER} requests of this client are sending their "
                                          "bodies already; send the whole body at once, or retry when one is in"})
                self._discard_what_is_in_flight()
                return None
            body = self._read_body(length)
        if body is None:
            return None
        try:
            raw = json.loads(body, parse_constant=_no_constant)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            self._send(400, {"error": f"body is not valid JSON: {exc}"})
            return None
        except RecursionError:
            self._send(400, {"error": f"body is nested deeper than JSON parsing goes here; keep it under {MAX_JSON_DEPTH} levels"})
            return None
        if not isinstance(raw, dict):
            self._send(400, {"error": "body must be a JSON object"})
            return None
        if _depth(raw) > MAX_JSON_DEPTH:
            self._send(400, {"error": f"body is nested deeper than {MAX_JSON_DEPTH} levels; slime's payload needs 3"})
            return None
        return raw

    def _discard_what_is_in_flight(self, seconds: float = 1.0) -> None:
        """After an early answer: end our side, then drop what the client is still sending for a moment, so closing
        with unread data does not reset the connection before the client has read the answer."""
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + seconds
            while (remaining := deadline - time.monotonic()) > 0:
                self.connection.settimeout(remaining)
                if not self.connection.recv(65536):
                    break

    def _read_body(self, length: int) -> bytes | None:
        """`length` bytes, unless the client takes longer than the idle timeout from its first byte (then 408)."""
        chunks: list[bytes] = []
        left = length
        while left:
            remaining = self.request_deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 65536))
            except TimeoutError:
                log.warning("client %s did not send its %d-byte body within %.0f s", self.address_string(), length,
                            self.timeout)
                self.close_connection = True
                self._send(408, {"error": f"the body was not sent within {self.timeout:.0f} s"})
                return None
            if not chunk:
                self.close_connection = True
                return None
            chunks.append(chunk)
            left -= len(chunk)
        self.server.reading(self.request, None)  # type: ignore[attr-defined]
        self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    def _payload(self) -> EvalRequest | None:
        """slime's payload, or None once a 400 has been sent (bad body, invalid fields, or one the service refuses)."""
        raw = self._json_body()
        if raw is None:
            return None
        try:
            request = EvalRequest.model_validate(raw)
        except ValidationError as exc:
            self._send(400, {"error": payload_errors(exc)})
            return None
        reason = self.eval_service.refuse(request)
        if reason:
            self._send(400, {"error": reason})
            return None
        return request

    # --- The connection ---

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except CLIENT_GONE as exc:
            log.warning("client %s went away before the %d answer to %s: %s", self.address_string(), status,
                        self.path, type(exc).__name__)
            self.close_connection = True

    def _client_gone(self) -> bool:
        """Whether the client closed its connection while we were working (a retry may attach again)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; give a finite number")


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed JSON value (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def make_handler(service: EvalService, token: str | None, inflight: Inflight) -> type[EvalHandler]:
    """The handler class for one server: EvalHandler bound to its job service, bearer token and in-flight counter."""
    return type("Handler", (EvalHandler,), {"eval_service": service, "bearer_token": token, "inflight": inflight})


def serve(settings: ServerSettings, ready: threading.Event | None = None,
          stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or `stop` is set). Shutdown cancels every job and its process groups,
    answers in-flight requests with 503 and the reason, and marks the jobs cancelled in the ledger."""
    token = required_token(settings)
    service = EvalService(settings)
    inflight = Inflight()
    httpd = _Server((settings.bind_host, settings.port), make_handler(service, token, inflight), settings.idle_timeout_s)
    stopping = threading.Event()

    def shut(reason: str) -> None:
        if stopping.is_set():
            return
        stopping.set()
        log.warning("eval server stopping: %s", reason)
        service.shutdown(reason)
        if not inflight.drain(10):
            log.warning("some requests did not get their answer within 10 s of shutdown")
        httpd.shutdown()

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        threading.Thread(target=shut, args=(f"server received {name}",), daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    if stop is not None:
        threading.Thread(target=lambda: (stop.wait(), shut("stopped by its owner")), daemon=True).start()
    log.warning("eval server on http://%s:%d (backend %s, output %s, auth %s)", settings.bind_host, httpd.server_port,
                settings.backend, settings.root, "bearer token" if token else "none (loopback)")
    if ready:
        ready.set()
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        if not stopping.is_set():
            service.shutdown("server stopped")
        httpd.server_close()

"""The eval server's limits, each against a real `quanteval serve-eval` process on 127.0.0.1 (a client must not cost it unbounded time or threads):
idle and body-read timeouts, a bounded worker pool (idle sockets cost no thread and are closed), a token of at least
16 characters, a case-insensitive `Bearer` scheme, 413 for an oversized body, and a read-only ledger called
read-only."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_evalserver import _up, commands, http_request, payload, router, wait_for  # noqa: F401  (fixtures)

from quanteval.evalserver.backend import MIN_TOKEN_CHARS
from quanteval.faces.evalhttp import HTTP_WORKERS, MAX_BODY_BYTES
from quanteval.localproc import free_port

TOKEN = "q7Lm2Xv9Rt4Kp8Wz"  # MIN_TOKEN_CHARS characters, as a random secret is


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))


@pytest.fixture
def serve_eval(tmp_path: Path, commands: dict[str, str]) -> Iterator:  # noqa: F811
    started: list[ServerProcess] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> ServerProcess:
        port = free_port()
        log = tmp_path / f"server-{port}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "quanteval.faces.cli", "serve-eval", "--port", str(port),
                                     "--output-root", str(tmp_path / "out"), "--ns-command", commands["ns"], *flags],
                                    stdout=subprocess.DEVNULL, stderr=sink, env={**os.environ, **(env or {})},
                                    start_new_session=True)
        server = ServerProcess(proc, port, log)
        started.append(server)
        wait_for(lambda: proc.poll() is not None or _up(server.url), 30, "the server")
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.terminate()
            try:
                server.proc.wait(30)
            except subprocess.TimeoutExpired:
                server.proc.kill()


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_idle_sockets_take_no_thread_and_are_closed_after_the_idle_timeout(serve_eval):
    server = serve_eval("--idle-timeout-s", "3")
    before = server.threads()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(800)]
    try:
        time.sleep(1)
        # the old server had one thread per connection: 800 more
        assert server.threads() <= before + HTTP_WORKERS, server.threads()
        started = time.monotonic()
        assert http_request(server.url, "GET", "/health", timeout=5)[0] == 503  # still answers (stand-in ns: not ready)
        assert time.monotonic() - started < 3
        wait_for(lambda: all(_closed_by_peer(sock) for sock in idle), 15, "the idle sockets to be closed")
    finally:
        for sock in idle:
            sock.close()
    assert server.proc.poll() is None


def test_a_half_sent_body_is_answered_408_and_closed_after_the_timeout(serve_eval):
    server = serve_eval("--idle-timeout-s", "2")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /evaluate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"rollout_id\": 1")
        sock.settimeout(10)
        started = time.monotonic()
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.0 408") and b"not sent within 2 s" in answer
    assert 1 < waited < 6
    assert _up(server.url)


def test_sigterm_stops_the_server_at_once_while_clients_trickle_their_requests(serve_eval):
    """A worker blocked reading a slow body held the exit for the whole read deadline (30 s by default; the pool's
    threads are joined at exit): SIGTERM now cuts those reads, also through 70 half-sent requests."""
    import signal

    server = serve_eval()
    held = []
    try:
        for _ in range(70):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"POST /evaluate HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"POST /evaluate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        held.append(slow)
        time.sleep(1)  # the slow body is with a worker now
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - started < 5
    finally:
        for sock in held:
            sock.close()


def test_a_body_over_the_limit_is_413_unread(serve_eval):
    server = serve_eval()
    size = 5 * 1024 * 1024
    assert size > MAX_BODY_BYTES
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /evaluate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {size}\r\n\r\n".encode() + b"[" * 65536)
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):  # the server ends its side after the answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 413") and b"over the limit" in answer


@pytest.mark.parametrize("token", ["x", "k" * (MIN_TOKEN_CHARS - 1), "k" * MIN_TOKEN_CHARS, "abab" * 8])
def test_a_short_or_guessable_token_is_refused_beyond_loopback(serve_eval, token):
    server = serve_eval("--host", "0.0.0.0", "--token-env", "EVAL_TOKEN_FOR_TEST", env={"EVAL_TOKEN_FOR_TEST": token})
    assert server.proc.wait(30) == 1
    text = server.log.read_text()
    assert "EVAL_TOKEN_FOR_TEST" in text and "refusing to bind 0.0.0.0" in text and f"={token}" not in text
    if len(token) < MIN_TOKEN_CHARS:
        assert f"fewer than {MIN_TOKEN_CHARS}" in text and f"has {len(token)} characters" in text
    else:
        assert f"uses {len(set(token))} distinct characters" in text


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(serve_eval, scheme):
    server = serve_eval("--token-env", "EVAL_TOKEN_FOR_TEST", env={"EVAL_TOKEN_FOR_TEST": TOKEN})
    assert http_request(server.url, "GET", "/jobs/nope")[0] == 401
    assert http_request(server.url, "GET", "/jobs/nope", headers={"Authorization": f"{scheme} wrong"})[0] == 401
    status, answer = http_request(server.url, "GET", "/jobs/nope", headers={"Authorization": f"{scheme} {TOKEN}"})
    assert status == 404 and answer == {"error": "no such job"}


def test_a_read_only_ledger_is_reported_as_read_only(serve_eval, router, tmp_path):  # noqa: F811
    if not shutil.which("chattr"):
        pytest.skip("needs chattr to make a file read-only for root")
    ledger_file = tmp_path / "ledger.sqlite3"
    from quanteval import ledger

    with ledger.connect(ledger_file):
        pass  # a valid, empty ledger
    if subprocess.run(["chattr", "+i", str(ledger_file)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute")
    try:
        server = serve_eval(env={"QUANTEVAL_LEDGER": str(ledger_file)})
        status, answer = http_request(server.url, "POST", "/evaluate", payload(router.url, {"name": "gsm8k"}))
        assert status == 200 and answer["metrics"]  # the ledger is a record, not a precondition
        wait_for(lambda: "ledger" in server.log.read_text(), 10, "the ledger warning")
        text = server.log.read_text()
        assert "is read-only" in text and "QUANTEVAL_LEDGER" in text
        assert "unreadable" not in text and "move it aside" not in text
    finally:
        subprocess.run(["chattr", "-i", str(ledger_file)], check=False)


def test_headers_trickled_byte_by_byte_do_not_hold_a_worker_past_the_timeout(serve_eval):
    server = serve_eval("--idle-timeout-s", "2")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        ended = False
        while time.monotonic() - started < 10 and not ended:
            try:
                sock.sendall(b"X")  # one header byte a second: each read is within the timeout, the request never is
                time.sleep(1)
                sock.settimeout(0.05)
                ended = sock.recv(4096) is not None  # the server answered (400) or closed
            except TimeoutError:
                continue
            except OSError:
                ended = True
        waited = time.monotonic() - started
    assert ended and waited < 5, waited
    assert _up(server.url)


def test_seventy_half_sent_requests_hold_no_worker_and_health_answers_through_them(serve_eval):
    """The probe's slowloris: ~70 sockets that send part of a request line and stop. The waiting room reads headers
    without a thread, so none holds a worker for the idle timeout and /health keeps answering; past
    MAX_PENDING_PER_CLIENT half-sent requests, one client's next is closed at once."""
    from quanteval.faces.evalhttp import MAX_PENDING_PER_CLIENT

    server = serve_eval("--idle-timeout-s", "30")
    before = server.threads()
    half_sent = []
    for _ in range(70):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /evaluate HTT")
        half_sent.append(sock)
    try:
        time.sleep(1)
        for _ in range(5):
            started = time.monotonic()
            assert http_request(server.url, "GET", "/health", timeout=5)[0] == 503  # answered (stand-in ns: not ready)
            assert time.monotonic() - started < 2
        assert server.threads() <= before + HTTP_WORKERS
        closed = sum(_closed_by_peer(sock) for sock in half_sent)
        assert closed == 70 - MAX_PENDING_PER_CLIENT, closed  # the client's first 32 wait for the timeout, no more
    finally:
        for sock in half_sent:
            sock.close()
    assert server.proc.poll() is None


def test_token_holders_trickling_150_bodies_hold_a_bounded_share_of_workers_and_health_answers(serve_eval):
    """150 connections with the bearer token, each sending its headers and a byte of its body: at most
    MAX_BODY_READS_PER_CALLER hold a worker (the rest are answered 429 at once), so /health keeps answering."""
    server = serve_eval("--idle-timeout-s", "30", "--token-env", "EVAL_TOKEN_FOR_TEST", env={"EVAL_TOKEN_FOR_TEST": TOKEN})
    trickling = []
    try:
        for _ in range(150):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(f"POST /evaluate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                         f"Content-Length: 1000\r\n\r\n{{".encode())
            trickling.append(sock)
        time.sleep(3)  # every connection is with a worker, or answered
        answered = []
        for _ in range(5):
            started = time.monotonic()
            status, _ = http_request(server.url, "GET", "/health", timeout=5)
            answered.append((status, time.monotonic() - started))
        assert all(status == 503 and waited < 2 for status, waited in answered), answered  # stand-in ns: not ready
        from quanteval.faces.evalhttp import MAX_BODY_READS_PER_CALLER

        refused = 0
        for sock in trickling:
            sock.settimeout(0.2)
            with contextlib.suppress(OSError):
                refused += sock.recv(4096).startswith(b"HTTP/1.0 429")
        assert refused == 150 - MAX_BODY_READS_PER_CALLER, refused
    finally:
        for sock in trickling:
            sock.close()

"""A small OpenAI-compatible router standing in for the trainer's SGLang router (no GPU here).

Answers chat completions the way a model would, so real graders see real text:
- "What is A+B?"            -> "... \\boxed{A+B}", except 1+1 -> \\boxed{3} (one wrong answer per 12)
- "... equal to N ... A) .." -> "Answer: \\boxed{<letter of N>}", except N == 1 -> the next letter (wrong)
It records every request body (the tests check which sampling parameters arrived), can delay answers
(--delay-s / `delay_s`) and answers 500 to every prompt containing "FAIL" (or to all, with `fail`). Run in-process (Router()) or as a process:

    python openai_router.py --port 0     # prints "listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import ThreadingHTTPServer

from jsonhttp import JsonHandler  # tests/standins is on sys.path wherever a stand-in runs


def answer(prompt: str) -> str:
    if match := re.search(r"What is (\d+)\+(\d+)\?", prompt):
        a, b = int(match[1]), int(match[2])
        return f"Adding them gives \\boxed{{{3 if (a, b) == (1, 1) else a + b}}}"
    if match := re.search(r"equal to (\d+)", prompt):
        wanted = match[1]
        options = dict(re.findall(r"([A-D])\) (\d+)", prompt))
        letter = next((k for k, v in options.items() if v == wanted), "A")
        if wanted == "1":
            letter = "ABCD"[("ABCD".index(letter) + 1) % 4]
        return f"Let me compare the options.\nAnswer: \\boxed{{{letter}}}"
    return "I do not know."


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many evaluations connect at once in the benchmarks


class Router:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, delay_s: float = 0.0) -> None:
        self.requests: list[dict] = []
        self.delay_s = delay_s
        self.fail = False
        self.lock = threading.Lock()
        router = self

        class Handler(JsonHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path in ("/v1/models", "/models"):
                    self._send(200, {"object": "list", "data": [{"id": "slime-openai-model", "object": "model"}]})
                elif self.path == "/health":
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with router.lock:
                    router.requests.append({"path": self.path, **body})
                if router.delay_s:
                    time.sleep(router.delay_s)
                prompt = (body.get("messages") or [{}])[-1].get("content", "")
                if router.fail or "FAIL" in prompt:
                    self._send(500, {"error": {"message": "router failure", "type": "server_error"}})
                    return
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": f"no route {self.path}"})
                    return
                text = answer(body["messages"][-1]["content"])
                self._send(200, {
                    "id": f"chatcmpl-{len(router.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "m"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                })

        self.httpd = _Server((host, port), Handler)
        self.url = f"http://{host}:{self.httpd.server_port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args()
    router = Router(port=args.port, delay_s=args.delay_s)
    print(f"listening on {router.url}", flush=True)
    threading.Event().wait()

"""A real HTTP process standing in for `python -m sglang.launch_server` / `vllm serve` where no GPU exists.

It takes the server's own arguments (the same argv quanteval plans), serves SGLang's and vLLM's
endpoints on the requested host/port, and can be told to behave like a failing SGLang through its
own `--fake-*` options, which go first in the launcher prefix
(QUANTEVAL_SGLANG_LAUNCHER="python fake_inference_server.py --fake-mode oom"):

  healthy     load for --fake-load-s seconds (/health answers 503), then serve
  oom         print SGLang's "Not enough memory" line and exit 1
  cuda-graph  print SGLang's "Capture cuda graph failed" error and exit 1
  hang        keep loading forever (/health stays 503)
  fail        print --fake-fail-line (any server's error message) and exit 1

--fake-workers N starts N child processes, as SGLang starts scheduler/detokenizer processes, and
--fake-ignore-sigterm makes the server ignore SIGTERM, so stopping must escalate to SIGKILL.
--fake-answers sum answers each `a+b` prompt with its sum, as the embedded tiny-add does (a verdict of "nothing lost"
where the serving, not the model, is what a test exercises).
--fake-fault KIND@REGEX (repeatable) fails each request whose prompt matches REGEX: `500` answers HTTP 500,
`disconnect` closes the connection without a reply (what a client sees of a request that timed out upstream),
`empty` answers HTTP 200 with no choices, `garbled` answers text with no number in it (an unparseable answer);
--fake-fault-model TEXT: only when the served model's path contains TEXT (one launcher serves both sides of a test).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from jsonhttp import JsonHandler  # its own folder is on sys.path: it runs as a script

READY_LINE = "The server is fired up and ready to roll!"
FAULTS = ("500", "disconnect", "empty", "garbled")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fake-mode", choices=["healthy", "oom", "cuda-graph", "hang", "fail"], default="healthy")
    parser.add_argument("--fake-load-s", type=float, default=0.5)
    parser.add_argument("--fake-workers", type=int, default=0)
    parser.add_argument("--fake-fail-line", default="RuntimeError: server failed")
    parser.add_argument("--fake-log-lines", type=int, default=0, help="print this many filler lines while loading")
    parser.add_argument("--fake-ignore-sigterm", action="store_true")
    parser.add_argument("--fake-answers", choices=["hello", "sum"], default="hello",
                        help="hello: one greeting for every request; sum: the sum of the last `a+b` in the prompt, as the "
                             "embedded tiny-add answers its benchmark")
    parser.add_argument("--fake-answer-s", type=float, default=0.0, help="seconds each completion takes")
    parser.add_argument("--fake-fault", action="append", default=[], metavar="KIND@REGEX",
                        help="500, disconnect, empty or garbled for each prompt matching REGEX")
    parser.add_argument("--fake-fault-model", default="", help="inject the faults only into a model whose path has this")
    parser.add_argument("model", nargs="?", help="vLLM style: `vllm serve <model>`")
    parser.add_argument("--model-path", "--model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--context-length", "--max-model-len", type=int, default=4096)
    args, _ = parser.parse_known_args(argv)  # every other real server flag is accepted and ignored
    return args


def main() -> None:  # noqa: C901
    args = parse_args(sys.argv[1:])
    model_path = args.model_path or args.model or "model"
    served_name = args.served_model_name or model_path
    state = {"ready": False}

    faults = []
    for fault in args.fake_fault:
        kind, _, pattern = fault.partition("@")
        if kind not in FAULTS or not pattern:
            sys.exit(f"--fake-fault {fault!r}: give KIND@REGEX, KIND one of {', '.join(FAULTS)}")
        faults.append((kind, re.compile(pattern)))

    def prompt_of(body: dict) -> str:
        return str(body.get("prompt") or " ".join(str(m.get("content", "")) for m in body.get("messages") or []))

    def fault_for(body: dict) -> str | None:
        if args.fake_fault_model not in model_path:
            return None
        return next((kind for kind, pattern in faults if pattern.search(prompt_of(body))), None)

    def answer(body: dict) -> str:
        if args.fake_answers == "hello":
            return "Hello from the stand-in."
        if fault_for(body) == "garbled":
            return "I would rather not say."
        prompt = prompt_of(body)
        terms = re.findall(r"(-?\d+)\s*\+\s*(-?\d+)", str(prompt))
        return str(int(terms[-1][0]) + int(terms[-1][1])) if terms else "?"

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if not state["ready"]:
                self._send(503, {"error": "server is starting"})
            elif self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": served_name, "object": "model", "root": model_path, "max_model_len": args.context_length}
                ]})
            elif self.path == "/model_info":
                self._send(200, {"model_path": model_path, "tokenizer_path": model_path, "is_generation": True})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            time.sleep(args.fake_answer_s)
            if not state["ready"]:
                self._send(503, {"error": "server is starting"})
            elif self.path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, {"error": f"no route {self.path}"})
            elif body.get("model") not in (served_name, model_path):
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            elif (fault := fault_for(body)) == "500":
                self._send(500, {"error": {"message": "Internal Server Error (injected)"}})
            elif fault == "disconnect":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif fault == "empty":
                self._send(200, {"id": "chatcmpl-standin", "object": "chat.completion", "model": served_name, "choices": []})
            elif self.path == "/v1/completions":
                self._send(200, {
                    "id": "cmpl-standin", "object": "text_completion", "model": served_name,
                    "choices": [{"index": 0, "finish_reason": "stop", "text": " " + answer(body)}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
                })
            else:
                self._send(200, {
                    "id": "chatcmpl-standin", "object": "chat.completion", "model": served_name,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": answer(body)}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
                })

        def log_message(self, format: str, *log_args: object) -> None:
            print(f"INFO: {self.address_string()} - {format % log_args}", flush=True)

    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(args.fake_workers)]
    print(f"worker pids: {[w.pid for w in workers]}", flush=True)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"server_args: model_path={model_path} served_model_name={served_name} port={args.port}", flush=True)
    print("Load weight begin.", flush=True)
    for i in range(args.fake_log_lines):
        print(f"Loading safetensors checkpoint shard {i}: {'#' * 60}")
    sys.stdout.flush()
    if args.fake_mode == "hang":
        while True:
            time.sleep(3600)
    time.sleep(args.fake_load_s)
    if args.fake_mode == "oom":
        print("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", flush=True)
        sys.exit(1)
    if args.fake_mode == "cuda-graph":
        print("Exception: Capture cuda graph failed: CUDA error: out of memory", flush=True)
        sys.exit(1)
    if args.fake_mode == "fail":
        print(args.fake_fail_line, flush=True)
        sys.exit(1)
    state["ready"] = True
    print(f"INFO: Uvicorn running on http://{args.host}:{args.port}", flush=True)
    print(READY_LINE, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()

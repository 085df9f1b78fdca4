"""`python` for a local `nel eval run` that quanteval started (run by nel-next's Python, `-I`: the standard library only).

nemo-evaluator 0.3.0 starts a managed model server (a `vllm` or `sglang` service) of a local run as `python -m MODULE
--model M --port P EXTRA_ARGS` (orchestration/model_server.ProcessModelDeployment), `python` looked up on its PATH.
quanteval puts a folder first on that PATH whose `python` runs this file with the run's plan (servers.py writes both),
so that the server:

- runs with the Python that has its framework (here the project's vLLM venv: the PATH's python has no vLLM), with the
  plan's environment defaults (vLLM's CPU KV-cache size; the environment's own values win);
- writes its output to the run's logs/ from its first line: nel-next drains the server's pipe to a file only once the
  server answers /health, so one that died starting left nothing but "Model process exited with code 1";
- serves under the name nel-next's requests use (served_model_name, else the service's name), which nel-next's local
  command leaves out (its SLURM job passes it): without it every request is a 404.

Anything else nel-next runs as `python` (a scorer executing code) runs with the PATH's own python, untouched.
"""

import json
import os
import shlex
import sys


def main(plan_path: str, args: list[str]) -> None:
    with open(plan_path, encoding="utf-8") as handle:
        plan = json.load(handle)
    server = plan["servers"].get(args[1]) if len(args) > 1 and args[0] == "-m" else None
    if server is None:
        if not plan["python"]:
            sys.exit("python: not found")
        os.execv(plan["python"], [plan["python"], *args])
    port = args[args.index("--port") + 1] if "--port" in args[:-1] else ""
    name = server["served_names"].get(port)
    extra = ["--served-model-name", name] if name and "--served-model-name" not in args else []
    log = os.open(server["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    argv = [server["python"], *args, *extra]
    os.write(log, f"$ {shlex.join(argv)}\n".encode())  # which Python started it: the first thing run_logs shows
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.execve(argv[0], argv, {**server["env"], **os.environ})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

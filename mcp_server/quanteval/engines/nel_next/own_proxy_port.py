"""nel-next's CLI with each run's adapter proxy on a port the OS picks (run by the nel-next venv's Python, `-P`).

Why: nemo-evaluator 0.3.0 puts every benchmark's adapter proxy on 127.0.0.1:4000 when a probe finds it free, then
binds it later (`adapters.proxy._find_free_port(4000)`), and waits only for *a* healthy proxy there. Two runs on one
host (a baseline and a quantized run side by side, two users, a canary beside a full run) race for it: the loser's
uvicorn fails to bind in its thread, its health check passes against the winner's proxy, and its requests go to the
other run's model (answers scored as its own) or, once that run ends, nowhere (seen: 200 of 200 requests "Model
endpoint unreachable" at 127.0.0.1:4000). A port from bind(0) is not handed out twice while held.
"""

import sys

from nemo_evaluator.adapters import proxy
from nemo_evaluator.cli.main import cli

_find_free_port = getattr(proxy, "_find_free_port", None)
if _find_free_port is not None:  # a release without it chose its port some other way: nothing to correct
    proxy._find_free_port = lambda preferred: _find_free_port(0)

if __name__ == "__main__":
    sys.argv[0] = "nel"
    sys.exit(cli())

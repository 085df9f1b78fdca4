"""nel-next's CLI as quanteval runs it (by the nel-next venv's Python, `-P`), here and inside the SLURM jobs it submits.

1. Each run's adapter proxy on a port the OS picks. nemo-evaluator 0.3.0 puts every benchmark's adapter proxy on
   127.0.0.1:4000 when a probe finds it free, then binds it later (`adapters.proxy._find_free_port(4000)`), and waits
   only for *a* healthy proxy there. Two runs on one host (a baseline and a quantized run side by side, two users, a
   canary beside a full run, two SLURM jobs sharing a node's GPUs) race for it: the loser's uvicorn fails to bind in
   its thread, its health check passes against the winner's proxy, and its requests go to the other run's model
   (answers scored as its own) or, once that run ends, nowhere (seen: 200 of 200 requests "Model endpoint unreachable"
   at 127.0.0.1:4000). A port from bind(0) is not handed out twice while held.
2. A job nel-next submits from here (`nel eval run --submit`) runs the node's plain `nel`: its script gets a shell
   function `nel` first that runs this file's text with the same Python, so the job's proxy takes a port of its own
   too; and the script asks its managed server for /health every second instead of every 5 s (the same budget: 5x
   the attempts), where the 5 s poll cost each job 2.5 s on average.
"""

import re
import sys

from nemo_evaluator.adapters import proxy
from nemo_evaluator.cli.main import cli

_find_free_port = getattr(proxy, "_find_free_port", None)
if _find_free_port is not None:  # a release without it chose its port some other way: nothing to correct
    proxy._find_free_port = lambda preferred: _find_free_port(0)

# Defined before the job's first native `nel eval run` (a containerised one, `srun ... nel`, runs the image's own).
JOB_NEL = """\
# quanteval: nel-next's CLI with its adapter proxy on a port of its own (jobs sharing this node race for 4000)
IFS= read -r -d '' _QUANTEVAL_NEL <<'{end}' || true
{source}
{end}
nel() {{
    local cli python
    cli=$(type -P nel) || {{ echo "nel: not on the PATH" >&2; return 127; }}
    python="${{cli%/*}}/python"
    if [ -x "$python" ]; then "$python" -P -c "$_QUANTEVAL_NEL" "$@"; else command nel "$@"; fi
}}
"""
END_OF_SOURCE = "QUANTEVAL_NEL_" + "SOURCE"  # never a line of the source it ends
FIRST_NATIVE_RUN = re.compile(r"^nel eval run ", re.MULTILINE)
HEALTH_POLL = ("seq 1 {max_attempts}", "    sleep 5\ndone")


def _into_every_job(source: str) -> None:
    """nel-next's sbatch scripts with JOB_NEL (this file's text) and a 1 s health poll; nothing changed where a release
    writes them otherwise."""
    try:
        from nemo_evaluator.orchestration import slurm_gen
    except ImportError:
        return
    template = getattr(slurm_gen, "_HEALTH_WAIT", "")
    if all(part in template for part in HEALTH_POLL):
        slurm_gen._HEALTH_WAIT = template.replace(HEALTH_POLL[0], "seq 1 $(( {max_attempts} * 5 ))").replace(
            HEALTH_POLL[1], "    sleep 1\ndone")
    generate = getattr(slurm_gen, "generate_sbatch", None)
    if generate is None:
        return

    def generate_sbatch(*args, **kwargs):
        script, *rest = generate(*args, **kwargs)
        found = FIRST_NATIVE_RUN.search(script)
        if found:
            script = script[:found.start()] + JOB_NEL.format(source=source, end=END_OF_SOURCE) + script[found.start():]
        return (script, *rest)

    slurm_gen.generate_sbatch = generate_sbatch


if __name__ == "__main__":
    if "__file__" in globals():  # run from its file (here), not as a job's `python -c` text
        with open(__file__, encoding="utf-8") as own:
            _into_every_job(own.read())
    sys.argv[0] = "nel"
    sys.exit(cli())

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
3. A job whose environment sets WAIT_VARIABLE (a cluster evaluation's canary) serves on once its benchmarks are done:
   it writes the run's exit code to DONE_FILE and waits that many seconds for quanteval's word in NEXT_FILE, the
   directory of the next run (the full run, once the canary passed; its configs written there) to evaluate against the
   same server, or nothing. Its server starts once, not once per run. Whoever first makes CLAIM_DIR decides: quanteval
   before it writes the word, the job before it gives up waiting, so a word is never left unread.

Only the standard library is imported at the top: quanteval reads the names below from this file.
"""

import re
import sys

WAIT_VARIABLE = "QUANTEVAL_NEXT_RUN_WAIT_S"
DONE_FILE = "quanteval-evaluated"
CLAIM_DIR = "quanteval-claimed"
NEXT_FILE = "quanteval-next"

# Defined before the job's first native `nel eval run` (a containerised one, `srun ... nel`, runs the image's own).
JOB_NEL = """\
# quanteval: nel-next's CLI with its adapter proxy on a port of its own (jobs sharing this node race for 4000)
IFS= read -r -d '' _QUANTEVAL_NEL <<'{end}' || true
{source}
{end}
nel() {{
    local cli python
    cli=$(type -P nel) || {{ command nel "$@"; return; }}  # the shell's own "command not found"
    python="${{cli%/*}}/python"
    if [ "${{1-}} ${{2-}}" = "eval report" ] && [ -n "${{{wait}:-}}" ] && [ -z "${{_QUANTEVAL_HELD:-}}" ]; then
        _QUANTEVAL_HELD=1
        _quanteval_next_run
    fi
    if [ -x "$python" ]; then "$python" -P -c "$_QUANTEVAL_NEL" "$@"; else command nel "$@"; fi
}}
# quanteval: the benchmarks are done; serve on for the next run quanteval names (the full run once the canary passed)
_quanteval_next_run() {{
    local waited=0 dir config name
    printf '%s\\n' "${{NEL_EXIT_CODE:-0}}" > "$OUTPUT_DIR/{done}.tmp" && mv -f "$OUTPUT_DIR/{done}.tmp" "$OUTPUT_DIR/{done}"
    echo "quanteval: evaluated (exit ${{NEL_EXIT_CODE:-0}}); serving on up to ${{{wait}}} s for the next run"
    while [ ! -e "$OUTPUT_DIR/{next}" ]; do
        if [ "$waited" -ge "${{{wait}}}" ] && mkdir "$OUTPUT_DIR/{claim}" 2>/dev/null; then
            echo "quanteval: no next run named within ${{{wait}}} s"
            return 0
        fi
        sleep 1
        waited=$((waited + 1))
    done
    dir=$(cat "$OUTPUT_DIR/{next}")
    if [ -z "$dir" ]; then echo "quanteval: no next run"; return 0; fi
    echo "quanteval: the next run in $dir, against this job's server"
    mkdir -p "$dir/logs"
    ln -sf "$OUTPUT_DIR"/logs/slurm-"$SLURM_JOB_ID".log "$OUTPUT_DIR"/logs/server-*-"$SLURM_JOB_ID".log "$dir/logs/" 2>/dev/null
    NEL_EXIT_CODE=0
    for config in "$dir"/config_*.yaml; do
        name=${{config##*/config_}}
        name=${{name%.yaml}}
        mkdir -p "$dir/$name"
        NEL_OUTPUT_DIR="$dir/$name" nel eval run "$config" >> "$dir/logs/eval-$name-$SLURM_JOB_ID.log" 2>&1 || NEL_EXIT_CODE=1
        ln -sf "eval-$name-$SLURM_JOB_ID.log" "$dir/logs/eval-$name.log"
    done
    nel eval report "$dir" -f markdown -o "$dir/report.md"
}}
"""
END_OF_SOURCE = "QUANTEVAL_NEL_" + "SOURCE"  # never a line of the source it ends
FIRST_NATIVE_RUN = re.compile(r"^nel eval run ", re.MULTILINE)
HEALTH_POLL = ("seq 1 {max_attempts}", "    sleep 5\ndone")


def own_proxy_port() -> None:
    """nel-next's adapter proxies on ports from bind(0); nothing changed in a release that chose its port otherwise."""
    from nemo_evaluator.adapters import proxy

    find_free_port = getattr(proxy, "_find_free_port", None)
    if find_free_port is not None:
        proxy._find_free_port = lambda preferred: find_free_port(0)


def into_every_job(source: str) -> None:
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
    function = JOB_NEL.format(source=source, end=END_OF_SOURCE, wait=WAIT_VARIABLE, done=DONE_FILE, claim=CLAIM_DIR,
                              next=NEXT_FILE)

    def generate_sbatch(*args, **kwargs):
        script, *rest = generate(*args, **kwargs)
        found = FIRST_NATIVE_RUN.search(script)
        if found:
            script = script[:found.start()] + function + script[found.start():]
        return (script, *rest)

    slurm_gen.generate_sbatch = generate_sbatch


def main() -> None:
    own_proxy_port()
    if "__file__" in globals():  # run from its file (here), not as a job's `python -c` text
        with open(__file__, encoding="utf-8") as own:
            into_every_job(own.read())
    from nemo_evaluator.cli.main import cli

    sys.argv[0] = "nel"
    sys.exit(cli())


if __name__ == "__main__":
    main()

# Progress for scripts/setup and scripts/setup-* (sourced, not run): a line per step on stderr saying what is being
# installed and the seconds since setup began, a heartbeat while a long step runs, and the tools' own output in
# the log ($QUANTEVAL_SETUP_LOG, default .venv-setup.log), so a fresh clone's minutes of pip never look like a hang.
#   step "what it installs" command args...   runs the command with its output in the log; stops setup if it fails
#   note "text"                                one progress line
# QUANTEVAL_SETUP_DRY_RUN=1 (scripts/setup --dry-run): steps say what they would run and run nothing.
# QUANTEVAL_SETUP_HEARTBEAT_S: seconds between heartbeats (default 15).

: "${QUANTEVAL_SETUP_LOG:=.venv-setup.log}"
: "${QUANTEVAL_SETUP_STARTED:=$EPOCHSECONDS}"  # setup's start, shared with the setup-* scripts it runs
: "${QUANTEVAL_SETUP_HEARTBEAT_S:=15}"
export QUANTEVAL_SETUP_LOG QUANTEVAL_SETUP_STARTED QUANTEVAL_SETUP_HEARTBEAT_S

note() {
  printf '[setup %4ss] %s\n' "$((EPOCHSECONDS - QUANTEVAL_SETUP_STARTED))" "$*" >&2
}

dry_run() {
  [ -n "${QUANTEVAL_SETUP_DRY_RUN:-}" ]
}

step() {
  local what=$1 started=$EPOCHSECONDS pid rc=0 next last command
  shift
  printf -v command '%q ' "$@"
  if dry_run; then
    note "$what (dry run, would run: ${command% })"
    return 0
  fi
  note "$what ..."
  printf '\n=== %s: %s\n' "$what" "${command% }" >>"$QUANTEVAL_SETUP_LOG"
  "$@" >>"$QUANTEVAL_SETUP_LOG" 2>&1 </dev/null &
  pid=$!
  next=$((started + QUANTEVAL_SETUP_HEARTBEAT_S))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    if [ "$EPOCHSECONDS" -ge "$next" ]; then
      last=$(tail -n 1 "$QUANTEVAL_SETUP_LOG" | tr -d '\r' | cut -c1-100)
      note "  ... still $what, $((EPOCHSECONDS - started)) s so far${last:+ (log: $last)}"
      next=$((next + QUANTEVAL_SETUP_HEARTBEAT_S))
    fi
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    note "FAILED after $((EPOCHSECONDS - started)) s (exit $rc): $what. The end of $QUANTEVAL_SETUP_LOG:"
    tail -n 20 "$QUANTEVAL_SETUP_LOG" >&2
    exit "$rc"
  fi
  note "  done in $((EPOCHSECONDS - started)) s"
}

# Where NeMo-Skills comes from, for scripts/setup-nel-next (skills:// in nel-next's venv) and scripts/setup-nemo-skills
# (`ns` for the eval server): one commit, one place (sourced, not run; needs scripts/progress.sh).
#
# NeMo-Skills is not on the package index. The source is, first found:
#   $1's variable (QUANTEVAL_NEL_NEXT_SKILLS_SRC / QUANTEVAL_NEMO_SKILLS_SRC): a source tree, a .tar.gz of one, or
#     anything pip installs (a git URL with its commit: git+https://github.com/NVIDIA-NeMo/Skills@467b057);
#   ../shared/vendor/nemo-skills-$NEMO_SKILLS_COMMIT.tar.gz (this project's machines: they have no GitHub);
#   the pinned upstream commit from GitHub (a user's machine).
# 467b057 (2026-05-18): nel-next 0.3.0 unpacks two values from get_dataset_module, which NeMo-Skills returned from
# 144c70b (2026-02-19) on; earlier commits returned three. The package reads it from
# mcp_server/quanteval/engines/nemo_skills_source.py (tests/test_nemo_skills_source.py holds the two equal).

NEMO_SKILLS_COMMIT=467b057
NEMO_SKILLS_UPSTREAM="git+https://github.com/NVIDIA-NeMo/Skills@$NEMO_SKILLS_COMMIT"
NEMO_SKILLS_VENDORED=${QUANTEVAL_VENDOR_DIR:-../shared/vendor}/nemo-skills-$NEMO_SKILLS_COMMIT.tar.gz

# nemo_skills_source VARIABLE: prints the source to install.
nemo_skills_source() {
  local chosen=${!1:-}
  if [ -n "$chosen" ]; then
    printf '%s\n' "$chosen"
  elif [ -e "$NEMO_SKILLS_VENDORED" ]; then
    printf '%s\n' "$NEMO_SKILLS_VENDORED"
  else
    printf '%s\n' "$NEMO_SKILLS_UPSTREAM"
  fi
}

# nemo_skills_fingerprint SOURCE: what a setup stamp keys the installed source by. A file by its content: the
# vendored tarball is copied afresh onto each session's machine, so its date changes while it stays the same commit.
nemo_skills_fingerprint() {
  if [ -f "$1" ]; then
    sha256sum <"$1"
  else
    ls -l "$1" 2>/dev/null || true
  fi
}

# install_nemo_skills PIP SOURCE VARIABLE: `pip install --no-deps` of SOURCE (a .tar.gz is unpacked first: it is a
# source tree, not an sdist). Returns 1 after one line saying what is missing and what to set when it cannot.
install_nemo_skills() {
  local pip=$1 source=$2 variable=$3 target=$2 unpacked=""
  if [ -f "$source" ] && ! dry_run; then
    unpacked=$(mktemp -d)
    tar -xzf "$source" -C "$unpacked"
    target=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -1)
  elif [ ! -e "$source" ] && [[ $source != *://* ]]; then
    note "NeMo-Skills: $variable=$source is neither a path that exists nor a URL pip installs"
    return 1
  fi
  if dry_run; then
    note "NeMo-Skills: installing $source (dry run, would run: $pip install --no-deps $target)"
    return 0
  fi
  note "NeMo-Skills: installing $source (no deps) ..."
  printf '\n=== NeMo-Skills: %s install --no-deps %s\n' "$pip" "$target" >>"$QUANTEVAL_SETUP_LOG"
  if ! "$pip" install --no-deps "$target" >>"$QUANTEVAL_SETUP_LOG" 2>&1 </dev/null; then
    [ -n "$unpacked" ] && rm -rf "$unpacked"
    local why=""
    [[ $source == *://* ]] && why=" (no network to GitHub?)"
    note "NeMo-Skills: could not install $source$why: set $variable to a NeMo-Skills $NEMO_SKILLS_COMMIT source tree, .tar.gz or pip URL (pip's output: $QUANTEVAL_SETUP_LOG)"
    return 1
  fi
  [ -n "$unpacked" ] && rm -rf "$unpacked"
  return 0
}

"""Every environment variable quanteval reads or reports, and where its state lives.

One place for these names: `env.example` lists exactly these (a test checks it), and
tools report names only — never values.
"""

from __future__ import annotations

import os
from pathlib import Path

# name -> what it is for. Values are secrets or paths; tools only ever report the names.
KNOWN_ENV_VARS: dict[str, str] = {
    "HF_TOKEN": "Hugging Face token for gated models and datasets (read by NEL containers).",
    "HF_HOME": "Hugging Face home; the hub cache under it is where inspect_checkpoint looks for HF handles.",
    "HF_HUB_CACHE": "Hugging Face hub cache directory, if not under HF_HOME.",
    "NGC_API_KEY": "NGC key for pulling NVIDIA containers (nvcr.io) and NIM deployments.",
    "NEMO_EVALUATOR_TELEMETRY_LEVEL": "NEL telemetry; 0 turns it off (the test suite sets 0).",
    "NEMO_EVALUATOR_TRUST_PRE_CMD": "Must be 1 for NEL to run a config's pre_cmd.",
    "USER": "Default SLURM username in NEL's templates (execution.username: ${oc.env:USER}); NEL fails when it is unset (e.g. in containers).",
    "NEMO_EVALUATOR_EXEC_DB_FILE": "NEL's execution database (default ~/.nemo-evaluator/exec-db/exec.v1.jsonl); run_status/logs/kill/resume read it.",
    "MODELOPT_WORKSPACE_ROOT": "Root of ModelOpt quantization/deployment workspaces to reuse.",
    "QUANTEVAL_STATE_DIR": "Where quanteval keeps its state (ledger, caches). Default: $XDG_STATE_HOME/quanteval.",
    "QUANTEVAL_LEDGER": "Path of the SQLite ledger of runs and deployments. Default: <state dir>/ledger.sqlite3.",
    "QUANTEVAL_CACHE_DIR": "Answers quanteval reuses across processes (NEL's facts and tasks, server arguments a framework "
                           "accepted), each keyed by what it was made from. Default: <state dir>/cache.",
    "QUANTEVAL_SGLANG_LAUNCHER": "Command that replaces `python3 -m sglang.launch_server` in deployments (a specific Python, a container wrapper).",
    "QUANTEVAL_VLLM_LAUNCHER": "Command that replaces `vllm serve` in deployments.",
    "QUANTEVAL_TRTLLM_LAUNCHER": "Command that replaces `trtllm-serve` in deployments.",
    "HF_HUB_OFFLINE": "Set to 1 by deployment plans of local checkpoints, so servers make no Hugging Face Hub lookups.",
    "QUANTEVAL_RECIPES_DIR": "Directory of task recipes (*.md) used instead of the bundled recipes/tasks.",
    "XDG_STATE_HOME": "Base of the default state directory (~/.local/state when unset).",
    "SSH_AUTH_SOCK": "ssh-agent socket used by the remote tools.",
    "QUANTEVAL_SSH_CONFIG": "ssh config file the remote tools read instead of ~/.ssh/config (the test suite points it at its cluster).",
    "ENROOT_CONFIG_PATH": "enroot config directory on a cluster host; check_registry_credentials reads .credentials there (default ~/.config/enroot).",
    "JUDGE_API_KEY": "API key of the LLM judge used by judge-scored tasks (e.g. ns_hle_aa, aa_lcr).",
    "OPENAI_API_KEY": "OpenAI-compatible key for judges or user simulators hosted by OpenAI.",
    "NVIDIA_API_KEY": "build.nvidia.com key; tau2_bench_telecom forwards it as USER_API_KEY for its user simulator.",
    "USER_API_KEY": "Inside the tau2_bench container: the user simulator's key (set from NVIDIA_API_KEY by the recipe).",
    "DUMMY_API_KEY": "Placeholder key NeMo-Skills tasks send to a self-deployed endpoint (api_key_name: DUMMY_API_KEY).",
    "WANDB_API_KEY": "Weights & Biases key, for export: wandb.",
    "MLFLOW_TRACKING_URI": "MLflow server, for export: mlflow.",
    "QUANTEVAL_EVAL_TOKEN": "Bearer token (at least 16 characters) the eval server requires when bound beyond loopback (serve-eval --token-env names another).",
    "QUANTEVAL_NEMO_SKILLS_SRC": "NeMo-Skills source (tree, .tar.gz or pip URL) for .venv-nemo-skills (scripts/setup --dev); "
                                 "default ../shared/vendor/, else GitHub.",
    "QUANTEVAL_NEL_NEXT_SKILLS_SRC": "NeMo-Skills source (tree, .tar.gz or pip URL) for skills:// in .venv-nel-next (scripts/setup); "
                                     "default ../shared/vendor/, else GitHub.",
    "QUANTEVAL_VLLM_VENV": "The vLLM for CPU venv local vLLM deployments start from when no `vllm` is on PATH (default .venv-vllm, built by scripts/setup).",
    "QUANTEVAL_NEL_NEXT_VENV": "The nel-next (nemo-evaluator >= 0.3, Python 3.12) venv quanteval drives (default .venv-nel-next, built by scripts/setup).",
    "QUANTEVAL_NEL_NEXT_PYTHON": "Python 3.12/3.13 scripts/setup-nel-next builds .venv-nel-next with (default: python3.12, python3.13, or pyenv's).",
    "QUANTEVAL_SETUP_LOG": "Where scripts/setup and scripts/setup-* write pip's output (default .venv-setup.log; progress goes to stderr).",
    "QUANTEVAL_SETUP_HEARTBEAT_S": "Seconds between scripts/setup's 'still installing' lines while a step runs (default 15).",
    "QUANTEVAL_SETUP_INSTALLER": "pip: scripts/setup installs with pip only (default: uv 0.13.9 where it can, scripts/pkg-install).",
    "QUANTEVAL_NS_VENV": "The NeMo-Skills venv scripts/setup-nemo-skills builds and the real-ns tests use (default .venv-nemo-skills).",
    "QUANTEVAL_GC_THRESHOLD": "First garbage-collector threshold of the Pythons in the venvs scripts/setup builds (default 10000; "
                              "700 is Python's own): fewer collections while vLLM, torch and NeMo-Skills import (scripts/startup-gc).",
}


def state_dir() -> Path:
    """The directory for quanteval's own state, created on first use."""
    explicit = os.environ.get("QUANTEVAL_STATE_DIR")
    if explicit:
        path = Path(explicit).expanduser()
    else:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        path = Path(base).expanduser() / "quanteval"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Where answers reused across processes are kept: safe to delete, each is made again when missing."""
    explicit = os.environ.get("QUANTEVAL_CACHE_DIR")
    path = Path(explicit).expanduser() if explicit else state_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ledger_path() -> Path:
    explicit = os.environ.get("QUANTEVAL_LEDGER")
    return Path(explicit).expanduser() if explicit else state_dir() / "ledger.sqlite3"


def set_env_var_names(names: list[str] | None = None) -> list[str]:
    """Which of `names` (default: all known) are set and non-empty. Names only, never values."""
    return [name for name in (names or list(KNOWN_ENV_VARS)) if os.environ.get(name)]


def project_root() -> Path | None:
    """The source checkout quanteval runs from (editable install), where setup builds the engines' venvs."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "scripts").is_dir() else None


def setup_command(script: str, venv_variable: str | None = None) -> str:
    """The command that runs one of the checkout's setup scripts (scripts/setup, setup-nel-next, ...), as a fix a client
    in another folder or shell can follow: the script's absolute path in the source checkout quanteval runs from (the
    scripts cd there themselves), with the venv variable this server reads where it is set (the script builds where
    it says), else where such scripts come from (an installed wheel ships none)."""
    import shlex

    root = project_root()
    if root is not None and (root / "scripts" / script).is_file():
        where = os.environ.get(venv_variable or "")
        prefix = f"{venv_variable}={shlex.quote(str(Path(where).expanduser().absolute()))} " if venv_variable and where else ""
        return f"{prefix}bash {shlex.quote(str(root / 'scripts' / script))}"
    return (f"bash scripts/{script} in a quanteval source checkout (this quanteval, {Path(__file__).resolve().parent}, "
            "is installed without its scripts)")


def engine_venv(variable: str, default_name: str) -> Path:
    """An engine's own venv: $variable, else <checkout>/<default_name> as scripts/setup builds it."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit).expanduser()
    root = project_root()
    return (root / default_name) if root else Path.home() / ".local" / "share" / "quanteval" / default_name

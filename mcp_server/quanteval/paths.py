"""The one check every local path a tool is given passes before the tool runs.

Tools name files by the vocabulary's field names (`config_path`, `checkpoint`, `run`, ...);
`PATH_FIELDS` says which fields hold local paths and what they may be. The MCP server
checks with its policy (relative paths refused; `quanteval-mcp --root DIR` confines every
path to DIR), the CLI with ANY_PATH (relative to the shell's directory). Same messages.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from quanteval.models import ToolError

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux

Kind = Literal["file", "dir", "checkpoint", "run", "new_yaml"]

# Input fields that name local files or directories, and what each holds.
PATH_FIELDS: dict[str, Kind] = {
    "config_path": "file",  # an existing NEL config (build_config's is a new one: see NEW_YAML)
    "checkpoint": "checkpoint",  # a directory, or a Hugging Face handle in the local cache
    "output_dir": "dir",
    "output_root": "dir",
    "run": "run",  # a results directory, host:path, or a record/invocation id
    "baseline": "run",
    "candidate": "run",
    "baseline_checkpoint": "checkpoint",  # evaluate_quantization
    "candidate_checkpoint": "checkpoint",
    "policy": "file",  # gate_results: a nel gate policy YAML
    "data_dir": "dir",  # start_eval_server: NeMo-Skills data
    "config_dir": "dir",  # start_eval_server: NeMo-Skills cluster configs
}
# List fields whose entries may be local files (a BYOB benchmark .py, a .jsonl); other entries are names (bundles,
# built-in benchmarks, skills://NAME).
PATH_LIST_FIELDS = frozenset({"benchmarks"})
# (tool, field) pairs naming a config file the tool creates.
NEW_YAML = {("build_config", "config_path"), ("convert_config", "output_path")}
# (tool, field) pairs naming a path on `host`: a local one when host is omitted or 'local'.
ON_HOST = {("remote_grep", "path")}

_HF_HANDLE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HOST_PATH = re.compile(r"^[\w.@-]+:")


@dataclass(frozen=True)
class Policy:
    root: Path | None = None  # every local path must resolve inside it
    absolute_only: bool = False  # refuse relative paths (a server's working directory means nothing to its client)
    open_eval_server: bool = False  # quanteval-mcp --allow-open-eval-server: start_eval_server may bind beyond
    # loopback and run an ns/nel command outside the root
    allow_commands: bool = False  # quanteval-mcp --allow-commands: under --root, a config may run commands on launch
    read_only: bool = False  # quanteval-mcp --read-only: a call writes no file (write_file refuses)

    def __post_init__(self) -> None:
        if self.root is not None:
            object.__setattr__(self, "root", self.root.expanduser().resolve())


ANY_PATH = Policy()  # the CLI's: paths relative to the shell's directory, anywhere

# The policy of the MCP call running in this context (mcpapp sets it around each call, start_evaluation's job for its
# process): list_runs shows only the records it may see, nothing outside its root is imported. None on the CLI.
CALL_POLICY: ContextVar[Policy | None] = ContextVar("quanteval_call_policy", default=None)
STATE_IN_ROOT = ".quanteval"  # under --root, what a call would write to the state dir goes here


def call_state_dir() -> Path:
    """Where a call writes what it makes unasked (its servers' logs, a comparison without output_dir, prompt
    templates, an evaluation job's log): quanteval's state dir, or ROOT/.quanteval under an MCP server's --root, so
    a confined client's files stay inside. quanteval's own caches and ledger stay in the state dir."""
    from quanteval import envvars

    policy = CALL_POLICY.get()
    if policy is None or policy.root is None:
        return envvars.state_dir()
    return make_dir(policy.root / STATE_IN_ROOT)


# ---------------------------------------------------------------- where a call's own writes land

def _inside(path: Path, what: str) -> None:
    policy = CALL_POLICY.get()
    if policy is not None and policy.root is not None and not path.resolve().is_relative_to(policy.root):
        raise ToolError(f"{what} resolves to {path.resolve()}, outside the workspace root {policy.root} this server was "
                        "started with (--root): a link inside the root leads there. Remove the link or write elsewhere.")


def make_dir(path: Path, what: str = "folder") -> Path:
    """`path` as a directory (made with its parents), after checking where it resolves: under the MCP call's --root, a
    link anywhere on the way (a planted ROOT/.quanteval -> /elsewhere) may not lead outside. Returns the resolved path,
    so what is written next goes where was checked."""
    path = path.expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:  # the folders mkdir would create through
        existing = existing.parent
    _inside(existing, f"{what} {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"{what} {path}: cannot create it ({exc.strerror or exc}). Pass a writable directory.") from None
    _inside(path, f"{what} {path}")
    return path.resolve()


def read_only_call() -> bool:
    """The MCP call running here is served by a --read-only server: it writes no file."""
    policy = CALL_POLICY.get()
    return policy is not None and policy.read_only


def write_file(path: Path, data: str | bytes, mode: int | None = None) -> Path:
    """The one way quanteval writes a file a tool makes: into the destination's resolved folder (checked by make_dir)
    by a temporary file and a rename, so a link planted at the file's name is replaced, never written through, and a
    reader sees the old file or the new one, never half. Keeps an existing file's mode unless given one. A call of a
    --read-only server writes nothing: refused. Returns the path written."""
    if read_only_call():
        raise ToolError(f"{path}: this server is --read-only and writes no file. Leave out what asks for one.")
    target = make_dir(path.expanduser().parent) / path.name
    if mode is None:
        try:
            status = os.lstat(target)
            mode = status.st_mode & 0o777 if stat.S_ISREG(status.st_mode) else 0o644
        except FileNotFoundError:
            mode = 0o644
    try:
        handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise ToolError(f"{path}: cannot write it ({exc.strerror or exc}). Pass a writable directory.") from None
    try:
        with os.fdopen(handle, "wb") as temp:
            temp.write(data.encode("utf-8") if isinstance(data, str) else data)
            temp.flush()
            os.fsync(temp.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException as exc:
        Path(temp_name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ToolError(f"{path}: cannot write it ({exc.strerror or exc}).") from None
        raise
    return target


def looks_local(value: Any) -> bool:
    """A path rather than a Hugging Face handle (org/name) or a registry name."""
    return isinstance(value, str) and value.startswith(("/", "~", "./", "../"))


def on_disk(value: Any) -> bool:
    """A name that exists here as a file, directory or link (a relative one in the working directory): the tools open
    it as a path even when it also reads as a Hugging Face handle (org/name), so it is checked as one."""
    if not isinstance(value, str) or "\0" in value or not value.strip() or len(value) > MAX_PATH_CHARS:
        return False
    return os.path.lexists(os.path.expanduser(value))


def check_arguments(tool: str, arguments: dict[str, Any], policy: Policy = ANY_PATH) -> None:
    """Raise ToolError if any path-like argument breaks the policy or cannot be a path at all."""
    local_host = arguments.get("host") in (None, "local")
    for field, value in arguments.items():
        if field in PATH_LIST_FIELDS and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, str) and "://" not in item and (item.endswith((".py", ".jsonl")) or "/" in item):
                    local_path(item, f"{field}[{index}]", policy)
            continue
        kind: Kind | None = "new_yaml" if (tool, field) in NEW_YAML else PATH_FIELDS.get(field)
        if (tool, field) in ON_HOST and local_host:
            kind = "file"
        if kind == "checkpoint" and isinstance(value, str) and _HF_HANDLE.match(value) and on_disk(value):
            local_path(value, field, Policy(root=policy.root))  # relative, as a handle is written: checked where it leads
            continue
        if kind is None or not isinstance(value, str) or not _is_local(kind, value):
            continue
        path = local_path(value, field, policy)
        if kind == "new_yaml":
            _check_new_yaml(path, field)


def _is_local(kind: Kind, value: str) -> bool:
    if kind == "checkpoint" and _HF_HANDLE.match(value):
        return False  # a handle, read from the Hugging Face cache
    if kind == "run":
        return "/" in value and not HOST_PATH.match(value)  # otherwise host:path or a record/invocation id
    return True


def local_path(value: str, field: str, policy: Policy = ANY_PATH) -> Path:
    """The path a tool will use for `value`, checked against the policy."""
    if "\0" in value:
        raise ToolError(f"{field}: contains a NUL byte; give a plain file path.")
    if len(value) > MAX_PATH_CHARS:
        raise ToolError(f"{field}: {len(value)} characters, longer than any path ({MAX_PATH_CHARS}).")
    if not value.strip():
        raise ToolError(f"{field}: empty; give a path.")
    path = Path(value).expanduser()
    if policy.absolute_only and not path.is_absolute():
        where = f" (inside {policy.root})" if policy.root else ""
        raise ToolError(f"{field}: '{value}' is relative; give an absolute path{where}. The server's working directory is not yours.")
    if policy.root is not None:
        resolved = path.resolve()
        if not resolved.is_relative_to(policy.root):
            raise ToolError(f"{field}: {resolved} is outside the workspace root {policy.root} this server was started with (--root).")
    return path


def _check_new_yaml(path: Path, field: str) -> None:
    if path.suffix not in (".yaml", ".yml"):
        raise ToolError(f"{field}: {path} must name a .yaml or .yml file, e.g. {path.with_suffix('.yaml')}.")
    if path.is_dir():
        raise ToolError(f"{field}: {path} is a directory; name a .yaml file inside it.")
    # A missing folder is no error: the tool creates it (new_file_folder), inside the root the path was checked against.


def new_file_folder(path: Path, field: str) -> Path:
    """The folder of a new file a tool writes, created with its parents where missing (an MCP client has no other way
    to make one); `path` has passed check_arguments, so under --root the folder lies inside the root."""
    folder = path.expanduser().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"{field}: cannot create the folder {folder} ({exc.strerror or exc}). Choose another path.") from None
    return folder


def file_stats(files: list[str] | list[Path]) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of each file (-1s where missing): what an answer kept for reuse was made from."""
    found = []
    for file in files:
        try:
            stat = Path(file).stat()
        except OSError:
            stat = None
        found.append((str(file), stat.st_size, stat.st_mtime_ns) if stat else (str(file), -1, -1))
    return tuple(found)

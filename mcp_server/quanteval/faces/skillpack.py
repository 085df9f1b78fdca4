"""The skill pack (skills/, recipes/, references/): where it lives, installing it for an assistant, serving it over MCP.

The pack ships inside the package as `quanteval/_pack/` (setup.py copies it into the
wheel); an editable install reads the repository's top-level folders directly.

Installing copies each skill folder to the assistant's skills directory and makes it
self-contained: the shared files a skill links to (skills/common, references, recipes),
and the files those link to, are copied into the skill folder and the links rewritten,
so every relative link still resolves and nothing is fetched from the network.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quanteval.engines.recipes import pack_dir
from quanteval.models import ToolError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

log = logging.getLogger(__name__)

PACK_FOLDERS = ("skills", "recipes", "references")
SHARED_SKILL_FOLDER = "common"  # skills/common holds guidance linked from several skills; it is not a skill

# Where each assistant looks for skills: (user-level, project-level). These are the folders
# `nel skills add` (NEL 0.2.6, nemo_evaluator_launcher/cli/skills.py `_AGENT_PATHS`) installs into;
# Claude Code documents ~/.claude/skills and <project>/.claude/skills; Codex documents
# $HOME/.agents/skills and <repo>/.agents/skills (https://developers.openai.com/codex/skills);
# OpenCode reads ~/.config/opencode/skills and .opencode/skills; Cursor .cursor/skills.
AGENT_SKILL_DIRS: dict[str, tuple[Path, Path]] = {
    "claude": (Path(".claude") / "skills", Path(".claude") / "skills"),
    "codex": (Path(".agents") / "skills", Path(".agents") / "skills"),
    "cursor": (Path(".cursor") / "skills", Path(".cursor") / "skills"),
    "opencode": (Path(".config") / "opencode" / "skills", Path(".opencode") / "skills"),
}

# Markdown links and images: [text](target) — targets without a scheme are relative file links.
LINK_PATTERN = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def pack_root() -> Path:
    """The pack root (engines.recipes.pack_dir), checked: a wheel built without the pack is a packaging bug worth naming."""
    root = pack_dir()
    if not (root / "skills").is_dir():
        raise ToolError(
            f"{root / 'skills'}: the skill pack is missing from this installation. "
            "Reinstall quanteval from its source tree (`pip install .`), which bundles skills/, recipes/ and references/."
        )
    return root


def skill_names(root: Path | None = None) -> list[str]:
    """Folders under skills/ that are skills (hold a SKILL.md)."""
    skills = (root or pack_root()) / "skills"
    return sorted(entry.name for entry in skills.iterdir() if (entry / "SKILL.md").is_file())


def relative_links(text: str) -> list[str]:
    """Relative link targets in Markdown text (anchors dropped; URLs and pure anchors skipped)."""
    targets = []
    for match in LINK_PATTERN.finditer(text):
        target = match.group(2).split("#", 1)[0]
        if target and "://" not in target and not target.startswith(("mailto:", "/")):
            targets.append(target)
    return targets


def pack_files(root: Path | None = None) -> list[str]:
    """Every file of the pack as a POSIX path relative to the pack root, sorted."""
    root = root or pack_root()
    files = []
    for folder in PACK_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append(path.relative_to(root).as_posix())
    return files


# ---------------------------------------------------------------- installing


def _installed_path(pack_path: str, skill: str) -> str:
    """Where a pack file lands, relative to the assistant's skills directory, when installing `skill`."""
    parts = pack_path.split("/")
    if parts[0] == "skills" and parts[1] == skill:
        return posixpath.join(skill, *parts[2:])
    if parts[0] == "skills" and parts[1] != SHARED_SKILL_FOLDER:
        return posixpath.join(*parts[1:])  # another skill: installed beside this one
    if parts[0] == "skills":
        return posixpath.join(skill, *parts[1:])  # skills/common/x.md -> <skill>/common/x.md
    return posixpath.join(skill, *parts)  # references/..., recipes/... -> <skill>/references/...


def _skill_closure(root: Path, skill: str) -> list[str]:
    """The skill's own files plus every shared file reachable from them by relative links."""
    own = [path for path in pack_files(root) if path.startswith(f"skills/{skill}/")]
    seen, queue = set(own), list(own)
    while queue:
        current = queue.pop()
        if not current.endswith(".md"):
            continue
        for target in relative_links((root / current).read_text(encoding="utf-8")):
            linked = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
            other_skill = linked.startswith("skills/") and not linked.startswith(
                (f"skills/{skill}/", f"skills/{SHARED_SKILL_FOLDER}/")
            )
            if linked not in seen and not other_skill and (root / linked).is_file():
                seen.add(linked)
                queue.append(linked)
    return sorted(seen)


def _rewrite_links(text: str, source: str, skill: str) -> str:
    """Point each relative link of `source` (a pack path) at the target's installed location."""
    here = posixpath.dirname(_installed_path(source, skill))

    def rewrite(match: re.Match[str]) -> str:
        target, _, anchor = match.group(2).partition("#")
        if not target or "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        linked = posixpath.normpath(posixpath.join(posixpath.dirname(source), target))
        new_target = posixpath.relpath(_installed_path(linked, skill), here or ".")
        return f"{match.group(1)}{new_target}{'#' + anchor if anchor else ''}{match.group(3)}"

    return LINK_PATTERN.sub(rewrite, text)


def skill_files(skill: str, root: Path | None = None) -> dict[str, bytes]:
    """The files of `skill` as installed, self-contained: path inside the skill folder (POSIX) -> bytes.

    The one source of a skill's content: `install_skills` writes exactly these, and the MCP server serves exactly
    these as `skill://<skill>/<path>` (faces/mcpskills.py). Read from the pack on each call.
    """
    root = root or pack_root()
    files = {}
    for pack_path in _skill_closure(root, skill):
        relative = posixpath.relpath(_installed_path(pack_path, skill), skill)
        if pack_path.endswith(".md"):
            text = (root / pack_path).read_text(encoding="utf-8")
            files[relative] = _rewrite_links(text, pack_path, skill).encode("utf-8")
        else:
            files[relative] = (root / pack_path).read_bytes()
    return files


@dataclass(frozen=True)
class InstallOutcome:
    skill: str
    destination: Path
    installed: bool  # False: it existed and --force was not given


def skills_root_for(agent: str, *, project: bool, project_root: Path | None = None, home: Path | None = None) -> Path:
    if agent not in AGENT_SKILL_DIRS:
        raise ToolError(f"Unknown assistant '{agent}'. Choose from: {', '.join(AGENT_SKILL_DIRS)}.")
    user_dir, project_dir = AGENT_SKILL_DIRS[agent]
    if project:
        return (project_root or Path.cwd()) / project_dir
    return (home or Path.home()) / user_dir


def install_skills(destination_root: Path, *, force: bool = False) -> list[InstallOutcome]:
    """Copy every skill, self-contained, into `destination_root/<skill>/`. Existing skills are kept unless `force`."""
    root = pack_root()
    if destination_root.exists() and not destination_root.is_dir():
        raise ToolError(f"{destination_root}: not a directory. Give a skills folder to install into (it is created if missing).")
    outcomes = []
    for skill in skill_names(root):
        destination = destination_root / skill
        if destination.exists() and not force:
            outcomes.append(InstallOutcome(skill, destination, installed=False))
            continue
        destination_root.mkdir(parents=True, exist_ok=True)
        # Build beside the destination, then swap it in, so a failure never leaves half a skill behind.
        staging = Path(tempfile.mkdtemp(prefix=f".{skill}-", dir=destination_root))
        try:
            for relative, data in skill_files(skill, root).items():
                installed = staging / relative
                installed.parent.mkdir(parents=True, exist_ok=True)
                installed.write_bytes(data)
            if destination.exists():
                shutil.rmtree(destination)
            os.replace(staging, destination)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        outcomes.append(InstallOutcome(skill, destination, installed=True))
    return outcomes


# ---------------------------------------------------------------- MCP resources and prompt

# The skills themselves are served by faces/mcpskills.py as skill://<skill>/<path> (the MCP Skills extension), with
# the bytes `install_skills` writes. The pack's shared folders (references/, recipes/) are served here as well, as
# quanteval://<path relative to the pack root>, for clients that read a recipe or reference without a skill.
RESOURCE_SCHEME = "quanteval"
SKILL_SCHEME = "skill"
SHARED_RESOURCE_FOLDERS = ("references", "recipes")
WORKFLOW_PROMPT = "evaluate_quantized_model"


def resource_uri(pack_path: str) -> str:
    return f"{RESOURCE_SCHEME}://{pack_path}"


def skill_uri(skill: str, path: str = "SKILL.md") -> str:
    """A skill file's URI under the Skills extension: skill://<skill>/<path inside the installed skill folder>."""
    return f"{SKILL_SCHEME}://{skill}/{path}"


def mime_type(path: str) -> str:
    if path.endswith(".md"):
        return "text/markdown"
    if path.endswith((".yaml", ".yml")):
        return "text/yaml"  # a text type: MCP clients show it as text (application/yaml is served as a base64 blob)
    return "text/plain"


def describe(text: str, fallback: str) -> str:
    """The frontmatter description of a skill, or the first heading of a Markdown file."""
    match = re.search(r"^description:\s*(.+)$", text, re.MULTILINE) or re.search(r"^#\s+(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else fallback


def workflow_prompt_text(checkpoint: str = "", baseline: str = "") -> str:
    """The evaluation skill as a prompt (as installed, so its links resolve under skill://evaluation/), with the
    user's checkpoint and baseline filled in when given."""
    skill = skill_files("evaluation")["SKILL.md"].decode("utf-8")
    body = skill.split("---", 2)[2].lstrip() if skill.startswith("---") else skill
    task = ["Evaluate the accuracy of a (quantized) model with quanteval, following the workflow below."]
    if checkpoint:
        task.append(f"Checkpoint to evaluate: {checkpoint}")
    if baseline:
        task.append(f"Baseline to compare against: {baseline}")
    task.append(
        f"Linked files (references, recipes, common guidance) are MCP resources under {skill_uri('evaluation', '')}: "
        f"a link to references/multi-node.md is {skill_uri('evaluation', 'references/multi-node.md')}, "
        f"one to ../compare-results/SKILL.md is {skill_uri('compare-results')}."
    )
    return "\n".join(task) + "\n\n" + body


def register_mcp(server: MCPServer) -> None:
    """Expose the pack's shared files (references/, recipes/) as resources (read on demand) and the evaluation
    workflow as a prompt. The skills are served by the Skills extension (faces/mcpskills.py)."""
    from mcp.server.mcpserver.prompts import Prompt
    from mcp.server.mcpserver.resources import FileResource

    try:
        root = pack_root()
    except ToolError:
        log.warning("skill pack not found; serving tools without its resources")
        return
    for pack_path in pack_files(root):
        if pack_path.split("/", 1)[0] not in SHARED_RESOURCE_FOLDERS:
            continue
        server.add_resource(
            FileResource(
                uri=resource_uri(pack_path),
                name=pack_path,
                description=describe((root / pack_path).read_text(encoding="utf-8"), pack_path),
                mime_type=mime_type(pack_path),
                encoding="utf-8",  # every pack file is text
                path=root / pack_path,
            )
        )

    def evaluate_quantized_model(checkpoint: str = "", baseline: str = "") -> str:
        """Walk through evaluating a (quantized) checkpoint with NEL: config, tasks, dry-run, canary, full run, validation, comparison."""
        return workflow_prompt_text(checkpoint, baseline)

    server.add_prompt(Prompt.from_function(evaluate_quantized_model, name=WORKFLOW_PROMPT))

"""The skill pack over MCP, per the Skills extension (SEP-2640, `io.modelcontextprotocol/skills`, Final 2026-09-13).

Spec: modelcontextprotocol/ext-skills `specification/stable/skills.mdx` (the SEP's normative text, against protocol
2026-07-28) and modelcontextprotocol/modelcontextprotocol `seps/2640-skills-extension.md`.

- Capability: `capabilities.extensions["io.modelcontextprotocol/skills"] = {}` (no `directoryRead`: this server does
  not implement `resources/directory/read`; every skill's entry lists all its files), in the initialize result of
  every protocol version and in server/discover (2026-07-28).
- Resources: each file of a skill is `skill://<skill>/<path>`, `<path>` being where `quanteval skills install` puts it
  inside the skill's folder, and its bytes exactly what install writes (skillpack.skill_files: one source for both).
- `skills/list` -> `{skills: [Skill]}`; `skills/get {uri: skill://<skill>/SKILL.md}` -> `{skill: Skill}`, where
  `Skill = {uri, frontmatter, resources: [{uri, digest: "sha256:<64 hex>", size}]}`: the SKILL.md front matter as
  JSON, verbatim, and every file of the skill with the SHA-256 and length of its bytes. On protocol 2026-07-28 both
  results also carry `resultType: "complete"` and the list-caching hints `ttlMs` / `cacheScope`.
- Errors: a URI that names no served skill or file is -32602 (Invalid params), as the spec and resources/read say.

Everything is read from the pack on each request, so a digest changes with its file. Nothing outside the served
skills' files is reachable: a URI is looked up among those files by exact name and never joined to a path. Clients
without the extension see the same files through resources/list and resources/read. Granting a skill's
`allowed-tools` is the host's decision, skill by skill (the spec forbids granting it without the user's approval);
this server only serves the front matter as written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from mcp.server.extension import Extension, MethodBinding
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from mcp_types import Resource as MCPResource
from mcp_types.version import is_version_at_least

from quanteval.faces import skillpack
from quanteval.models import ToolError

log = logging.getLogger(__name__)

EXTENSION_ID = "io.modelcontextprotocol/skills"
URI_PREFIX = f"{skillpack.SKILL_SCHEME}://"
SKILL_FILE = "SKILL.md"
# Per-skill limits every host accepts (spec "Limits"); a server should not serve a skill past them.
MAX_FILES_PER_SKILL = 512
MAX_BYTES_PER_SKILL = 16 * 1024 * 1024
_FRONT_MATTER = re.compile(r"\A---\r?\n(.*?)\r?\n---\r?(?:\n|\Z)", re.DOTALL)


class ListSkillsParams(RequestParams):
    cursor: str | None = None


class GetSkillParams(RequestParams):
    uri: str


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def front_matter(skill_md: bytes) -> dict[str, Any]:
    """A SKILL.md's YAML front matter as a JSON object, every field as written; ValueError when it has none."""
    match = _FRONT_MATTER.match(skill_md.decode("utf-8"))
    if not match:
        raise ValueError("SKILL.md does not begin with YAML front matter between '---' lines")
    data = yaml.safe_load(match.group(1))
    if not isinstance(data, dict):
        raise ValueError("SKILL.md front matter is not a mapping")
    return json.loads(json.dumps(data, default=str))  # dates and the like as the strings YAML wrote


class SkillsExtension(Extension):
    """skills/list and skills/get over the pack at `root`; QuantevalServer serves the skill:// resources with it."""

    identifier = EXTENSION_ID

    def __init__(self, root: Path) -> None:
        self._root = root

    def settings(self) -> dict[str, Any]:
        return {}  # no directoryRead

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding("skills/list", ListSkillsParams, self._list),
                MethodBinding("skills/get", GetSkillParams, self._get))

    # ------------------------------------------------------------ the pack as skills

    def _skill(self, name: str) -> tuple[dict[str, bytes], dict[str, Any]] | None:
        """A served skill's files and front matter, or None (logged) for a folder that is not a servable skill."""
        try:
            files = skillpack.skill_files(name, self._root)
            meta = front_matter(files[SKILL_FILE])
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            log.warning("skills/%s not served over MCP: %s", name, exc)
            return None
        if meta.get("name") != name or not isinstance(meta.get("description"), str):
            log.warning("skills/%s not served over MCP: its front matter must give name: %s and a description", name, name)
            return None
        if len(files) > MAX_FILES_PER_SKILL or sum(map(len, files.values())) > MAX_BYTES_PER_SKILL:
            log.warning("skills/%s not served over MCP: past the extension's %d files / 16 MiB per skill", name, MAX_FILES_PER_SKILL)
            return None
        return files, meta

    def _names(self) -> list[str]:
        try:
            return skillpack.skill_names(self._root)
        except (OSError, ToolError):
            return []

    @staticmethod
    def _entry(name: str, files: dict[str, bytes], meta: dict[str, Any]) -> dict[str, Any]:
        ordered = [SKILL_FILE, *sorted(path for path in files if path != SKILL_FILE)]
        return {"uri": skillpack.skill_uri(name), "frontmatter": meta,
                "resources": [{"uri": skillpack.skill_uri(name, path), "digest": digest(files[path]), "size": len(files[path])}
                              for path in ordered]}

    def entries(self) -> list[dict[str, Any]]:
        return [self._entry(name, *found) for name in self._names() if (found := self._skill(name))]

    def _locate(self, uri: str) -> tuple[str, str, dict[str, bytes], dict[str, Any]]:
        """The skill a skill:// URI this server serves names, the path inside it, the skill's files and front matter;
        ResourceNotFoundError (-32602 over MCP) for any other URI."""
        served = ", ".join(skillpack.skill_uri(name) for name in self._names())
        if not uri.startswith(URI_PREFIX):
            raise ResourceNotFoundError(f"{uri}: not a skill URI; skills/list names the skills served ({served})")
        name, _, path = uri.removeprefix(URI_PREFIX).partition("/")
        segments = [name, *path.split("/")]
        if any(segment in ("", ".", "..") for segment in segments) or "\\" in uri:
            raise ResourceNotFoundError(
                f"{uri}: not served; a skill URI is skill://<skill>/<path> with no '.', '..' or empty segments, "
                f"and only the files a skill's entry lists are served (skills: {served})")
        found = self._skill(name) if name in self._names() else None
        if found is None:
            raise ResourceNotFoundError(f"{uri}: no skill '{name}' is served here; skills/list names them ({served})")
        if path not in found[0]:
            raise ResourceNotFoundError(f"{uri}: skill '{name}' has no file '{path}'; skills/get {skillpack.skill_uri(name)} lists its files")
        return name, path, *found

    # ------------------------------------------------------------ resources/list and resources/read

    def resource_listing(self) -> list[MCPResource]:
        """Every served skill file as a plain resource (what a client without the extension sees)."""
        listing = []
        for name in self._names():
            if not (found := self._skill(name)):
                continue
            files, meta = found
            for path in [SKILL_FILE, *sorted(path for path in files if path != SKILL_FILE)]:
                if path == SKILL_FILE:
                    label, description = meta["name"], meta["description"]
                else:
                    label = f"{name}/{path}"
                    description = skillpack.describe(files[path].decode("utf-8", errors="replace"), label)
                listing.append(MCPResource(uri=skillpack.skill_uri(name, path), name=label, description=description,
                                           mime_type=skillpack.mime_type(path), size=len(files[path])))
        return listing

    def read(self, uri: str) -> list[ReadResourceContents]:
        _, path, files, _ = self._locate(uri)
        data = files[path]
        try:
            content: str | bytes = data.decode("utf-8")
        except UnicodeDecodeError:
            content = data  # served as a blob, the same bytes
        return [ReadResourceContents(content=content, mime_type=skillpack.mime_type(path))]

    # ------------------------------------------------------------ the extension's methods

    async def advertise_on_handshake(self, ctx: Any, call_next: Any) -> Any:
        """Server middleware: the initialize result names the extension in `capabilities.extensions`, as SEP-2133
        shows it for a 2025-06-18 handshake. The SDK sends it on protocol 2026-07-28 only (its 2025 schemas have no
        such field and drop it), yet the hosts this server meets most (Claude Code, VS Code) still shake hands."""
        result = await call_next(ctx)
        capabilities = result.get("capabilities") if ctx.method == "initialize" and isinstance(result, dict) else None
        if isinstance(capabilities, dict):
            extensions = {**(capabilities.get("extensions") or {}), self.identifier: self.settings()}
            return {**result, "capabilities": {**capabilities, "extensions": extensions}}
        return result

    @staticmethod
    def _result(ctx: Any, result: dict[str, Any]) -> dict[str, Any]:
        """Protocol 2026-07-28 results carry resultType and the list-caching hints (read live: never cache)."""
        if is_version_at_least(getattr(ctx, "protocol_version", ""), "2026-07-28"):
            return {"resultType": "complete", **result, "ttlMs": 0, "cacheScope": "private"}
        return result

    async def _list(self, ctx: Any, params: ListSkillsParams) -> dict[str, Any]:
        if params.cursor is not None:
            raise MCPError(INVALID_PARAMS, f"skills/list: unknown cursor {params.cursor!r}; every skill comes in the first page")
        return self._result(ctx, {"skills": self.entries()})

    async def _get(self, ctx: Any, params: GetSkillParams) -> dict[str, Any]:
        try:
            name, path, files, meta = self._locate(params.uri)
        except ResourceNotFoundError as exc:
            raise MCPError(INVALID_PARAMS, f"skills/get: {exc}") from None
        if path != SKILL_FILE:
            raise MCPError(INVALID_PARAMS, f"skills/get: {params.uri} is not a skill's SKILL.md; give {skillpack.skill_uri(name)}")
        return self._result(ctx, {"skill": self._entry(name, files, meta)})


def extension() -> SkillsExtension | None:
    """The extension over the installed pack, or None (logged) when the pack is missing."""
    try:
        return SkillsExtension(skillpack.pack_root())
    except ToolError:
        log.warning("skill pack not found; serving no skills")
        return None

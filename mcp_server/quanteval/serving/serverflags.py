"""A model server's command-line flags as (flag, value) options, the flags apply_checkpoint owns, and the generation
budget a served context leaves: the same for every engine that starts the server (NEL 0.2.6's deployment.extra_args,
nel-next's services.*.extra_args), so they live with the serving facts, not in one engine.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from quanteval.models import ToolError
from quanteval.serving import frameworks

# Room left for the prompt when the generation budget comes from the serving context: a quarter of the
# context, at most 8192 tokens (Qwen3's card: 32768 generated tokens in its 40960 context).
PROMPT_RESERVE_TOKENS = 8192


def parse_extra_args(text: str) -> list[tuple[str, str | None]]:
    """`--a 1 --b --c=x` -> [("--a","1"), ("--b",None), ("--c","x")]; stray words become (word, None)."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ToolError(f"deployment.extra_args: cannot split '{text}' into flags ({exc}). Balance the quotes.") from None
    options: list[tuple[str, str | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("-") and "=" in token:
            flag, value = token.split("=", 1)
            options.append((flag, value))
        elif token.startswith("-") and index + 1 < len(tokens) and not tokens[index + 1].startswith("--"):
            options.append((token, tokens[index + 1]))
            index += 1
        else:
            options.append((token, None))
        index += 1
    return options


def generation_budget(context: int) -> int:
    """max_new_tokens that fits a serving context with room left for the prompt."""
    return context - min(PROMPT_RESERVE_TOKENS, context // 4)


def owned_flags(framework: str) -> set[str]:
    """Server flags apply_checkpoint computes from the checkpoint (and so replaces on every call)."""
    info = frameworks.FRAMEWORK_INFO[framework]
    # --kv-cache-dtype follows the checkpoint's KV cache: a BF16 baseline made from an FP8-KV candidate's config must
    # not keep the candidate's flag.
    kv_cache = {info.kv_cache_flag} if info.kv_cache_flag else set()
    return {info.context_flag, info.trust_remote_code_flag, "--quantization", "--reasoning-parser"} | kv_cache


# Server flags that make the framework import Python named by the flag (the checkpoint's own modelling code, a plugin
# file, a class or callable by name): running that code is a command. Under `quanteval-mcp --root` they need the
# server started with --allow-commands, as a config's commands do (engines/commands.py).
CODE_FLAGS = frozenset({
    "--trust-remote-code", "--trust_remote_code",  # the checkpoint's (or --hf-config-path's, --tokenizer's) auto_map code
    "--tool-parser-plugin", "--reasoning-parser-plugin",  # vLLM: a .py file it imports
    "--logits-processors", "--middleware", "--worker-extension-cls", "--worker-cls",  # vLLM: qualified names it imports
    "--custom-weight-loader", "--enable-custom-logit-processor",  # SGLang: an import path; pickled processors per request
})


def code_flags(args: list[str]) -> list[str]:
    """The flags among a server's arguments that load Python (CODE_FLAGS), as given (`--flag` or `--flag=value`)."""
    return [arg for arg in args if arg.split("=", 1)[0] in CODE_FLAGS]


def _path_values(value: str) -> list[str]:
    """What in one argument may name a local file or folder: the argument, the right of `--flag=` or `name=` (vLLM's
    --lora-modules name=path), and every string in a JSON value (--speculative-config '{"model": "/x"}')."""
    import json

    found = [value]
    if "=" in value:
        found.append(value.split("=", 1)[1])
    if value.lstrip().startswith(("{", "[")):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        stack = [parsed]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                found.append(node)
            elif isinstance(node, dict):
                stack += list(node.values())
            elif isinstance(node, list):
                stack += node
    return found


def path_values(args: list[str]) -> list[str]:
    """What among a server's arguments names a local file or folder: a value that starts with / ~ ./ ../ or holds a
    `/` (a relative path; a Hugging Face handle resolves inside the folder it is read from, harmlessly)."""
    from quanteval import paths

    return [value for arg in args for value in _path_values(arg) if paths.looks_local(value) or "/" in value]


def confinement_refusal(args: list[str], field: str, root: Path, allow_code: bool) -> str | None:
    """Why a model server's arguments reach beyond `root` (quanteval-mcp --root): a value that names a local path
    outside it (--hf-config-path, --config, --tokenizer, --chat-template, --download-dir, a JSON config's model ...,
    every flag alike: a path is any value that starts with / ~ ./ ../ or exists here), or a flag that loads Python
    when `allow_code` is false. None when they stay inside."""
    from quanteval import paths

    if not allow_code and (loading := code_flags(args)):
        return (f"{field}: {', '.join(loading)} makes the server (and the framework's argument check) import Python "
                f"that is not the framework's own; this MCP server (--root) runs no such code: remove it, or start "
                "quanteval-mcp with --allow-commands if you trust every client.")
    for index, arg in enumerate(args):
        for value in _path_values(str(arg)):
            # a relative name counts where it exists here and reads as a path or file (dtype names like fp8 do not)
            if not (paths.looks_local(value) or (paths.on_disk(value) and ("/" in value or "." in value))):
                continue
            try:
                paths.local_path(value, f"{field}[{index}]", paths.Policy(root=root))
            except ToolError as exc:
                return str(exc)
    return None

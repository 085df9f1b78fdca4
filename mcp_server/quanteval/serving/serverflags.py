"""A model server's command-line flags as (flag, value) options, the flags apply_checkpoint owns, and the generation
budget a served context leaves: the same for every engine that starts the server (NEL 0.2.6's deployment.extra_args,
nel-next's services.*.extra_args), so they live with the serving facts, not in one engine.
"""

from __future__ import annotations

import shlex

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

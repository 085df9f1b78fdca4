"""What a tool may show of text that can hold secrets: logs, rendered scripts, error messages and configs.

The one scrubber for everything a tool returns (run logs, validate_run's evidence, deployment logs, remote_grep,
the eval server's log tails, rendered scripts). It masks:
- by value: the values of secret env vars that are set here, each shown as its var's name (`<HF_TOKEN>`): the known
  ones (HF_TOKEN, NGC_API_KEY, JUDGE_API_KEY ...) and any other whose name ends in KEY, TOKEN, SECRET or PASSWORD
  (such as the eval server's --token-env); and the values NEL wrote to the .secrets.env files the caller names (`***`);
  also wrapped across lines, percent-encoded, base64- or hex-encoded, and a part of one cut at a line's edge;
- by shape, wherever they appear, as `***`: `Authorization: Bearer …`, NVIDIA `nvapi-…` keys, Hugging Face `hf_…` tokens,
  OpenAI-style `sk-…` keys (after `_` too, JSON-escaped, wrapped onto the next line), JWTs, AWS access key ids,
  the password in a URL (`https://user:…@host`), the value of `NAME=value` whose name
  says it is a secret, and of every `export NAME=value` (NEL's run.sub runs under `set -x`, so its SLURM log echoes
  its re-exports with their real values).
Configs are redacted by key instead (redact_config). A log line is shown scrubbed and cut to MAX_LINE_CHARS (shown_line).
"""

from __future__ import annotations

import base64
import functools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quanteval import envvars

Secrets = dict[str, str]  # a secret value -> what shows in its place
MASK = "***"
MAX_LINE_CHARS = 400  # a log line as tools show it (NEL scripts echo base64 configs thousands of characters long)
MIN_SECRET_CHARS = 4  # shorter values ("1", "no") would mask ordinary text

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")  # a known env var whose value is a secret
# Any other env var whose name ends like a secret's (TOKENIZERS_PARALLELISM=false does not).
SECRET_ENV_SUFFIX = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)$")
SECRET_KEY = re.compile(r"key|token|secret|password", re.IGNORECASE)  # config keys whose values are secrets
ENV_VAR_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")  # what a config should hold instead of a secret: the env var's name
# Shell lines that carry secret values (NEL's `set -x` echoes its re-exports into the SLURM log).
SECRET_ASSIGNMENT = re.compile(r"((?:export\s+'?)\w+=|\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*=)(\"[^\"]*\"|'[^']*'|\S+)",
                               re.IGNORECASE)
# Secrets by their shape; group 1, when set, is the part that stays (the header and scheme).
# A prefixed key is found after any non-alphanumeric character (`TOKEN_nvapi-…` too), its dash also JSON-escaped
# (`nvapi\u002d…`), and its tail on the next line when a log or a folded YAML value wraps it (after a backslash, or
# indented: an unindented next line is another line of the log).
_DASH = r"(?:-|\\u002d)"
_BODY = r"(?:[A-Za-z0-9_-]|\\u002d)"
_WRAPPED = r"(?:(?:\\\r?\n[ \t]*|\r?\n[ \t]+)[A-Za-z0-9_-]{4,})?"  # continued after a backslash, or indented
SECRET_SHAPE = re.compile(
    r"(\b(?:authorization:\s*(?:bearer|basic|token)|bearer)\s+)[A-Za-z0-9._~+/-]{8,}=*"
    rf"|(?<![A-Za-z0-9])nvapi{_DASH}{_BODY}{{8,}}{_WRAPPED}"
    rf"|(?<![A-Za-z0-9])hf_[A-Za-z0-9]{{30,}}(?![A-Za-z0-9]){_WRAPPED}"
    rf"|(?<![A-Za-z0-9])sk{_DASH}{_BODY}{{20,}}{_WRAPPED}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # a JWT: base64url header.payload.signature
    r"|(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"  # an AWS access key id
    r"|(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]{3,}(?=@)",  # the password in scheme://user:password@host
    re.IGNORECASE,
)


def secret_values(secrets_files: Iterable[Path] = ()) -> Secrets:
    """Values that must never appear in a result, each with what shows instead: a secret env var's value shows as its
    name (`<HF_TOKEN>`; names may be shown, values never), what NEL wrote to the .secrets.env files given as `***`."""
    values: Secrets = {}
    for path in secrets_files:
        for line in path.read_text(errors="replace").splitlines():
            _, _, value = line.partition("=")
            value = value.strip().strip("'\"")
            if len(value) >= MIN_SECRET_CHARS:
                values[value] = MASK
    names = {name for name in envvars.set_env_var_names() if SECRET_NAME.search(name)}
    names |= {name for name in os.environ if SECRET_ENV_SUFFIX.search(name.upper())}
    for name in sorted(names):
        if len(value := os.environ.get(name, "")) >= MIN_SECRET_CHARS:
            values[value] = f"<{name}>"
    return values


def scrub(text: str, secrets: Secrets | None = None) -> str:
    """text with every secret masked; `secrets` defaults to secret_values() (the env's, no .secrets.env files).

    A known value is found as written, wrapped onto the next line (after a backslash, or indented), percent-encoded
    in any of its characters (`%5F` for `_`), and as its base64 (standard or URL-safe, at any byte offset) or hex; a
    line that ends with its first MIN_PART_CHARS+ characters, or starts with its last, has that part masked (a line
    shown alone, cut where a log wrapped the value)."""
    known = secret_values() if secrets is None else secrets
    for value in sorted(known, key=len, reverse=True):
        text = _value_pattern(value).sub(functools.partial(_value_masked, known[value]), text)
        for encoded in _encodings(value):
            text = text.replace(encoded, known[value])
    if known:
        text = "\n".join(_edges_masked(line, known) for line in text.split("\n"))
    text = SECRET_ASSIGNMENT.sub(lambda match: f"{match.group(1)}{MASK}", text)
    return SECRET_SHAPE.sub(_masked, text)


MIN_PART_CHARS = 8  # a part of a known value at a line's edge this long is masked (shorter ones occur by chance)
_WRAP = r"(?:\\?\r?\n[ \t]*)?"  # where a log may have wrapped a value: after a backslash, or indented


@functools.lru_cache(maxsize=64)
def _value_pattern(value: str) -> re.Pattern[str]:
    """The value as written, each character also percent-encoded (any case), wrappable between characters."""
    def char(c: str) -> str:
        encoded = "".join(f"%{byte:02x}" for byte in c.encode("utf-8"))
        return f"(?:{re.escape(c)}|(?i:{re.escape(encoded)}))"

    return re.compile(_WRAP.join(char(c) for c in value))


@functools.lru_cache(maxsize=64)
def _encodings(value: str) -> tuple[str, ...]:
    """The value's base64 (standard and URL-safe, as it reads at each of the three byte offsets inside longer encoded
    data) and hex (either case): forms a log or a URL may carry it in."""
    raw = value.encode("utf-8")
    forms = {raw.hex(), raw.hex().upper()}
    for offset in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * offset + raw).decode()
            # only the characters that depend on the value's bytes alone
            forms.add(encoded[-(-4 * offset // 3):(4 * (offset + len(raw))) // 3])
    return tuple(sorted((form for form in forms if len(form) >= MIN_PART_CHARS), key=len, reverse=True))


def _value_masked(shown: str, match: re.Match[str]) -> str:
    """A known value masked; one wrapped onto the next line stays two lines (a log's lines keep their count)."""
    head, newline, tail = match.group(0).partition("\n")
    if not newline:
        return shown
    return f"{shown}\n{tail[:len(tail) - len(tail.lstrip(' ' + chr(9)))]}{MASK}"


def _edges_masked(line: str, known: Secrets) -> str:
    body = line.rstrip()
    indent = len(body) - len(body.lstrip())
    for value, shown in known.items():
        for size in range(len(value) - 1, MIN_PART_CHARS - 1, -1):
            if body.endswith(value[:size]):
                body = body[:-size] + shown
                break
        for size in range(len(value) - 1, MIN_PART_CHARS - 1, -1):
            if body[indent:].startswith(value[-size:]):
                body = body[:indent] + shown + body[indent + size:]
                break
    return body + line[len(line.rstrip()):]


def _masked(match: re.Match[str]) -> str:
    """A secret's shape masked, the header or scheme it follows kept; one wrapped onto the next line stays two lines."""
    kept = match.group(1) or match.group(2) or ""
    _, newline, tail = match.group(0).partition("\n")
    if not newline:
        return f"{kept}{MASK}"
    return f"{kept}{MASK}\n{tail[:len(tail) - len(tail.lstrip(' ' + chr(9)))]}{MASK}"


def shown_line(line: str, secrets: Secrets | None = None) -> str:
    """One log line as a tool shows it: stripped, scrubbed, at most MAX_LINE_CHARS characters."""
    return scrub(line.strip(), secrets)[:MAX_LINE_CHARS]


def shown_lines(lines: Iterable[str], secrets: Secrets | None = None) -> list[str]:
    """Log lines as a tool shows them, each scrubbed and capped but otherwise kept (not stripped, empty ones kept);
    the env's secrets are read once for all of them."""
    secrets = secret_values() if secrets is None else secrets
    # scrubbed as one text, so a key a log wrapped onto the next line is masked on both; as many lines come back
    return [line[:MAX_LINE_CHARS] for line in scrub("\n".join(lines), secrets).split("\n")]


def redact_config(value: Any, secret: bool = False) -> Any:
    """A config with every string under a key-like name (api_key, token, password ..., at any depth below it) replaced
    by `<redacted>`, unless it is an env var's name (what configs should hold instead of the secret)."""
    if isinstance(value, dict):
        return {key: redact_config(item, secret or bool(SECRET_KEY.search(str(key)))) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_config(item, secret) for item in value]
    if secret and isinstance(value, str) and value and not ENV_VAR_NAME.match(value):
        return "<redacted>"
    return value

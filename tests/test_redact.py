"""The one scrubber: what a tool shows of logs, scripts, errors and configs never holds a secret, by value or by shape."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from quanteval import redact
from quanteval.evalserver.backend import tail_lines
from quanteval.faces.server import build_server

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"  # the shape of a Hugging Face token (hf_ + 34)
NVAPI = "nvapi-PLANTED-s3cr3t-9f8e7d"
SK = "sk-live-0123456789abcdefghijKLMN"
# jwt.io's example token (HS256) and AWS's documented example access key id: real formats, no real secrets
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
AKIA = "AKIAIOSFODNN7EXAMPLE"
# Log lines a run, a server or a script prints with secrets in them, and what of each line may be shown.
SECRET_LINES = [
    (f"curl -H 'Authorization: Bearer {NVAPI}' http://judge:8000/v1", "Authorization: Bearer ***"),
    ("authorization: bearer s3cretTokenValue", "authorization: bearer ***"),
    ("sent Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "sent Bearer ***"),
    (f"NGC key {NVAPI} rejected", "NGC key *** rejected"),
    (f"login with {HF} failed", "login with *** failed"),
    (f"openai.AuthenticationError: 401 invalid key {SK}", "invalid key ***"),
    ("MLFLOW_TRACKING_URI is https://bob:hunter22pw@mlflow.internal/x", "https://bob:***@mlflow.internal/x"),
    ("+ export 'JUDGE_API_KEY=planted-export-value'", "+ export 'JUDGE_API_KEY=***"),
    ('NGC_API_KEY="planted quoted value" next', "NGC_API_KEY=*** next"),
    ("password=hunter22", "password=***"),
    # the shapes a probe found unmasked: after an underscore, JSON-escaped, a JWT, an AWS access key id
    (f"HF_TOKEN_{NVAPI} in the environment dump", "HF_TOKEN_*** in"),
    ('{"api_key": "' + NVAPI.replace("-", "\\u002d") + '"}', '{"api_key": "***"}'),
    (f"id_token {JWT} expired", "id_token *** expired"),
    (f"aws_access_key_id {AKIA} from ~/.aws", "aws_access_key_id *** from"),
]
PLANTED = [NVAPI, HF, SK, "s3cretTokenValue", "eyJhbGciOiJIUzI1NiJ9", "hunter22", "planted-export-value", "planted quoted",
           "PLANTED", JWT.split(".")[2], AKIA]


@pytest.mark.parametrize(("line", "shown"), SECRET_LINES)
def test_secrets_are_masked_by_shape_wherever_they_appear(line: str, shown: str) -> None:
    scrubbed = redact.scrub(line, {})
    assert shown in scrubbed
    assert not any(secret in scrubbed for secret in PLANTED)


def test_a_key_a_log_wrapped_onto_the_next_line_is_masked_on_both_and_the_lines_stay() -> None:
    lines = ["judge:", f"  api_key: {NVAPI[:14]}", f"    {NVAPI[14:]}ABCD", "done"]
    shown = redact.shown_lines(lines, {})
    assert shown == ["judge:", "  api_key: ***", "    ***", "done"]


@pytest.mark.parametrize("text", [
    "reading hf_quant_config.json and deployment.hf_model_handle",
    "AKIA is how AWS access key ids begin; eyJ is how a JWT begins",
    "the server requires a bearer token (Authorization: Bearer ...)",
    "missing or wrong bearer token (Authorization: Bearer <$QUANTEVAL_EVAL_TOKEN>)",
    "nvapi-dummy",
    "max_tokens: 1024 for the judge, TOKENIZERS_PARALLELISM false",
    "git clone https://github.com/NVIDIA/NeMo-Skills.git",
])
def test_ordinary_text_that_looks_a_little_like_a_secret_stays(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # not a secret: its name does not end like one
    assert redact.scrub(text) == text


def test_secret_env_values_show_as_their_names_and_secrets_files_as_stars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_planted_secret_value_123")
    monkeypatch.setenv("RL_LOOP_EVAL_TOKEN", "planted-eval-server-token")  # serve-eval --token-env RL_LOOP_EVAL_TOKEN
    secrets_env = tmp_path / ".secrets.env"
    secrets_env.write_text("JUDGE_API_KEY='planted-judge-secret-9f8e7d'\nEMPTY=\nSHORT=abc\n")
    secrets = redact.secret_values([secrets_env])
    assert secrets["planted-judge-secret-9f8e7d"] == "***" and "abc" not in secrets
    text = (f"token hf_planted_secret_value_123, planted-eval-server-token and planted-judge-secret-9f8e7d "
            f"under {tmp_path}")
    assert redact.scrub(text, secrets) == f"token <HF_TOKEN>, <RL_LOOP_EVAL_TOKEN> and *** under {tmp_path}"
    assert redact.scrub("hf_planted_secret_value_123") == "<HF_TOKEN>"  # default: the env's secrets


def test_a_shown_line_is_scrubbed_then_capped_at_the_one_line_cap() -> None:
    line = f"  Authorization: Bearer {'x' * 40} " + "y" * 1000
    shown = redact.shown_line(line, {})
    assert len(shown) == redact.MAX_LINE_CHARS and shown.startswith("Authorization: Bearer *** y")
    assert redact.shown_lines(["  a", "", "HF_TOKEN=zzzz", "z" * 1000], {}) == ["  a", "", "HF_TOKEN=***",
                                                                               "z" * redact.MAX_LINE_CHARS]


def test_configs_are_redacted_by_key_and_env_var_names_stay() -> None:
    config = {"target": {"api_endpoint": {"api_key": "sk-live-1234", "api_key_name": "JUDGE_API_KEY", "url": "http://x"}},
              "params": {"max_new_tokens": 1024, "extra": [{"token": "abc"}]}, "api_keys": ["k1", "k2"], "password": ""}
    assert redact.redact_config(config) == {
        "target": {"api_endpoint": {"api_key": "<redacted>", "api_key_name": "JUDGE_API_KEY", "url": "http://x"}},
        "params": {"max_new_tokens": 1024, "extra": [{"token": "<redacted>"}]}, "api_keys": ["<redacted>", "<redacted>"],
        "password": ""}


def test_the_eval_server_log_tail_is_masked_and_capped(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    log.write_text("\n".join(["start", *(line for line, _ in SECRET_LINES), "x" * 5000]) + "\n")
    tail = tail_lines(log, lines=len(SECRET_LINES) + 2)
    assert tail[0] == "start" and len(tail) == len(SECRET_LINES) + 2
    assert all(shown in line for (_, shown), line in zip(SECRET_LINES, tail[1:], strict=False))
    assert not any(secret in "\n".join(tail) for secret in PLANTED)
    assert len(tail[-1]) == redact.MAX_LINE_CHARS


def test_remote_grep_over_mcp_masks_what_it_matched(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join(["loading", *(line for line, _ in SECRET_LINES), "ready"]) + "\n")

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("remote_grep", {"host": "local", "path": str(log),
                                                          "patterns": ["bearer|key|login|password|MLFLOW|token"]})

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    texts = [match["text"] for match in result.structured_content["matches"]]
    assert len(texts) == len(SECRET_LINES)
    assert all(shown in text for (_, shown), text in zip(SECRET_LINES, texts, strict=True))
    dumped = result.content[0].text + str(result.structured_content)
    assert not any(secret in dumped for secret in PLANTED)


JUDGE = "Zq8mP2_vL9xR4tW7nB5kJ3hG6fD1sA0yC"  # a set secret with no known shape, an underscore in it


def _encoded_forms(value: str) -> dict[str, str]:
    import base64

    return {"base64": base64.b64encode(f"judge:{value}".encode()).decode(),  # inside longer encoded data
            "urlsafe base64": base64.urlsafe_b64encode(value.encode()).decode(), "hex": value.encode().hex(),
            "%5F url-encoding": value.replace("_", "%5F"), "all url-encoded": "".join(f"%{ord(c):02X}" for c in value)}


def test_a_set_secret_is_masked_wrapped_cut_at_a_line_edge_and_in_its_encoded_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", JUDGE)
    for how, form in _encoded_forms(JUDGE).items():
        assert "<JUDGE_API_KEY>" in redact.scrub(f"sent {form} to the judge"), how
    assert redact.shown_lines(["judge key:", f"  {JUDGE[:13]}", f"    {JUDGE[13:]}", "done"]) == \
        ["judge key:", "  <JUDGE_API_KEY>", "    ***", "done"]
    # each half of a wrapped value shown alone (a grep hit is one line)
    assert JUDGE[:13] not in redact.shown_line(f"ERROR auth failed for {JUDGE[:13]}")
    assert JUDGE[13:] not in redact.shown_line(f"    {JUDGE[13:]} rejected")


def test_run_logs_over_mcp_masks_the_log_as_one_block_and_the_encoded_forms_of_set_secrets(tmp_path: Path,
                                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A nel-next run's log whose failure lines carry a key wrapped onto its own indented line, and a set secret
    base64-, hex- and url-encoded: neither its tail, nor any form, reaches the client (tails or failure hits)."""
    import subprocess

    from quanteval import ledger
    from quanteval.engines.nel_next.nelnext import LOG_NAME

    monkeypatch.setenv("JUDGE_API_KEY", JUDGE)
    tail = "Qm9vN3lUb2tlblRhaWwxMjM0NTY3"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    forms = _encoded_forms(JUDGE)
    (run_dir / LOG_NAME).write_text("\n".join([
        "starting", "openai.AuthenticationError: Error code: 401 - Authorization: Bearer", f"    {tail}",
        f"ERROR judge rejected key {JUDGE[:13]}", f"    {JUDGE[13:]}",
        *(f"ERROR request failed ({how}): {form}" for how, form in forms.items()), "done"]) + "\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = ledger.add("canary", status="failed", executor="local", invocation_id=f"nel-next:{run_dir}",
                        details={"engine": "nel-next", "run_dir": str(run_dir), "pgid": gone.pid, "tasks": ["sums"]})

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("run_logs", {"record_id": record.id, "lines": 50})

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    shown = result.content[0].text + str(result.structured_content)
    hits = [hit["text"] for hit in result.structured_content["failures"]]
    assert any("Authorization: Bearer" in hit for hit in hits), hits
    for leaked in (tail, JUDGE, JUDGE[:13], JUDGE[13:], *forms.values()):
        assert leaked not in shown, leaked

"""apply_checkpoint says why for every change it makes, in the same answer (each `changes` line ends with its reason),
for both engines; and it does not undo a person's explicit `protocol: completions` on a checkpoint with a chat template
(it keeps it, with a warning), while a switch it must make (no chat template: the chat endpoint refuses every request)
is made with the reason.

Seen by an assistant over MCP: apply_checkpoint switched `protocol: completions` back to chat_completions, listing the
change but not why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
from factories import make_checkpoint
from mcp import Client
from tiers import BENCH

from quanteval.faces.server import build_server
from quanteval.workflow.nelconfig import (
    ApplyCheckpointInput,
    BuildConfigInput,
    SetConfigValueInput,
    apply_checkpoint,
    build_config,
    load_config,
    set_config_value,
    to_plain,
)

REASON = re.compile(r"^\S+: .+ \(.+\)$")  # `key: old -> new (why)` / `key: removed (why)`


def _next_config(tmp_path: Path, deployment: str, model_type: str) -> str:
    return build_config(BuildConfigInput(engine="nel-next", execution="local", deployment=deployment, model_type=model_type,
                                         benchmarks=[str(BENCH)], config_path=str(tmp_path / f"{deployment}-{model_type}.yaml"))).config_path


def _service(config: str) -> dict:
    return to_plain(load_config(config))["services"]["model"]


def _without_template(checkpoint: Path) -> Path:
    tokenizer = json.loads((checkpoint / "tokenizer_config.json").read_text())
    tokenizer.pop("chat_template", None)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return checkpoint


def test_a_persons_completions_is_kept_with_a_warning_over_mcp(tmp_path):
    """build_config's model_type base wrote completions: a checkpoint with a chat template does not switch it back."""
    chat = make_checkpoint(tmp_path / "chat-model", chat_template="plain")
    config = _next_config(tmp_path, "vllm", "base")
    assert _service(config)["protocol"] == "completions"

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("apply_checkpoint", {"config_path": config, "checkpoint": str(chat)})

    applied = anyio.run(go)
    assert not applied.is_error, applied.content[0].text
    assert _service(config)["protocol"] == "completions"
    answer = applied.structured_content
    assert not any(change.startswith("services.model.protocol") for change in answer["changes"])
    assert any(note.startswith(f"Kept services.model.protocol = completions (the config's choice): {chat.resolve()} has a "
                               "chat template") and "Set it to chat_completions" in note for note in answer["notes"]), answer["notes"]
    assert answer["changes"] and all(REASON.match(change) for change in answer["changes"]), answer["changes"]


def test_a_switch_it_must_make_says_why(tmp_path):
    """No chat template: chat_completions would be refused on every request, so it switches (and the api url with it),
    saying so; a completions the previous checkpoint set (it had no template) is switched back with that reason."""
    base = _without_template(make_checkpoint(tmp_path / "base-model", chat_template="plain"))
    api = _next_config(tmp_path, "none", "chat_reasoning")
    set_config_value(SetConfigValueInput(config_path=api, key="services.model.url", value="http://127.0.0.1:8000/v1/chat/completions"))
    changes = apply_checkpoint(ApplyCheckpointInput(config_path=api, checkpoint=str(base))).changes
    assert (f"services.model.protocol: 'chat_completions' -> 'completions' ({base.resolve()} has no chat template: the "
            "chat endpoint would refuse every request)") in changes
    assert ("services.model.url: 'http://127.0.0.1:8000/v1/chat/completions' -> 'http://127.0.0.1:8000/v1/completions' "
            "(the completions endpoint of the same server)") in changes

    managed = _next_config(tmp_path, "vllm", "chat_reasoning")
    apply_checkpoint(ApplyCheckpointInput(config_path=managed, checkpoint=str(base)))
    assert _service(managed)["protocol"] == "completions"
    chat = make_checkpoint(tmp_path / "chat-model", chat_template="plain")
    changes = apply_checkpoint(ApplyCheckpointInput(config_path=managed, checkpoint=str(chat))).changes
    assert (f"services.model.protocol: 'completions' -> 'chat_completions' ({chat.resolve()} has a chat template; "
            "completions came from the previous checkpoint, which had none)") in changes


def test_every_change_of_both_engines_says_why(tmp_path):
    """A NEL 0.2.6 vllm config and a nel-next one, each moved from one checkpoint to another (reasoning template,
    sampling defaults, quantized): every `changes` line ends with its reason."""
    first = make_checkpoint(tmp_path / "first", chat_template="plain")
    second = make_checkpoint(tmp_path / "second", quant="FP8", chat_template="reasoning", model_type="qwen3",
                             max_position_embeddings=8192)
    (second / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    nel = build_config(BuildConfigInput(execution="local", deployment="vllm", model_type="chat_reasoning",
                                        benchmarks=["core_reasoning"], config_path=str(tmp_path / "nel.yaml"))).config_path
    nel_next = _next_config(tmp_path, "vllm", "chat_reasoning")
    seen = []
    for config in (nel, nel_next):
        for checkpoint in (first, second, first):
            changes = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(checkpoint))).changes
            assert changes and all(REASON.match(change) for change in changes), changes
            seen += changes
    assert any("generation_config.json" in change for change in seen)  # sampling taken from the checkpoint, said so
    assert any("within the serv" in change for change in seen)  # the token budget, with its context
    # back to the first: the second's top_k goes, listed with why (it was a note beside the changes)
    assert ("evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.params_to_add.top_k: removed (it came "
            "from the previous checkpoint's generation_config.json; this one's has none)") in seen

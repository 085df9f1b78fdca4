"""`quanteval-mcp --root` checks what an engine runs, not what the file says: NEL composes its config (defaults, config
groups next to the file, overrides) and interpolates it before it writes run.sh, so the shell check reads NEL's own
composition. Over a real MCP session, as the attacks came."""

from __future__ import annotations

from pathlib import Path

import test_confine
from test_confine import _nel_config, calls

workspace = test_confine.workspace  # the fixture: ROOT and a folder beside it


def _built(inside: Path, outside: Path) -> tuple[str, list]:
    outside.mkdir(exist_ok=True)
    nel = _nel_config(inside, inside / "results")
    return nel["config"], nel["steps"]


def _shell_error(validated, key: str) -> None:
    problems = [p for p in validated.structured_content["problems"] if p["rule"] == "shell_syntax"]
    assert not validated.structured_content["valid"] and [p["key"] for p in problems] == [key], validated.structured_content


def _launch_refused(launched, key: str) -> None:
    assert launched.is_error, launched.structured_content
    text = launched.content[0].text
    assert key in text and "shell command" in text and "composition" in text, text


def test_a_command_pulled_into_a_spliced_key_by_interpolation_is_refused(workspace):
    """`deployment.extra_args: ${evaluation.note}` with the command in evaluation.note (a key nothing splices): the file
    holds no shell syntax where NEL splices, the composed config does."""
    inside, outside = workspace
    marker = outside / "ran"
    config, steps = _built(inside, outside)
    *_, validated, canary, full = calls(
        inside, *steps,
        ("set_config_value", {"config_path": config, "key": "evaluation.note", "value": f"$(touch {marker})"}),
        ("set_config_value", {"config_path": config, "key": "deployment.extra_args", "value": "${evaluation.note}"}),
        ("validate_config", {"config_path": config, "check_env": False}),
        ("launch_canary", {"config_path": config}),
        # the same through an override of a clean config's key
        ("launch_full_run", {"config_path": config, "overrides": ["deployment.extra_args=${evaluation.note}"]}))
    _shell_error(validated, "deployment.extra_args")
    _launch_refused(canary, "deployment.extra_args")
    _launch_refused(full, "deployment.extra_args")
    assert not marker.exists()


def test_a_secret_interpolated_into_a_spliced_key_is_masked_in_the_refusal(workspace, monkeypatch):
    """The composed value is what is checked, and what the refusal quotes: a secret interpolated from the environment
    (`${oc.env:...}`) shows as its variable's name, never its value."""
    inside, outside = workspace
    secret = "s3cr3t;value-that-must-not-leak"
    monkeypatch.setenv("QE_PROBE_API_KEY", secret)
    config, steps = _built(inside, outside)
    *_, validated, canary = calls(
        inside, *steps,
        ("set_config_value", {"config_path": config, "key": "deployment.extra_args", "value": "--api-key ${oc.env:QE_PROBE_API_KEY}"}),
        ("validate_config", {"config_path": config, "check_env": False}), ("launch_canary", {"config_path": config}))
    _shell_error(validated, "deployment.extra_args")
    _launch_refused(canary, "deployment.extra_args")
    for text in (str(validated.structured_content), canary.content[0].text):
        assert secret not in text and "<QE_PROBE_API_KEY>" in text, text


def _group_file(inside: Path, marker: Path) -> Path:
    """deployment/evil.yaml next to the config: a Hydra config group NEL's compose finds before its packaged ones."""
    group = inside / "deployment"
    group.mkdir()
    evil = group / "evil.yaml"
    evil.write_text(f"type: vllm\nimage: \"vllm/vllm-openai:v0.8.5$(touch {marker})\"\ncheckpoint_path: ???\n"
                    "served_model_name: ???\nport: 8000\nextra_args: ''\ncommand: vllm serve /checkpoint ${deployment.extra_args}\n")
    return evil


def test_a_hydra_config_group_next_to_a_clean_config_is_checked_by_override_and_by_defaults(workspace):
    inside, outside = workspace
    marker = outside / "ran"
    config, steps = _built(inside, outside)
    calls(inside, *steps, ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": str(inside)}),
          ("set_config_value", {"config_path": config, "key": "deployment.served_model_name", "value": "tiny"}))
    clean = calls(inside, ("validate_config", {"config_path": config, "check_env": False}))[0]
    assert not [p for p in clean.structured_content["problems"] if p["rule"] in ("shell_syntax", "runs_command")]
    _group_file(inside, marker)
    # by an override on the otherwise clean config
    validated, canary = calls(inside, ("validate_config", {"config_path": config, "overrides": ["deployment=evil"], "check_env": False}),
                              ("launch_canary", {"config_path": config, "overrides": ["deployment=evil"]}))
    _shell_error(validated, "deployment.image")
    _launch_refused(canary, "deployment.image")
    # by the config's own defaults list
    text = Path(config).read_text()
    assert "- deployment: vllm" in text
    Path(config).write_text(text.replace("- deployment: vllm", "- deployment: evil"))
    validated, canary = calls(inside, ("validate_config", {"config_path": config, "check_env": False}),
                              ("launch_canary", {"config_path": config}))
    _shell_error(validated, "deployment.image")
    _launch_refused(canary, "deployment.image")
    assert not marker.exists()


def test_a_group_file_written_after_a_clean_check_is_read_afresh(workspace):
    """A plan is kept per config file; a config group written (or edited) after it was read must not pass on the
    kept plan: `deployment: vllm` in the defaults reads <dir>/deployment/vllm.yaml once there is one."""
    inside, outside = workspace
    marker = outside / "ran"
    config, steps = _built(inside, outside)
    *_, clean = calls(inside, *steps, ("validate_config", {"config_path": config, "check_env": False}))
    assert not [p for p in clean.structured_content["problems"] if p["rule"] == "shell_syntax"]
    evil = _group_file(inside, marker)
    evil.rename(evil.with_name("vllm.yaml"))  # shadows NEL's packaged deployment/vllm.yaml
    validated, canary = calls(inside, ("validate_config", {"config_path": config, "check_env": False}),
                              ("launch_canary", {"config_path": config}))
    _shell_error(validated, "deployment.image")
    _launch_refused(canary, "deployment.image")
    assert not marker.exists()


def test_a_group_file_command_is_a_command_under_the_root(workspace):
    """A config group's own deployment.command (no shell syntax needed: it is a command) is the user's command, not
    NEL's preset: refused under --root like a command written in the file."""
    inside, outside = workspace
    marker = outside / "ran"
    config, steps = _built(inside, outside)
    calls(inside, *steps)
    group = inside / "deployment"
    group.mkdir()
    (group / "mine.yaml").write_text(f"type: vllm\nimage: vllm/vllm-openai:v0.8.5\nport: 8000\ncommand: touch {marker}\n")
    validated, canary = calls(inside, ("validate_config", {"config_path": config, "overrides": ["deployment=mine"], "check_env": False}),
                              ("launch_canary", {"config_path": config, "overrides": ["deployment=mine"]}))
    [named] = [p for p in validated.structured_content["problems"] if p["rule"] == "runs_command"]
    assert named["key"] == "deployment.command" and f"touch {marker}" in named["message"]
    assert canary.is_error and "--allow-commands" in canary.content[0].text and "deployment.command" in canary.content[0].text
    assert not marker.exists()


next_config = test_confine.next_config  # the fixture: a nel-next config inside the root


def test_a_nel_next_playbook_edited_after_a_clean_check_is_read_afresh(workspace, next_config):
    """nel-next merges a benchmark's `playbook:` file into it: its values are checked as composed, and an edit to the
    playbook after a clean check is read again (nel-next's answer is kept by the config file's own stat)."""
    inside, outside = workspace
    outside.mkdir()
    marker = outside / "ran"
    config, steps = next_config
    playbook = inside / "playbook.yaml"
    playbook.write_text("repeats: 1\n")
    calls(inside, *steps)
    text = Path(config).read_text()
    Path(config).write_text(text.replace("  - name: ", f"  - playbook: {playbook}\n    name: ", 1))
    (clean,) = calls(inside, ("validate_config", {"config_path": config}))
    assert not [p for p in clean.structured_content["problems"] if p["rule"] == "shell_syntax"], clean.structured_content
    playbook.write_text(f"repeats: 1\nsandbox:\n  type: ecs_fargate\n  region: \"us-east-1$(touch {marker})\"\n")
    validated, canary = calls(inside, ("validate_config", {"config_path": config}), ("launch_canary", {"config_path": config}))
    _shell_error(validated, "benchmarks.0.sandbox.region")
    _launch_refused(canary, "benchmarks.0.sandbox.region")
    assert not marker.exists()

"""`quanteval`: the registry's tools from the shell, plus a few friendly wrappers. Wiring only.

Exit codes: 0 ok, 1 tool error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quanteval import __version__
from quanteval.models import ToolError
from quanteval.stdio_guard import stdout_to_stderr

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE = 0, 1, 2
# `quanteval evaluate` answers with its exit code too, for CI: 0 acceptable, 3 not acceptable, 4 inconclusive,
# 5 anomalous (the candidate failed the canary its baseline passed). With --max-drop or --policy the release gate
# decides it: 0 GO, 3 NO-GO, 4 INCONCLUSIVE (and 4 for a GO over a suspect serving).
EXIT_NOT_ACCEPTABLE, EXIT_INCONCLUSIVE, EXIT_ANOMALOUS = 3, 4, 5
# `quanteval gate` (tool gate_results), a release gate for CI, exits as `nel gate` does: 0 GO, 1 NO-GO, 2 INCONCLUSIVE, on
# its release verdict: nel gate's, unless one of quanteval's rules beside it (truncation, failures, length) blocks a GO.
# A gate that cannot run exits 1 or 2 as well (message on stderr, nothing on stdout): a release never passes on an error.
EXIT_GATE_NO_GO, EXIT_GATE_INCONCLUSIVE = 1, 2


class UsageError(Exception):
    pass


def run_tool(name: str, arguments: dict[str, Any]) -> BaseModel:
    """Validate and run a tool with library prints kept off stdout. Raises UsageError / ToolError."""
    from quanteval import registry

    try:
        spec = registry.get_tool(name)
    except ToolError as exc:
        raise UsageError(str(exc)) from None

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        if os.environ.get("QUANTEVAL_PROGRESS"):
            of = f"/{total:g}" if total else ""
            print(f"[{name}] {done:g}{of} {message or ''}".rstrip(), file=sys.stderr)

    try:
        return registry.run(spec, arguments, progress)
    except registry.ArgumentsError as exc:
        raise UsageError(str(exc)) from None


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _answer(args: argparse.Namespace, result: Any, text: Callable[[Any], str],
            extra: dict[str, Any] | None = None) -> None:
    """A friendly command's answer: the result as JSON with --json, else as text."""
    if args.json:
        emit_json(result.model_dump(mode="json") | (extra or {}))
    else:
        sys.stdout.write(text(result) + "\n")


def _load_json_arguments(text: str) -> dict[str, Any]:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise UsageError(f"Cannot read arguments file {text[1:]}: {exc.strerror}") from None
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise UsageError(f"--json is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise UsageError("--json must be a JSON object of the tool's arguments, e.g. '{\"path\": \"./model\"}'")
    return value


def cmd_tools(args: argparse.Namespace) -> int:
    from quanteval import registry
    from quanteval.toolsets import TOOLSETS

    if args.json:
        emit_json([{"name": spec.name, "toolset": spec.toolset, "description": spec.description,
                    "input_schema": spec.input_model.model_json_schema(),
                    "output_schema": spec.output_model.model_json_schema(),
                    "annotations": {"read_only": spec.read_only, "destructive": spec.destructive,
                                    "idempotent": spec.idempotent, "open_world": spec.open_world}}
                   for spec in registry.TOOLS.values()])
        return EXIT_OK
    width = max(len(name) for name in registry.TOOLS)
    for number, (name, toolset) in enumerate(TOOLSETS.items()):
        served = ("served by default" if toolset.default
                  else f"off by default over MCP: enable_toolsets [\"{name}\"], or quanteval-mcp --toolsets default,{name}")
        sys.stdout.write(f"{'' if number == 0 else chr(10)}{name}: {toolset.description} ({served})\n")
        for spec in (spec for spec in registry.TOOLS.values() if spec.toolset == name):
            summary = spec.description.replace("\n", " ").split(". ", 1)[0].rstrip(".") + "."
            sys.stdout.write(f"  {spec.name:<{width}}  {summary}\n")
    return EXIT_OK


def cmd_call(args: argparse.Namespace) -> int:
    arguments = _load_json_arguments(args.json)
    from quanteval import registry

    with stdout_to_stderr():
        result = run_tool(args.tool, arguments)
    data, _ = registry.result_json(registry.get_tool(args.tool), result)
    emit_json(data)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        report = run_tool("inspect_checkpoint", {"checkpoint": args.checkpoint})
    from quanteval.serving.checkpoint import format_report

    _answer(args, report, format_report)
    return EXIT_OK


def _key_values(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs (the value is YAML text: `0.6`, `null`, `Qwen/Qwen3-8B`)."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"quanteval plan: --set takes KEY=VALUE, e.g. --set execution.account=llm_eval (got {item!r})")
        pairs[key.strip()] = value
    return pairs


def _progress(command: str) -> Callable[..., None]:
    """A friendly command's progress lines, on stderr: `[plan 2/7] message`."""
    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        print(f"[{command} {done:g}/{total:g}] {message or ''}".rstrip(), file=sys.stderr, flush=True)

    return progress


def cmd_plan(args: argparse.Namespace) -> int:
    from quanteval.workflow.plan import PlanRequest, format_plan, make_plan

    request = PlanRequest.model_validate(field_values(args, PlanRequest) | {"set_values": _key_values(args.set_values or [])})
    with stdout_to_stderr():
        plan = make_plan(request, _progress("plan"))
    _answer(args, plan, format_plan, {"ready": plan.ready})
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    """The one-call answer: serve both checkpoints, canary + full run each, compare; prints the verdict table."""
    from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization
    from quanteval.workflow.evaluate_cluster import ClusterSettings

    cluster = {name: value for name in ClusterSettings.model_fields if (value := getattr(args, f"cluster_{name}", None)) is not None}
    try:
        request = EvaluateQuantizationInput.model_validate(field_values(args, EvaluateQuantizationInput)
                                                           | {"reference_scores": dict(args.reference_scores or [])}
                                                           | ({"cluster": cluster} if cluster else {}))
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    with stdout_to_stderr():
        result = evaluate_quantization(request, _progress("evaluate"))
    _answer(args, result, format_evaluation)
    return evaluation_exit_code(result)


def evaluation_exit_code(result: Any) -> int:
    # suspect (a drop too large to be quantization) is no verdict on the quantization either: 4, as inconclusive
    if result.verdict == "anomalous":
        return EXIT_ANOMALOUS
    if result.gate is not None:
        if result.gate.release_verdict == "NO-GO":  # the release gate's answer, as documented; the verdict line says more
            return EXIT_NOT_ACCEPTABLE
        return EXIT_INCONCLUSIVE if result.gate.release_verdict == "INCONCLUSIVE" or result.verdict == "suspect" else EXIT_OK
    return {"not acceptable": EXIT_NOT_ACCEPTABLE, "inconclusive": EXIT_INCONCLUSIVE,
            "suspect": EXIT_INCONCLUSIVE}.get(result.verdict, EXIT_OK)


def format_evaluation(result: Any) -> str:
    lines = [f"baseline:  {result.baseline.checkpoint}" + (" (reused)" if result.baseline.reused else ""),
             f"candidate: {result.candidate.checkpoint}" + (" (reused)" if result.candidate.reused else ""), "",
             result.table_markdown, "",
             f"verdict: {result.verdict} (comparability: {result.comparability})"]
    floor = {row.message for row in result.noise_floor}
    lines += [f"  - {reason}" for reason in [r for r in result.reasons if r not in floor][:8]]
    if result.noise_floor:
        lines += ["", "serving-noise floor (the baseline served again on its other numeric path):"]
        lines += [f"  - {row.message}" for row in result.noise_floor]
    lines += [f"  candidate answer #{r.problem_idx} (expected {r.expected}): {r.response!r}" for r in result.responses]
    for row in result.comparisons:
        for flip in row.regressed[:5]:
            lines.append(f"  regressed {row.task} #{flip.problem_idx}: expected {flip.expected}, "
                         f"baseline {flip.baseline_answer!r}, candidate {flip.candidate_answer!r}")
    lines += format_outputs(result.outputs, result.weights)
    if result.gate is not None:
        lines += ["", f"release gate ({result.gate.policy}):", format_gate(result.gate)]
    if result.report_markdown:
        lines += ["", f"report: {result.report_markdown}", f"        {result.report_html}"]
    if result.policy_path:
        lines.append(f"policy: {result.policy_path} (nel gate's format: the rule as `nel gate --policy` reads it)")
    lines.append("seconds: " + ", ".join(f"{stage} {value:g}" for stage, value in result.seconds.items()))
    return "\n".join(lines)


def format_outputs(checks: list[Any], weights: Any) -> list[str]:
    """Per benchmark and side: answer length, truncated and failed responses with their denominators, speed; the size."""
    lines = ["", "answers and what the quantization bought:"] if checks or weights else []
    for check in checks:
        for name, side in (("baseline", check.baseline), ("candidate", check.candidate)):
            if side is None:
                continue
            tokens = ("tokens unverified" if side.mean_completion_tokens is None else
                      f"{side.mean_completion_tokens:.1f} mean / {side.median_completion_tokens:g} median completion tokens")
            speed = f", {side.tokens_per_second:g} tokens/s ({side.measured_on})" if side.tokens_per_second and side.measured_on else ""
            lines.append(f"  {check.task} {name}: {tokens}, {side.truncated.said}, {side.failed.said}{speed}")
        if check.length_change is not None:
            lines.append(f"  {check.task} length change: {100 * check.length_change:+.1f}%")
    if weights is not None:
        lines.append(f"  {weights.message}")
    return lines


def cmd_gate(args: argparse.Namespace) -> int:
    """Release gate (tool gate_results): nel gate's policy on two nel-next runs; the verdict is the exit code too."""
    from quanteval.workflow.gate import GateResultsInput

    with stdout_to_stderr():
        result: Any = run_tool("gate_results", field_values(args, GateResultsInput))
    _answer(args, result, format_gate)
    return {"NO-GO": EXIT_GATE_NO_GO, "INCONCLUSIVE": EXIT_GATE_INCONCLUSIVE}.get(result.release_verdict, EXIT_OK)


def format_gate(result: Any) -> str:
    lines = [f"verdict: {result.verdict}"] + [f"  - {reason}" for reason in result.verdict_reasons]
    lines += ["", f"{'benchmark':<24} {'tier':<10} {'status':<22} {'metric':<11} {'baseline':>9} {'candidate':>9} "
              f"{'delta':>8} {'95% CI':>19} {'n':>5}"]
    for b in result.benchmarks:
        def num(value: float | None) -> str:
            return "-" if value is None else f"{value:.4f}"

        ci = "-" if b.delta_ci_lower is None else f"[{b.delta_ci_lower:+.4f}, {b.delta_ci_upper:+.4f}]"
        lines.append(f"{b.benchmark:<24} {b.tier:<10} {b.status:<22} {b.metric or '-':<11} {num(b.baseline_score):>9} "
                     f"{num(b.candidate_score):>9} {num(b.delta):>8} {ci:>19} {b.n_paired:>5}")
        lines += [f"    {reason}" for reason in b.reasons]
    lines += [f"warning: {warning}" for warning in result.warnings]
    findings = [finding for check in result.release_rules for finding in check.findings]
    if findings:  # quanteval's rules beside nel gate's verdict, which stays nel gate's own
        lines += ["", f"release rules (quanteval's, beside nel gate's {result.verdict}): {result.release_verdict}"]
        lines += [f"  - {finding}" for finding in findings[:12]]
    if result.report_path:
        lines += ["", f"gate report: {result.report_path}"]
    return "\n".join(lines)


def cmd_skills_install(args: argparse.Namespace) -> int:
    from quanteval.faces import skillpack

    if args.dest:
        roots = [Path(args.dest).expanduser()]
    else:
        agents = [agent for agent in skillpack.AGENT_SKILL_DIRS if getattr(args, agent)] or list(skillpack.AGENT_SKILL_DIRS)
        roots = [skillpack.skills_root_for(agent, project=args.project) for agent in agents]
    kept = 0
    for root in roots:
        for outcome in skillpack.install_skills(root, force=args.force):
            if outcome.installed:
                sys.stdout.write(f"installed {outcome.skill} -> {outcome.destination}\n")
            else:
                kept += 1
                print(f"quanteval: {outcome.destination} already exists; kept it (use --force to replace)", file=sys.stderr)
    return EXIT_TOOL_ERROR if kept else EXIT_OK


def cmd_serve_eval(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from quanteval.faces.evalserver import ServerSettings, serve

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = ServerSettings.model_validate(field_values(args, ServerSettings))
    except ValidationError as exc:
        print(f"quanteval serve-eval: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", file=sys.stderr)
        return EXIT_USAGE
    settings.output_root = Path(settings.output_root).expanduser().resolve()  # type: ignore[arg-type]
    try:
        serve(settings)
    except OSError as exc:
        raise ToolError(f"cannot serve on {settings.bind_host}:{settings.port}: {exc.strerror}") from None
    return EXIT_OK


# ---------------------------------------------------------------- flags that mirror an input model's fields


def field_argument(parser: argparse.ArgumentParser, model: type[BaseModel], name: str, *flags: str, **options: Any) -> None:
    """An argument for one field of a tool's input model: type, choices, default and help come from the field.

    No flags: a positional argument. A list field takes comma-separated values. `options` override (metavar, help).
    """
    field = model.model_fields[name]
    kind = _unwrap_optional(field.annotation)
    settings: dict[str, Any] = {"help": (field.description or "").replace("%", "%%")}
    if kind is bool:
        settings["action"] = "store_true"
    elif typing.get_origin(kind) is typing.Literal:
        settings["choices"] = list(typing.get_args(kind))
    elif typing.get_origin(kind) is list:
        settings["type"] = _comma_separated
        settings["help"] += " Comma-separated."
    elif kind in (int, float):
        settings["type"] = kind
    if flags:
        settings["dest"] = name
        if field.is_required():
            settings["required"] = True
        elif kind is not bool:
            settings["default"] = field.get_default(call_default_factory=True)
            if settings["default"] not in (None, [], {}):
                settings["help"] += f" Default: {settings['default']}."
    parser.add_argument(*(flags or [name]), **(settings | options))


def field_values(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields the command line set (None: not given, so the model's own default applies)."""
    return {name: getattr(args, name) for name in model.model_fields if getattr(args, name, None) is not None}


def _unwrap_optional(annotation: Any) -> Any:
    options = [option for option in typing.get_args(annotation) if option is not type(None)]
    return options[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(options) == 1 else annotation


def _comma_separated(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


class _FieldParser(argparse.ArgumentParser):
    """A subcommand parser whose field arguments are added when it parses or prints help, not when `quanteval` starts.

    Their input models live in modules that take up to a quarter second to import; `quanteval call` should not pay that.
    """

    def __init__(self, *args: Any, add_fields: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_fields = add_fields

    def _fill(self) -> None:
        if self._add_fields is not None:
            add, self._add_fields = self._add_fields, None
            add(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._fill()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._fill()
        return super().format_help()

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()


def add_serve_eval_options(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerSettings field (the same list start_eval_server takes), so the two cannot drift."""
    from quanteval.evalserver.backend import ServerSettings

    for name in ServerSettings.model_fields:
        field_argument(parser, ServerSettings, name, ServerSettings.cli_flag(name), required=name == "output_root")


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    from quanteval.serving.checkpoint import InspectCheckpointInput

    field_argument(parser, InspectCheckpointInput, "checkpoint", metavar="path")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    from quanteval.workflow.plan import PlanRequest

    field_argument(parser, PlanRequest, "model")
    for name in ("tasks", "execution", "deployment", "model_type", "output_dir", "host", "config", "force"):
        field_argument(parser, PlanRequest, name, "--" + name.replace("_", "-"))
    # set_values is a mapping: on the command line one KEY=VALUE per --set, collected as a list (cmd_plan pairs them).
    field_argument(parser, PlanRequest, "set_values", "--set", action="append", type=str, default=None, metavar="KEY=VALUE",
                   help=f"{PlanRequest.model_fields['set_values'].description} Repeatable; VALUE is YAML, "
                   "e.g. --set execution.account=llm_eval.")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    from quanteval.workflow.evaluate import EvaluateQuantizationInput
    from quanteval.workflow.evaluate_cluster import ClusterSettings

    field_argument(parser, EvaluateQuantizationInput, "baseline_checkpoint", metavar="baseline")
    field_argument(parser, EvaluateQuantizationInput, "candidate_checkpoint", metavar="candidate")
    for name in ("benchmarks", "output_dir", "canary_problems", "max_problems", "max_tokens", "repeats", "temperature",
                 "top_p", "max_drop", "max_length_change", "confidence", "policy", "eager", "noise_floor",
                 "reference_tolerance", "host", "startup_timeout_s", "run_timeout_s"):
        field_argument(parser, EvaluateQuantizationInput, name, "--" + name.replace("_", "-"))
    # with --host a cluster: its settings (cluster_* in the namespace: output_dir is also the evaluation's own)
    for name in ClusterSettings.model_fields:
        flag = "--cluster-output-dir" if name == "output_dir" else "--" + name.replace("_", "-")
        field_argument(parser, ClusterSettings, name, flag, dest=f"cluster_{name}", default=None)
    # reference_scores is a mapping: one TASK=SCORE per --reference-score, collected as pairs (cmd_evaluate makes the dict).
    field_argument(parser, EvaluateQuantizationInput, "reference_scores", "--reference-score", action="append",
                   type=_task_score, default=None, metavar="TASK=SCORE",
                   help=f"{EvaluateQuantizationInput.model_fields['reference_scores'].description} Repeatable, "
                   "e.g. --reference-score tiny_add=95 (points).")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")


def _task_score(text: str) -> tuple[str, str]:
    """One --reference-score; the score itself is checked by the input model."""
    task, sep, score = text.partition("=")
    if not sep or not task.strip():
        raise argparse.ArgumentTypeError(f"takes TASK=SCORE (points 0-100), e.g. tiny_add=95 (got {text!r})")
    return task.strip(), score.strip()


def _gate_arguments(parser: argparse.ArgumentParser) -> None:
    from quanteval.workflow.gate import GateResultsInput

    field_argument(parser, GateResultsInput, "baseline")
    field_argument(parser, GateResultsInput, "candidate")
    field_argument(parser, GateResultsInput, "policy", "--policy")
    field_argument(parser, GateResultsInput, "max_drop", "--max-drop", metavar="POINTS")
    field_argument(parser, GateResultsInput, "output_dir", "--output-dir")
    field_argument(parser, GateResultsInput, "max_length_change", "--max-length-change", metavar="PERCENT")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quanteval",
        description="Evaluate quantized LLM checkpoints with NeMo Evaluator Launcher.",
    )
    parser.add_argument("--version", action="version", version=f"quanteval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_FieldParser)

    tools = sub.add_parser("tools", help="list the tools by toolset with their descriptions (and schemas with --json)")
    tools.add_argument("--json", action="store_true", help="names, toolsets, descriptions, schemas and annotations as JSON")
    tools.set_defaults(func=cmd_tools)

    call = sub.add_parser("call", help="run one tool: quanteval call <tool> --json '<arguments object>'")
    call.add_argument("tool", help="tool name (see `quanteval tools`)")
    call.add_argument("--json", default="{}", help="arguments as a JSON object, '-' for stdin, or @file")
    call.set_defaults(func=cmd_call)

    sub.add_parser("inspect", help="inspect a checkpoint directory or a cached HF handle", add_fields=_inspect_arguments,
                   ).set_defaults(func=cmd_inspect)  # fmt: skip
    sub.add_parser(
        "plan", add_fields=_plan_arguments,
        help="the main job: checkpoint + benchmarks -> a checked NEL config and the canary/full-run commands",
        description="Inspect the checkpoint, build a NEL config, add the tasks, apply the checkpoint, list what is "
        "missing, validate, and dry-run with NEL; prints a summary and the commands to launch. Launches nothing.",
    ).set_defaults(func=cmd_plan)
    sub.add_parser(
        "evaluate", add_fields=_evaluate_arguments,
        help="the whole question: how much accuracy did CANDIDATE lose against BASELINE? (serves, evaluates, compares)",
        description="Tool evaluate_quantization: serves each checkpoint with vLLM here, runs a canary then the full run "
        "of each benchmark with nel-next, validates both runs and compares them (delta, CI, McNemar p, flips, verdict). "
        "Resumable: a second call reuses finished runs. Exit 0 acceptable, 3 not acceptable, 4 inconclusive or suspect, "
        "5 anomalous (the candidate failed the canary its baseline passed: broken quantization or serving bug); "
        "with --max-drop (points) or --policy the gate decides: 0 GO, 3 NO-GO, 4 INCONCLUSIVE.",
    ).set_defaults(func=cmd_evaluate)
    sub.add_parser(
        "gate", add_fields=_gate_arguments,
        help="release gate: GO / NO-GO / INCONCLUSIVE for CANDIDATE against BASELINE under a `nel gate` policy",
        description="Tool gate_results: applies a `nel gate --policy` YAML (tiers, max_drop on the paired 95% CI, "
        "relative guardrail) to two nel-next run folders, with nel gate's rules. Exit 0 GO, 1 NO-GO, 2 INCONCLUSIVE, as nel gate; "
        "an error also exits non-zero (1, or 2 for bad usage), so a release never passes on one.",
    ).set_defaults(func=cmd_gate)

    serve_eval = sub.add_parser(
        "serve-eval",
        help="serve NeMo-Skills evaluations to a training loop (slime's eval-delegate API)",
        description="GET /health, POST /evaluate (blocking), POST /jobs + GET /jobs/<id> (async).",
    )
    add_serve_eval_options(serve_eval)
    serve_eval.set_defaults(func=cmd_serve_eval)

    skills = sub.add_parser("skills", help="the skill pack for AI assistants")
    skills_sub = skills.add_subparsers(dest="skills_command", required=True, metavar="SKILLS_COMMAND")
    install = skills_sub.add_parser(
        "install",
        help="copy the skill pack from this installation into an assistant's skills folder (no network)",
        description="With no assistant flag, installs for all of them (as `nel skills add` does).",
    )
    for agent, label in (("claude", "Claude Code"), ("codex", "Codex"), ("cursor", "Cursor"), ("opencode", "OpenCode")):
        install.add_argument(f"--{agent}", action="store_true", help=f"install for {label}")
    install.add_argument("--project", action="store_true", help="install into the current project instead of your home")
    install.add_argument("--force", action="store_true", help="replace skills that are already installed")
    install.add_argument("--dest", help="install into this skills folder instead (ignores the assistant flags)")
    install.set_defaults(func=cmd_skills_install)

    return parser


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: servers stopped, the launch or run in flight cancelled


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is not threading.main_thread():  # only the main thread may take signals
        return _run(args)
    previous = signal.signal(signal.SIGTERM, _terminate)  # serve-eval installs its own on top
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"quanteval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ToolError as exc:
        print(f"quanteval: {exc}", file=sys.stderr)
        return EXIT_TOOL_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: say so without a traceback unless asked
        if os.environ.get("QUANTEVAL_DEBUG"):
            raise
        print(f"quanteval: internal error ({type(exc).__name__}); rerun with QUANTEVAL_DEBUG=1 for details", file=sys.stderr)
        return EXIT_TOOL_ERROR


if __name__ == "__main__":
    sys.exit(main())

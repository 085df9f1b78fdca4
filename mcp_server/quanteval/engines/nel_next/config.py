"""nel-next's config knowledge: its skeleton, what its model service takes from a checkpoint, and its validation
(nel-next's own EvalConfig as the schema oracle, our chain rules on top).

nel-next's service (`services.<name>`) holds what NEL 0.2.6 spreads over deployment and evaluation params:
the model path and served name, TP and server flags for a server nel-next starts (vllm, sglang), the protocol,
and `generation` (max_tokens, temperature, top_p). nel-next has no top_k field: it reaches the server through the
service's adapter proxy (`proxy.extra_body`), which merges it into every request (measured with vLLM's request log).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from quanteval import configfile, envvars
from quanteval.clusters import executor as executors
from quanteval.configfile import MISSING, has_path, set_path, to_plain, value_at, walk
from quanteval.engines.base import (
    PARALLEL_KEYS,
    ApplyCheckpointInput,
    ApplyCheckpointOutput,
    Problem,
    unpinned_image,
    unpinned_image_problem,
)
from quanteval.engines.nel_next import clustertypes, nelnext, servers, skills
from quanteval.engines.recipes import recipe_for_benchmark, task_context_problem
from quanteval.models import ProgressFn, ToolError
from quanteval.paths import looks_local
from quanteval.serving import checkpoint, frameworks, serverflags
from quanteval.serving.serverflags import generation_budget, owned_flags, parse_extra_args

MANAGED = frameworks.NEL_NEXT_SERVICES  # servers nel-next starts from a model path, with flags quanteval knows
WriteFn = Callable[[CommentedMap, str, Any, str], None]  # (doc, dotted path, value, why): every change says why


# ---------------------------------------------------------------------------
# The skeleton


def build_problem(deployment: str, model_type: str, benchmarks: list[str]) -> str | None:
    if deployment not in ("none", *MANAGED):
        return f"deployment '{deployment}': nel-next configs here take none (an existing endpoint), {frameworks.one_of(MANAGED)}"
    return None


def config_stem(execution: str, deployment: str, model_type: str, benchmarks: list[str]) -> str:
    """Told apart from NEL configs by a prefix; a benchmark file by its stem, skills://NAME as skills_NAME."""
    names = sorted(Path(name).stem.replace("://", "_") for name in benchmarks)
    return f"nelnext_{execution}_{deployment}_{model_type}_{'_'.join(names)}"[:120]


def skeleton(execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str, directory: Path) -> tuple[CommentedMap, list[str]]:
    """One model service (an existing endpoint, or a vLLM/SGLang server nel-next starts), a simple solver per
    benchmark, the local or SLURM cluster, output without a timestamp (quanteval names each run's directory).
    A BYOB file given by a relative path is written as an absolute one: nel-next resolves it against its own cwd."""
    benchmarks = [str(Path(name).expanduser().resolve()) if name.endswith(".py") else name for name in benchmarks]
    protocol = "completions" if model_type == "base" else "chat_completions"
    # beside the config where the run writes here; on a cluster a directory there, which only the person knows
    here = executors.for_name(execution).local_path(directory / "results")
    output_dir = str(here) if here is not None else MISSING
    plain = nelnext.config_document(benchmarks=benchmarks, protocol=protocol, execution=execution, output_dir=output_dir)
    if names := [name[len(skills.SCHEME):] for name in benchmarks if name.startswith(skills.SCHEME)]:
        found = skills.probe(names)  # NeMo-Skills' prompt for each, as nel-next's instruction_template / system_prompt
        plain["benchmarks"] = [{**skills.benchmark_item(name, found), "repeats": 1} for name in benchmarks]
    if deployment != "none":
        plain["services"]["model"] = {"type": deployment, "model": MISSING, "protocol": protocol,
                                      "served_model_name": MISSING, "generation": plain["services"]["model"]["generation"]}
    doc = configfile.as_round_trip(plain)
    for item in doc["benchmarks"]:
        skills.show_prompt(item)
    doc.yaml_set_start_comment("nel-next (nemo-evaluator >= 0.3) config, written by quanteval build_config.\n"
                               "??? marks values to fill: apply_checkpoint, deployment_status's config_values, set_config_value.")
    return doc, benchmarks


def execution_type(doc: Any) -> str:
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    return str(cluster.get("type") or "local") if isinstance(cluster, dict) else "local"


def deployment_type(doc: Any) -> str:
    """The server nel-next starts for the model service (vllm, sglang), or none for an endpoint (type api)."""
    services = doc.get("services") if isinstance(doc, dict) else None
    types = [s.get("type") for s in (services or {}).values() if isinstance(s, dict)] if isinstance(services, dict) else []
    return next((str(t) for t in types if t in MANAGED), "none")


# ---------------------------------------------------------------------------
# apply_checkpoint



def model_service(doc: Any, config_path: str) -> tuple[str, dict[str, Any]]:
    """The one model service a quanteval-built config has (a judge service would be a second one)."""
    services = doc.get("services") if isinstance(doc, dict) else None
    models = {name: s for name, s in (services or {}).items() if isinstance(s, dict) and (s.get("type") in (*MANAGED, "api"))}
    if len(models) != 1:
        found = ", ".join(f"{name} ({s.get('type')})" for name, s in (services or {}).items() if isinstance(s, dict)) or "none"
        raise ToolError(f"{config_path}: apply_checkpoint needs exactly one {frameworks.one_of([*MANAGED, 'api'])} service under services:, found {found}. "
                        "Set the service's values with set_config_value instead.")
    return next(iter(models.items()))


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn, check: configfile.Check) -> ApplyCheckpointOutput:
    """nel-next: the service's model, served name, TP and server flags (managed servers), the protocol by the chat
    template (a person's completions kept, with a warning), max_tokens within the context, and the checkpoint's sampling
    where the config has none of its own. Each change line says why."""
    config_path = Path(request.config_path).expanduser()
    name, service = model_service(configfile.load_config(config_path, check), request.config_path)
    progress(0, 2, "inspecting checkpoint")
    report = checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=request.checkpoint))
    progress(1, 2, "writing config")
    framework = service.get("type")
    prefix = f"services.{name}"
    old = _previous_checkpoint(service.get("model"), config_path) if framework in MANAGED else None
    changes: list[str] = []
    notes: list[str] = []

    def write(doc: CommentedMap, path: str, value: Any, why: str) -> None:
        before = value_at(doc, path)
        if before != value or not has_path(doc, path):
            set_path(doc, path, value)
            changes.append(f"{path}: {to_plain(before)!r} -> {to_plain(value)!r} ({why})")

    def mutate(doc: CommentedMap) -> None:
        changes.clear()
        notes.clear()
        if framework in MANAGED:
            _apply_server(doc, prefix, framework, report, request, write)
        _apply_protocol(doc, prefix, service, report, old, write, notes)
        _apply_generation(doc, prefix, report, old, write, notes)

    diff = configfile.edit_config(config_path, mutate, check)
    flags = report.deployment_flags.get(framework) if framework in MANAGED else None
    notes = list(dict.fromkeys(list(report.warnings) + (list(flags.notes) if flags else []) + notes))
    missing = configfile.missing_value_paths(configfile.load_config(config_path, check))
    return ApplyCheckpointOutput(config_path=request.config_path, changes=changes, diff=diff, missing_values=missing, notes=notes)


def _protocol_for(report: checkpoint.CheckpointReport) -> str:
    return "chat_completions" if report.chat_template else "completions"


def _apply_protocol(doc: CommentedMap, prefix: str, service: dict[str, Any], report: checkpoint.CheckpointReport,
                    old: checkpoint.CheckpointReport | None, write: WriteFn, notes: list[str]) -> None:
    """The endpoint by the chat template. Without one the chat endpoint refuses every request: chat_completions is
    switched to completions, saying so. With one, completions is a person's choice (build_config's model_type base, or
    set by hand: few-shot prompts of a base-model protocol) and is kept, with a warning; only a value the previous
    checkpoint set (it had no template) or none at all is switched to chat_completions."""
    path, current, wanted = f"{prefix}.protocol", value_at(doc, f"{prefix}.protocol"), _protocol_for(report)
    if current == wanted:
        return
    ours = current in (None, MISSING) or (old is not None and current == _protocol_for(old))
    if wanted == "completions":
        why = f"{report.checkpoint} has no chat template: the chat endpoint would refuse every request"
    elif ours:
        why = f"{report.checkpoint} has a chat template" + (f"; {current} came from the previous checkpoint, which had none"
                                                            if current not in (None, MISSING) else "")
    else:
        notes.append(f"Kept {path} = {current} (the config's choice): {report.checkpoint} has a chat template, which "
                     f"{current} does not apply (prompts go to the model as they are), so a chat-tuned model may answer "
                     "nothing the scorer reads. Set it to chat_completions (set_config_value) to use the template.")
        return
    write(doc, path, wanted, why)
    url = service.get("url")
    if service.get("type") == "api" and isinstance(url, str) and url != MISSING:
        write(doc, f"{prefix}.url", nelnext.endpoint_url(url, wanted), f"the {wanted} endpoint of the same server")


def _apply_server(doc: CommentedMap, prefix: str, framework: str, report: checkpoint.CheckpointReport,
                  request: ApplyCheckpointInput, write: WriteFn) -> None:
    """What nel-next's vllm/sglang service starts: the model, its served name, TP, and the checkpoint's server flags."""
    write(doc, f"{prefix}.model", request.cluster_checkpoint_path or report.hf_handle or report.checkpoint,
          "the checkpoint the server loads" + (" (its path on the cluster)" if request.cluster_checkpoint_path else ""))
    write(doc, f"{prefix}.served_model_name", request.served_model_name or report.hf_handle or Path(report.checkpoint).name,
          "as asked" if request.served_model_name else "the name requests use: the checkpoint's " +
          ("Hugging Face handle" if report.hf_handle else "folder name"))
    tp = request.tensor_parallel_size or (report.gpu_fit[0].tensor_parallel_size if report.gpu_fit else None)
    if tp:
        write(doc, f"{prefix}.tensor_parallel_size", tp, "as asked" if request.tensor_parallel_size else
              f"what its weights need on {report.gpu_fit[0].gpu_type} (inspect_checkpoint's gpu_fit)" if report.gpu_fit else "")
    flags = report.deployment_flags.get(framework)
    additions = parse_extra_args(" ".join(shlex.quote(arg) for arg in flags.args)) if flags else []
    parser = frameworks.REASONING_PARSERS.get(report.architecture.model_type or "", {}).get(framework) if report.reasoning else None
    if parser:
        additions.append(("--reasoning-parser", parser))
    current = value_at(doc, f"{prefix}.extra_args") or []
    kept = parse_extra_args(" ".join(shlex.quote(str(arg)) for arg in current))
    needed = {flag for flag, _ in additions}
    owned = owned_flags(framework)
    merged = [option for option in kept if option[0] not in needed and option[0] not in owned] + additions
    argv = [part for flag, value in merged for part in ((flag,) if value is None else (flag, value))]
    if argv != list(current):
        write(doc, f"{prefix}.extra_args", argv, f"the flags {framework} needs for this checkpoint: its context, format"
              + (", reasoning parser" if parser else "") + "; a previous checkpoint's are dropped, yours kept")


def _apply_generation(doc: CommentedMap, prefix: str, report: checkpoint.CheckpointReport,
                      old: checkpoint.CheckpointReport | None, write: WriteFn, notes: list[str]) -> None:
    """max_tokens inside the context; temperature/top_p/top_k from generation_config.json where the config has none,
    or has the previous checkpoint's. build_config's greedy temperature 0.0 is a choice and is kept, with a note."""
    context = report.context_length
    path = f"{prefix}.generation.max_tokens"
    current = value_at(doc, path)
    if context:
        budget = generation_budget(context)
        old_budget = generation_budget(old.context_length) if old and old.context_length else None
        if current in (MISSING, None, old_budget) or (isinstance(current, int) and current >= context):
            write(doc, path, budget, f"{current} is not below the context {context}: every request would be refused"
                  if isinstance(current, int) and current >= context else f"within the served context {context}, leaving "
                  f"{context - budget} tokens for the prompt")
    wanted = report.generation_defaults
    previous = old.generation_defaults if old else {}
    for key, target in (("temperature", f"{prefix}.generation.temperature"), ("top_p", f"{prefix}.generation.top_p"),
                        ("top_k", f"{prefix}.proxy.extra_body.top_k")):
        want, have = wanted.get(key), value_at(doc, target)
        if want is None or have == want:
            continue
        if have is None or (key in previous and have == previous[key]):
            write(doc, target, want, "the checkpoint's generation_config.json" + (
                "" if have is None else "; the value was the previous checkpoint's"))
        else:
            notes.append(f"Kept {target} = {have}; the checkpoint's generation_config.json recommends {want}.")


def _previous_checkpoint(model: Any, config_path: Path) -> checkpoint.CheckpointReport | None:
    """The checkpoint the service pointed at before, when it is a local directory: its values are ours to replace."""
    if not isinstance(model, str) or model == MISSING:
        return None
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = config_path.parent / path
    if not (path / "config.json").is_file():
        return None
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=str(path)))
    except ToolError:
        return None

# ---------------------------------------------------------------------------
# validation

SERVED_FACTS_TIMEOUT_S = 3.0


def served_facts(url: str) -> dict[str, Any] | None:
    """What an OpenAI-compatible server says it serves (/v1/models): id, root (vLLM: the model directory) and
    max_model_len. None when it does not answer: the rules that need it are then skipped, not guessed."""
    import httpx  # only here: the server starts without it

    models_url = nelnext.endpoint_url(url, "chat_completions").rsplit("/chat/completions", 1)[0] + "/models"
    try:
        answer = httpx.get(models_url, timeout=SERVED_FACTS_TIMEOUT_S)
        data = answer.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return data[0] if data and isinstance(data[0], dict) else None


def service_model(service: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The checkpoint directory behind a nel-next service and what its server says it serves: a managed server's
    model path, or for an endpoint (type api) the model root vLLM reports in /v1/models. None where unknown."""
    url = service.get("url")
    served = served_facts(url) if service.get("type") == "api" and isinstance(url, str) and "???" not in url else None
    candidate = service.get("model") if service.get("type") in MANAGED else (served or {}).get("root")
    found = isinstance(candidate, str) and Path(candidate).expanduser().is_dir()
    return (str(Path(candidate).expanduser().resolve()) if found else None), served


def _next_checkpoint(directory: str | None) -> checkpoint.CheckpointReport | None:
    if directory is None:
        return None
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=directory))
    except ToolError:
        return None


def _next_service_rules(name: str, service: dict[str, Any], problems: list[Problem]) -> int | None:
    """The service's own rules; returns its served context (the server's max_model_len, else the checkpoint's)."""
    prefix = f"services.{name}"
    directory, served = service_model(service)
    report = _next_checkpoint(directory)
    generation = service.get("generation") or {}
    context = (served or {}).get("max_model_len") or (report.context_length if report else None)
    budget = generation.get("max_tokens")
    if isinstance(budget, str) and budget.isdigit():
        budget = int(budget)
    if isinstance(context, int) and isinstance(budget, int) and budget >= context:
        source = "the server's max_model_len" if served and served.get("max_model_len") else "the checkpoint's context"
        problems.append(Problem(key=f"{prefix}.generation.max_tokens", severity="error", rule="budget_exceeds_context",
                                message=f"max_tokens {budget} is not below {source} ({context}): the server answers 400 to every request.",
                                fix=f"Set max_tokens below {context} minus the longest prompt (e.g. {max(1, context // 2)})."))
    protocol = service.get("protocol")
    if report is not None and protocol == "chat_completions" and not report.chat_template:
        problems.append(Problem(key=f"{prefix}.protocol", severity="error", rule="no_chat_template",
                                message=f"{report.checkpoint} has no chat template, so the chat endpoint refuses requests.",
                                fix="Use protocol: completions (a base model) with benchmarks that take plain prompts, or add a chat template to the checkpoint."))
    if report is not None and report.generation_defaults.get("temperature") not in (None, 0, 0.0) and generation.get("temperature") is None:
        problems.append(Problem(key=f"{prefix}.generation.temperature", severity="warning", rule="sampling_unset",
                                message=f"temperature is unset; the checkpoint's generation_config.json uses {report.generation_defaults['temperature']}.",
                                fix="Set it explicitly (0.0 for a greedy, reproducible comparison), the same for baseline and candidate."))
    if served is not None and isinstance(service.get("model"), str) and service["model"] not in ("???", served.get("id")):
        problems.append(Problem(key=f"{prefix}.model", severity="error", rule="served_name_mismatch",
                                message=f"the server at {service['url']} serves '{served.get('id')}', not '{service['model']}': every request gets 404.",
                                fix=f"Set {prefix}.model to {served.get('id')}."))
    return context if isinstance(context, int) else None


NEXT_PROTOCOL_PATHS = {"chat_completions": "/chat/completions", "completions": "/completions", "responses": "/responses"}


def _next_slurm_url_rule(name: str, service: dict[str, Any], problems: list[Problem]) -> None:
    """nel-next 0.3.0 on SLURM appends the protocol's path to an api service's url (slurm_gen: ${URL}/chat/completions),
    while its local runs strip it: a url that already ends with it works here and 404s on every request there."""
    url, suffix = str(service.get("url") or ""), NEXT_PROTOCOL_PATHS.get(str(service.get("protocol") or "chat_completions"), "")
    if service.get("type") == "api" and suffix and url.rstrip("/").endswith(suffix):
        base = url.rstrip("/")[: -len(suffix)]
        problems.append(Problem(key=f"services.{name}.url", severity="error", rule="url_path_doubled_on_slurm",
                                message=f"nel-next's SLURM job appends {suffix} to {url}: every request goes to {url.rstrip('/')}{suffix} and fails.",
                                fix=f"Set it to the base URL {base} (local runs take it too)."))


def benchmark_file_problems(benchmarks: list[Any]) -> list[Problem]:
    """A BYOB benchmark file that does not compile: nel-next would fail on it only when the run starts (after a
    server is up); compiled here, never run. Shared by validate_config and evaluate_quantization's pre-flight."""
    problems: list[Problem] = []
    for index, bench in enumerate(benchmarks):
        name = str((bench or {}).get("name", "")) if isinstance(bench, dict) else ""
        path = Path(name.split(".py:", 1)[0] + ".py" if ".py:" in name else name).expanduser()
        if path.suffix != ".py" or not path.is_file():
            continue
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            problems.append(Problem(key=f"benchmarks[{index}].name", severity="error", rule="benchmark_syntax_error",
                                    message=f"{path}:{exc.lineno}: {exc.msg}: nel-next cannot import this benchmark file.",
                                    fix="Fix the file (python -m py_compile FILE shows the error) and try again."))
        except (OSError, ValueError) as exc:  # unreadable, or a NUL byte in it
            problems.append(Problem(key=f"benchmarks[{index}].name", severity="error", rule="benchmark_syntax_error",
                                    message=f"{path}: cannot be read as Python ({exc}).", fix="Point it at the benchmark's .py file."))
    return problems


def skills_benchmark_problems(benchmarks: list[Any], cluster: dict[str, Any] | None = None) -> list[Problem]:
    """What stops nel-next's skills:// benchmarks from measuring what NeMo-Skills measures, before anything is served:
    a NeMo-Skills that does not fit nel-next, an unknown name, data not prepared or rows without NeMo-Skills' fields,
    a METRICS_TYPE nel-next does not grade, NeMo-Skills' prompt not sent; on SLURM (cluster), a benchmark the job
    cannot find. Shared by validate_config and evaluate_quantization's pre-flight."""
    names = skills.skills_names(benchmarks)
    if not names:
        return []
    if misnamed := [Problem(key=f"benchmarks[{index}].name", severity="error", rule="skills_name", message=problem,
                            fix="skills://NAME with NAME one of NeMo-Skills' benchmarks (e.g. skills://aime24).")
                    for index, name in names.items() if (problem := skills.name_problem(name))]:
        return misnamed
    found = skills.probe(list(names.values()))
    if found.problem:
        return [Problem(key=f"benchmarks[{min(names)}]", severity="error", rule="skills_unavailable",
                        message=f"skills:// benchmarks run NeMo-Skills inside nel-next, and {found.problem}: the benchmark fails at start.",
                        fix=f"Run `{envvars.setup_command('setup-nel-next', 'QUANTEVAL_NEL_NEXT_VENV')}`: it installs NeMo-Skills {skills.NEMO_SKILLS_COMMIT} (the commit that fits "
                            f"nel-next 0.3.0) into nel-next's venv ({nelnext.venv()}) with the grader module nel-next "
                            f"imports, from QUANTEVAL_NEL_NEXT_SKILLS_SRC (a source tree, .tar.gz or pip URL) if set, else "
                            f"{skills.NEMO_SKILLS_UPSTREAM} (GitHub). Or run the benchmark with NEL 0.2.6's ns_* task "
                            "(its container brings NeMo-Skills).")]
    problems: list[Problem] = []
    cluster_type = clustertypes.of(cluster)
    for index, name in names.items():
        bench = found.benchmarks.get(name) or skills.Benchmark(name, unknown=True)
        problems += _skills_item_problems(index, benchmarks[index], bench)
        if cluster_type and cluster_type.exported_environment:
            problems += _skills_slurm_problems(index, bench, cluster or {})
    return problems


def _skills_slurm_problems(index: int, bench: skills.Benchmark, cluster: dict[str, Any]) -> list[Problem]:
    """On SLURM nel-next runs on the node, with the environment sbatch gives the job (not this process's): a benchmark
    registered here through NEMO_SKILLS_EXTRA_BENCHMARK_MAP is unknown there unless the job's export carries the map."""
    variable = nelnext.SKILLS_BENCHMARK_MAP
    if not bench.mapped or variable in nelnext.job_exports(cluster):
        return []
    export = str((cluster.get("sbatch_extra_flags") or {}).get("export") or "")
    mapping = os.environ.get(variable, "")
    return [Problem(key=f"benchmarks[{index}].name", severity="error", rule="skills_map_not_on_cluster",
                    message=f"skills://{bench.name} is registered here through {variable}={mapping}, but on SLURM "
                            "nel-next runs on the node with the environment sbatch gives the job, which does not carry it: "
                            "there the benchmark is unknown and the job fails at start.",
                    fix=f"Pass it to the job: cluster.sbatch_extra_flags.export: "
                        f"{'ALL,' if not export else export + ','}{variable}=<the map's path on the cluster> "
                        "(the map, its benchmark folders and their data must be readable on the node).")]


def _skills_item_problems(index: int, item: dict[str, Any], bench: skills.Benchmark) -> list[Problem]:
    params = item.get("params") if isinstance(item, dict) else None
    ignored = [Problem(key=f"benchmarks[{index}].params", severity="warning", rule="skills_params_ignored",
                       message=f"nel-next 0.3.0 passes no params to skills:// benchmarks: {', '.join(map(str, params))} "
                               "has no effect (its skills factory reads none of them).",
                       fix="Remove params; the prompt goes in instruction_template / solver.system_prompt.")] if params else []
    return ignored + _skills_data_problems(index, item, bench)


def _skills_data_problems(index: int, item: dict[str, Any], bench: skills.Benchmark) -> list[Problem]:
    key, name = f"benchmarks[{index}].name", bench.name
    if bench.unknown:
        close = f"; closest: {', '.join(bench.close)}" if bench.close else ""
        return [Problem(key=key, severity="error", rule="skills_unknown_benchmark",
                        message=f"NeMo-Skills ({nelnext.venv()}) has no benchmark '{name}'{close}.",
                        fix="Use a NeMo-Skills benchmark name, or register your own: NEMO_SKILLS_EXTRA_BENCHMARK_MAP=a JSON file "
                            '{"NAME": "DIR/NAME"}, DIR/NAME holding __init__.py (METRICS_TYPE, GENERATION_ARGS) and test.jsonl.')]
    if why := skills.grading_problem(name, bench.metrics_type):
        return [Problem(key=key, severity="error", rule="skills_not_graded",
                        message=f"{why}: the comparison would say nothing was lost while measuring nothing.",
                        fix=f"Run it with NEL 0.2.6's NeMo-Skills task (its container runs `ns eval`, which grades "
                            f"'{bench.metrics_type}'), or use a nel-next benchmark that grades its own answers.")]
    problems: list[Problem] = []
    if not Path(bench.data_file).is_file() and bench.prepared:
        problems.append(Problem(key=key, severity="error", rule="skills_data_missing",
                                message=f"skills://{name} ships its data in NeMo-Skills' package ({bench.prepared['from']}), "
                                        f"but copying it to {bench.data_file} (NeMo-Skills' prepare) failed: {bench.prepared['error']}",
                                fix=f"Make {Path(bench.data_file).parent} writable, or run `{nelnext.venv()}/bin/python -m "
                                    f"nemo_skills.dataset.prepare {name}` as a user who can write there."))
    elif not Path(bench.data_file).is_file():
        problems.append(Problem(key=key, severity="error", rule="skills_data_missing",
                                message=f"skills://{name} has no prepared data: nel-next reads {bench.data_file} (data dir "
                                        f"{bench.data_dir}), and without it downloads at start (`python -m "
                                        f"nemo_skills.dataset.prepare {name}`; with no network that fails after up to 5 minutes).",
                                fix=f"Prepare it: `ns prepare_data {name}` with the NeMo-Skills in nel-next's venv "
                                    f"({nelnext.venv()}/bin/python -m nemo_skills.dataset.prepare {name}; it downloads), or "
                                    f'write your rows ({{"problem", "expected_answer"}} per line) to {bench.data_file}.'))
    elif bench.bad_row:
        number, why = bench.bad_row
        problems.append(Problem(key=key, severity="error", rule="skills_bad_row",
                                message=f"row {number} of {bench.data_file} {why}: NeMo-Skills' prompt and grader read "
                                        f"{' and '.join(skills.REQUIRED_FIELDS)} from every row.",
                                fix=f"Fix row {number} (or prepare the data again with `ns prepare_data {name}`)."))
    elif bench.rows == 0:
        problems.append(Problem(key=key, severity="error", rule="skills_bad_row",
                                message=f"{bench.data_file} has no rows: skills://{name} would measure nothing.",
                                fix=f"Prepare it again with `ns prepare_data {name}`."))
    problems += _skills_prompt_problems(index, item, bench)
    return problems


def _skills_prompt_problems(index: int, item: dict[str, Any], bench: skills.Benchmark) -> list[Problem]:
    prompt = bench.prompt or {}
    if not prompt.get("user") or (isinstance(item, dict) and item.get("instruction_template")):
        return []
    try:
        settings = skills.prompt_settings(bench)
    except skills.PromptError as exc:
        return [Problem(key=f"benchmarks[{index}]", severity="warning", rule="skills_prompt_unsendable",
                        message=f"NeMo-Skills prompts skills://{bench.name} with {prompt['config']}, and {exc}.",
                        fix="Write an instruction_template that asks what the prompt config asks.")]
    first_line = str(prompt["user"]).strip().splitlines()[0][:120]
    return [Problem(key=f"benchmarks[{index}]", severity="warning", rule="skills_prompt_missing",
                    message=f"skills://{bench.name} is sent the bare problem, while NeMo-Skills sends its prompt config "
                            f"{prompt['config']} ({first_line!r}): NeMo-Skills' grader reads the answer from \\boxed{{}}, "
                            "which a model not asked for it rarely writes, so scores are not NeMo-Skills' (often near 0).",
                    fix="Set " + ", ".join(f"{k}: {v}" for k, v in settings.items()) + " (add_tasks and build_config write it).")]


def validate_document(doc: dict[str, Any], config_path: Path, overrides: list[str] | None = None,
                      check_env: bool = True) -> list[Problem]:
    """A nel-next config: values still ???, nel-next's own schema (its pydantic EvalConfig, run in its venv), then
    the chain rules a schema cannot know: budget vs served context, chat endpoint vs chat template, sampling,
    the served model name."""
    problems = [Problem(key=key, severity="error", rule="missing_value", message=f"{key} is still ???.",
                        fix="Fill it: apply_checkpoint, the values deployment_status gives, or set_config_value.")
                for key, value in walk(doc) if value == MISSING]
    if problems:
        return problems  # nel-next's schema would only repeat them, less clearly
    for key, value in walk(doc):  # e.g. NEL's `username: ${oc.env:USER}` pasted into a nel-next config
        if isinstance(value, str) and "${oc." in value:
            problems.append(Problem(key=key, severity="error", rule="omegaconf_interpolation", message=(
                f"{key}: {value!r} is OmegaConf syntax (NEL's); nel-next expands only ${{VAR}} and ${{VAR:-default}} and "
                "would use the text as it is."), fix="Write ${VAR} (or ${VAR:-default}) for an environment variable, or the value itself."))
    checked = nelnext.check_schema(str(config_path), overrides)
    for problem in checked.problems:
        problems.append(Problem(key=problem["path"] or "(config)", severity="error", rule="nel_next_schema",
                                message=f"nel-next rejects it: {problem['message']}",
                                fix="Correct the key or value as nel-next's schema says (extra keys are forbidden)."))
    contexts: dict[str, int | None] = {}
    cluster_type = clustertypes.of(doc.get("cluster"))
    for name, service in (doc.get("services") or {}).items():
        if isinstance(service, dict):
            contexts[str(name)] = _next_service_rules(str(name), service, problems)
            if cluster_type and cluster_type.appends_protocol_path:
                _next_slurm_url_rule(str(name), service, problems)
    cluster = doc.get("cluster") if isinstance(doc.get("cluster"), dict) else {}
    images = [("cluster.eval_image", cluster.get("eval_image"))]  # the container nel-next's SLURM job evaluates in
    images += [(f"services.{name}.image", service.get("image")) for name, service in (doc.get("services") or {}).items()
               if isinstance(service, dict)]
    problems += [unpinned_image_problem(path, image) for path, image in images if unpinned_image(image)]
    problems += [Problem(key=f"services.{name}.type", severity="error", rule="server_framework_missing",
                         message=str(found.problem), fix=str(found.fix)) for name, found in servers.problems(doc).items()]
    for index, bench in enumerate(doc.get("benchmarks") or []):
        solver = (bench or {}).get("solver") or {}
        service = (doc.get("services") or {}).get(solver.get("service"), {}) if isinstance(doc.get("services"), dict) else {}
        budget = ((solver.get("generation") or {}).get("max_tokens") or (service.get("generation") or {}).get("max_tokens")) if isinstance(service, dict) else None
        found = task_context_problem(str((bench or {}).get("name")), recipe_for_benchmark(str((bench or {}).get("name", ""))),
                                     contexts.get(str(solver.get("service"))), budget if isinstance(budget, int) else None,
                                     "--max-model-len for vLLM, --context-length for SGLang")
        if found:
            severity, rule, message, fix = found
            problems.append(Problem(key=f"benchmarks[{index}]", severity=severity, rule=rule, message=message, fix=fix))
    problems += skills_benchmark_problems(doc.get("benchmarks") or [], doc.get("cluster"))
    problems += benchmark_file_problems(doc.get("benchmarks") or [])
    for index, bench in enumerate(doc.get("benchmarks") or []):
        bench_name = str((bench or {}).get("name", ""))
        if bench_name.endswith(".py") and not Path(bench_name).is_absolute() and not (Path.cwd() / bench_name).is_file():
            problems.append(Problem(key=f"benchmarks[{index}].name", severity="error", rule="benchmark_file_missing",
                                    message=f"{bench_name}: nel-next resolves a BYOB file against the directory it runs in; no such file here.",
                                    fix="Give the file's absolute path."))
    return problems


def launch_paths(checked: nelnext.NextReading, config_path: str) -> list[tuple[str, Path]]:
    """(key, absolute path) for every local path a run of this config on this machine writes, loads or runs: output.dir,
    a managed service's model (the server loads it) and container_mounts, and a benchmark given as a BYOB .py file in
    any form nel-next takes (imported and run); and the YAML files its composer reads (defaults:, playbook:). Read from
    the config as nel-next itself reads it (check_schema: its composer, `${VAR:-default}` expansion, the overrides),
    so an interpolation or override cannot hide a path; a config nel-next cannot read is refused. `checked`: that
    reading of the config with the run's overrides."""
    read = [("defaults/playbook file", Path(file)) for file in checked.files_read]
    doc = checked.resolved  # a config its schema refuses is still checked (dry_run)
    if doc is None:
        first = checked.problems[0]
        if read:  # a file it read may be why
            return read
        raise ToolError(f"{config_path}: nel-next cannot read it ({first['path'] or 'config'}: {first['message']}), so the "
                        "paths it would use cannot be checked against this server's workspace root (--root). Run "
                        "validate_config and fix it.")
    written = Path(str((doc.get("output") or {}).get("dir"))).expanduser()
    output = executors.for_name(execution_type(doc)).local_path(Path(config_path).parent / written)  # as runs._run_dir
    if output is None:
        return read  # composed here, run on the cluster
    run_dir = output / "run"  # `nel eval run` works in <output.dir>/<run>: relative names resolve there
    found: list[tuple[str, Path]] = [*read, ("output.dir", output)]
    for name, service in (doc.get("services") or {}).items():
        if isinstance(service, dict) and service.get("type") in MANAGED:
            model = str(service.get("model") or "")
            if looks_local(model) or (model and os.path.lexists(run_dir / Path(model).expanduser())):
                found.append((f"services.{name}.model", run_dir / Path(model).expanduser()))
            found += [(f"services.{name}.container_mounts", run_dir / Path(str(m).split(":")[0]).expanduser())
                      for m in service.get("container_mounts") or []]
            # the server reads files its flags name (--config, --chat-template, --hf-config-path, a JSON config's model)
            found += [(f"services.{name}.extra_args", run_dir / Path(value).expanduser())
                      for value in serverflags.path_values([str(arg) for arg in service.get("extra_args") or []])]
    # `nat serve --config_file` reads a NAT agent's config (in the run's folder by default)
    found += [(f"services.{name}.nat_config_file", run_dir / Path(str(service["nat_config_file"])).expanduser())
              for name, service in (doc.get("services") or {}).items()
              if isinstance(service, dict) and service.get("nat_config_file")]
    for index, benchmark in enumerate(doc.get("benchmarks") or []):
        file = nelnext.benchmark_file(str(benchmark.get("name") or "")) if isinstance(benchmark, dict) else None
        if file:
            found.append((f"benchmarks[{index}].name", run_dir / Path(file).expanduser()))
    if skills.skills_names(doc.get("benchmarks") or []):
        found += skills.map_paths()  # the run imports each mapped folder's __init__.py
    return found


# nel-next's walltime when cluster.walltime is unset (nemo_evaluator/config/clusters.py, SlurmCluster.walltime, 0.3):
# what apply_cluster writes for it, not NEL 0.2.6's 01:00:00.
WALLTIME_DEFAULT = "04:00:00"

# nel-next's SLURM cluster keys for the NEL 0.2.6 ones placement works in (one node pool, "default").
NEXT_POOL = "cluster.node_pools.default"
PLACEMENT_KEYS = {"execution.type": "cluster.type", "execution.hostname": "cluster.hostname",
                  "execution.username": "cluster.username", "execution.account": "cluster.account",
                  "execution.walltime": "cluster.walltime", "execution.max_walltime": "cluster.max_walltime",
                  "execution.partition": f"{NEXT_POOL}.partition",
                  "execution.gres": f"{NEXT_POOL}.gres", "execution.gpus_per_node": f"{NEXT_POOL}.gpus_per_node",
                  "execution.num_nodes": f"{NEXT_POOL}.nodes"}


def placement_view(doc: Any) -> dict[str, Any]:
    """A nel-next SLURM config seen as NEL 0.2.6's keys, so one placement serves both engines: its cluster and node
    pool as `execution`, its managed model server (vllm/sglang, with its parallelism and checkpoint) as `deployment`;
    an api service is `deployment: none` (the model is served elsewhere, the job needs no GPU)."""
    doc = configfile.to_plain(doc)
    execution = {nel.split(".", 1)[1]: value_at(doc, nxt) for nel, nxt in PLACEMENT_KEYS.items()
                 if value_at(doc, nxt) is not None}
    deployment: dict[str, Any] = {"type": "none"}
    managed = [s for s in (doc.get("services") or {}).values() if isinstance(s, dict) and s.get("type") in MANAGED]
    if managed:
        service = managed[0]
        deployment = {"type": service["type"], "checkpoint_path": service.get("model"), **{
            key: service[key] for key in PARALLEL_KEYS if service.get(key) is not None}}
        deployment.setdefault("tensor_parallel_size", 1)  # nel-next starts one GPU's server unless told otherwise
    return {"execution": execution, "deployment": deployment}


def placement_edits(values: dict[str, Any]) -> dict[str, Any]:
    """Placement values at nel-next's keys; nulls dropped (nel-next's schema forbids them where NEL reads "unset")."""
    return {PLACEMENT_KEYS.get(key, key): value for key, value in values.items() if value is not None}

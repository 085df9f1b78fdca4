"""A NEL 0.2.6 config as a nel-next (nemo-evaluator >= 0.3) config, every field accounted for (convert_config's work).

Each leaf of the NEL file is either mapped (MAPPED_KEYS, the table below: NEL key -> nel-next key) or named as unmapped
with why (UNMAPPED_REASONS, first matching pattern). The result is written only to a new file and checked by
validate_config, which runs nel-next's own schema (its pydantic EvalConfig) and our chain rules.

NEL params are global (evaluation.nemo_evaluator_config) or per task (evaluation.tasks[i].nemo_evaluator_config);
nel-next splits them by meaning: sampling and budget go to the service's `generation` (global) or the benchmark's
solver `generation` (per task); sample counts, concurrency and timeouts to each benchmark.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import BaseModel, Field

from quanteval import configfile, engines
from quanteval.engines.nel_next import clustertypes, skills
from quanteval.serving.frameworks import MEMORY_FLAGS, NEL_NEXT_SERVICES

SERVICE = "services.model"
PARAMS = "nemo_evaluator_config.config.params"
ADAPTER = "nemo_evaluator_config.target.api_endpoint.adapter_config"

# NEL key (a global param, or a task's own under evaluation.tasks[i]) -> where nel-next reads it.
GENERATION_PARAMS = {"temperature": "temperature", "top_p": "top_p", "max_new_tokens": "max_tokens"}
BENCHMARK_PARAMS = {"limit_samples": "max_problems", "parallelism": "max_concurrent", "request_timeout": "timeout",
                    "extra.num_repeats": "repeats", "extra.n_samples": "repeats"}  # NeMo-Skills and lm-eval's repeats
# A NEL deployment -> the nel-next service that serves it: the servers nel-next starts itself keep their name.
SERVICE_TYPES = {**{name: name for name in NEL_NEXT_SERVICES}, "nim": "nim", "none": "api"}
DEPLOYMENT_KEYS = {"checkpoint_path": "model", "hf_model_handle": "model", "served_model_name": "served_model_name", "port": "port",
                   "image": "image", "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                   "data_parallel_size": "data_parallel_size"}
SLURM_KEYS = {"hostname": "cluster.hostname", "username": "cluster.username", "account": "cluster.account", "walltime": "cluster.walltime",
              "sbatch_comment": "cluster.sbatch_comment"}
POOL_KEYS = {"partition": "partition", "num_nodes": "nodes", "gres": "gres", "gpus_per_node": "gpus_per_node", "ntasks_per_node": "ntasks_per_node"}

# Why a NEL key has no nel-next counterpart: (pattern on the dotted key, reason). First match wins.
UNMAPPED_REASONS: list[tuple[str, str]] = [
    (r"^defaults", "Hydra's composition list of NEL templates; a nel-next config is complete as written."),
    (r"\.container$", "nel-next runs benchmarks in-process: no task container."),
    (r"extra\.args$", "NeMo-Skills Hydra overrides for `ns eval`; skills:// benchmarks take NeMo-Skills' own defaults for the benchmark. "
     "Check the prompt and split match before comparing with the NEL run."),
    (r"extra\.(tokenizer|tokenizer_backend)$", "the evaluation-side tokenizer of lm-eval/ruler harnesses; nel-next's in-process benchmarks do not read it."),
    (r"extra\.", "a harness-specific param with no field in nel-next's benchmark schema."),
    (r"max_retries$", "NEL's HTTP retries; nel-next's max_system_retries counts retries of failed problems, a different thing."),
    (r"adapter_config\.", "NEL's adapter interceptor setting; nel-next's adapter proxy takes only extra_body, extra_headers and interceptors by name."),
    (r"env_vars", "nel-next reads the environment it runs in: export the variable there (or ${VAR} in a service's extra_env/api_key)."),
    (r"^deployment\.command$", "nel-next builds the server command from type, model and extra_args."),
    (r"^deployment\.type$", "nel-next starts vLLM, SGLang, NIM, Dynamo or docker_model servers, not this one: "
     "serve it yourself and use a `type: api` service."),
    (r"^deployment\.", "a NEL deployment setting with no field in nel-next's service schema."),
    (r"^execution\.type$", "nel-next clusters are local, docker or slurm."),
    (r"^execution\.(extra_docker_args|auto_export|subproject|mode)", "NEL executor behaviour with no nel-next counterpart."),
    (r"^execution\.", "a NEL executor setting with no field in nel-next's cluster schema."),
    (r"^export", "export after the run with `nel export` (mlflow, wandb)."),
    (r"^target\.api_endpoint\.api_key_name$", "a server nel-next starts is sent no API key (for an existing endpoint, `type: api`, "
     "it becomes services.model.api_key: ${VAR})."),
    (r"^target\.", "NEL endpoint setting with no nel-next service field."),
    (r"", "no nel-next field."),
]


class MappedField(BaseModel):
    source: str = Field(description="NEL key.")
    target: str = Field(description="nel-next key it went to.")


class UnmappedField(BaseModel):
    source: str
    value: Any
    reason: str


class Conversion:
    """The nel-next config made from a NEL one: what each NEL key became, and every NEL value left behind."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.engine = engines.by_name("nel").config  # the config's engine (NEL 0.2.6), which reads its deployment, tasks, execution
        self.out: dict[str, Any] = {}
        self.mapped: list[MappedField] = []
        self.consumed: set[str] = set()
        self.reasons: dict[str, str] = {}  # a source key's own reason for not being carried over, before UNMAPPED_REASONS
    def put(self, target: str, value: Any, source: str | None = None) -> None:
        configfile.set_path(self.out, target, _env_syntax(value))
        if source is not None:
            self.carried(source, target)

    def carried(self, source: str, target: str) -> None:
        self.mapped.append(MappedField(source=source, target=target))
        self.consumed.add(source)

    def source(self, path: str) -> Any:
        return configfile.value_at(self.doc, path)




def convert(doc: dict[str, Any]) -> tuple[Conversion, list[UnmappedField]]:
    """Every part of a NEL 0.2.6 config as nel-next writes it: service, benchmarks, cluster; then what was left."""
    conversion = Conversion(doc)
    _service(conversion)
    _benchmarks(conversion)
    _cluster(conversion)
    return conversion, _unmapped(conversion)


def _service(c: Conversion) -> None:
    """deployment (+ target.api_endpoint for an existing endpoint) -> services.model."""
    framework = c.engine.deployment_type(c.doc)
    service_type = SERVICE_TYPES.get(framework)
    if service_type is None:
        c.put(f"{SERVICE}.type", "api")
        c.put(f"{SERVICE}.url", configfile.MISSING)
        return
    c.put(f"{SERVICE}.type", service_type, "deployment.type" if c.source("deployment.type") is not None else None)
    c.consumed.add("deployment.type")
    endpoint_types = {str(task.get("endpoint_type") or "chat") for _, task in c.engine.config_tasks(c.doc) if isinstance(task, dict)}
    protocol = "completions" if endpoint_types == {"completions"} else "chat_completions"
    if service_type == "api":
        url = c.source("target.api_endpoint.url")
        c.put(f"{SERVICE}.url", url if isinstance(url, str) else configfile.MISSING, "target.api_endpoint.url" if url else None)
        model = c.source("target.api_endpoint.model_id")
        c.put(f"{SERVICE}.model", model if model else configfile.MISSING, "target.api_endpoint.model_id" if model else None)
        key_name = c.source("target.api_endpoint.api_key_name")
        if key_name:
            c.put(f"{SERVICE}.api_key", f"${{{key_name}}}", "target.api_endpoint.api_key_name")
    else:
        for key, field in DEPLOYMENT_KEYS.items():
            value = c.source(f"deployment.{key}")
            if value not in (None, configfile.MISSING):
                c.put(f"{SERVICE}.{field}", value, f"deployment.{key}")
        if configfile.value_at(c.out, f"{SERVICE}.model") is None:
            c.put(f"{SERVICE}.model", configfile.MISSING)
        args = shlex.split(str(c.source("deployment.extra_args") or ""))
        c.consumed.add("deployment.extra_args")
        memory = c.source("deployment.gpu_memory_utilization")
        if memory is not None and framework in MEMORY_FLAGS:
            args += [MEMORY_FLAGS[framework], str(memory)]
            c.carried("deployment.gpu_memory_utilization", f"{SERVICE}.extra_args ({MEMORY_FLAGS[framework]})")
        if args:
            c.put(f"{SERVICE}.extra_args", args)
            if c.source("deployment.extra_args"):
                c.carried("deployment.extra_args", f"{SERVICE}.extra_args")
        env = c.source("deployment.env_vars") or {}
        for name, value in env.items():
            expanded = _env_value(value)
            if expanded is not None:
                c.put(f"{SERVICE}.extra_env.{name}", expanded, f"deployment.env_vars.{name}")
    c.put(f"{SERVICE}.protocol", protocol)
    c.consumed.update({"deployment.endpoints", "target.api_endpoint.type"})
    for nel_key, next_key in GENERATION_PARAMS.items():
        value = c.source(f"evaluation.{PARAMS}.{nel_key}")
        if value is not None:
            c.put(f"{SERVICE}.generation.{next_key}", value, f"evaluation.{PARAMS}.{nel_key}")
    added = c.source(f"evaluation.{ADAPTER}.params_to_add") or {}
    for key, value in added.items() if isinstance(added, dict) else ():
        c.put(f"{SERVICE}.proxy.extra_body.{key}", value, f"evaluation.{ADAPTER}.params_to_add.{key}")


def _benchmarks(c: Conversion) -> None:
    """evaluation.tasks -> benchmarks: NeMo-Skills tasks as skills://NAME, each with its own samples, repeats, sampling."""

    benchmarks: list[dict[str, Any]] = []
    for path, task in c.engine.config_tasks(c.doc):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            continue
        name, why = skills.benchmark_for_task(task["name"])
        if name is None:  # _unmapped names the task with why, and each of its settings as going with it
            c.reasons[f"{path}.name"] = why
            c.reasons[path] = f"a setting of {task['name']}, which is not converted (see its name)."
            continue
        benchmark = skills.benchmark_item(name)
        index = len(benchmarks)
        c.carried(f"{path}.name", f"benchmarks[{index}].name ({benchmark['name']})")
        for scope in ("evaluation", path):  # the task's own value wins over the global one
            for nel_key, next_key in BENCHMARK_PARAMS.items():
                value = c.source(f"{scope}.{PARAMS}.{nel_key}")
                if value is not None:
                    benchmark[next_key] = value
                    c.carried(f"{scope}.{PARAMS}.{nel_key}", f"benchmarks[{index}].{next_key}")
        for nel_key, next_key in GENERATION_PARAMS.items():
            value = c.source(f"{path}.{PARAMS}.{nel_key}")
            if value is not None:
                benchmark["solver"].setdefault("generation", {})[next_key] = value
                c.carried(f"{path}.{PARAMS}.{nel_key}", f"benchmarks[{index}].solver.generation.{next_key}")
        c.consumed.add(f"{path}.endpoint_type")
        benchmarks.append(benchmark)
    c.out["benchmarks"] = benchmarks


def _cluster(c: Conversion) -> None:
    """execution -> cluster (local or slurm with one node pool) and output.dir."""
    execution = c.engine.execution_type(c.doc)
    output_dir = c.source("execution.output_dir")
    c.put("output.dir", output_dir if output_dir not in (None, "") else configfile.MISSING, "execution.output_dir" if output_dir else None)
    c.put("output.timestamped", False)  # as build_config writes it: quanteval names each run's directory
    cluster = clustertypes.of(execution)
    if cluster is None or not cluster.takes_placement:  # NEL's lepton has no nel-next counterpart: this machine's
        c.put("cluster.type", clustertypes.LOCAL.name)
        if cluster is not None:
            c.consumed.add("execution.type")
        return
    c.put("cluster.type", cluster.name, "execution.type" if c.source("execution.type") else None)
    for key, target in SLURM_KEYS.items():
        value = c.source(f"execution.{key}")
        if value not in (None, configfile.MISSING):
            c.put(target, value, f"execution.{key}")
    pool: dict[str, Any] = {}
    for key, field in POOL_KEYS.items():
        value = c.source(f"execution.{key}")
        if value not in (None, configfile.MISSING):
            pool[field] = value
            c.carried(f"execution.{key}", f"cluster.node_pools.default.{field}")
    pool.setdefault("partition", configfile.MISSING)
    c.put("cluster.node_pools.default", pool)
    if configfile.value_at(c.out, f"{SERVICE}.type") != "api":
        c.put(f"{SERVICE}.node_pool", "default")
    mounts = []
    for role, pairs in (c.source("execution.mounts") or {}).items():
        if isinstance(pairs, dict):
            for source, target in pairs.items():
                mounts.append(f"{source}:{target}")
                c.carried(f"execution.mounts.{role}.{source}", "cluster.container_mounts")
    if mounts:
        c.put("cluster.container_mounts", mounts)


def _unmapped(c: Conversion) -> list[UnmappedField]:
    """Every leaf of the NEL file that no mapping consumed, with the first matching reason."""
    found = []
    for path, value in configfile.walk(c.doc):
        if (isinstance(value, dict | list) and value) or value is None:  # containers are walked into; null carries nothing
            continue
        if any(path == done or path.startswith(done + ".") or path.startswith(done + "[") for done in c.consumed):
            continue
        owner = next((key for key in c.reasons if path == key or path.startswith((key + ".", key + "["))), None)
        if value == configfile.MISSING and owner is None:
            reason = "??? in the NEL config: no value to carry over."
        else:
            reason = c.reasons[owner] if owner else next(why for pattern, why in UNMAPPED_REASONS if re.search(pattern, path))
        found.append(UnmappedField(source=path, value=value, reason=reason))
    return found


# OmegaConf's env resolver as NEL writes it (`${oc.env:USER}`, `${oc.env:VAR,default}`): nel-next expands only
# `${VAR}` / `${VAR:-default}` and would keep the OmegaConf text as a literal (an ssh user named "${oc.env:USER}").
_OC_ENV = re.compile(r"\$\{oc\.env:(\w+)(?:,([^}]*))?\}")


def _env_syntax(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    return _OC_ENV.sub(lambda m: f"${{{m[1]}}}" if m[2] is None else f"${{{m[1]}:-{m[2].strip()}}}", value)


def _env_value(value: Any) -> str | None:
    """NEL's env var values (host:VAR, lit:VALUE, runtime:VAR) as nel-next's ${VAR} expansion, or None."""
    text = str(value)
    if text.startswith("lit:"):
        return text[4:]
    if text.startswith(("host:", "runtime:")):
        return f"${{{text.split(':', 1)[1]}}}"
    return None

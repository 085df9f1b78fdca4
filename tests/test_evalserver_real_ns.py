"""The eval server's nemo-skills backend against the REAL NeMo-Skills `ns eval` (executor none, no containers).

NeMo-Skills is not on the package index: `scripts/setup --dev` builds .venv-nemo-skills/ from
../shared/vendor/nemo-skills-467b057.tar.gz or $QUANTEVAL_NEMO_SKILLS_SRC. Without it these tests skip and say why.

The real `ns eval` takes minutes here (each step starts Python processes that import torch and litellm), so
one module fixture submits every evaluation at once through the server's POST /jobs and the tests below read
what came back: the metrics.json files NeMo-Skills wrote and the requests the router received.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tiers import REPO, requires

from quanteval.evalserver.backend import ServerSettings
from quanteval.evalserver.jobs import FORKSERVER_LOG
from quanteval.faces import evalhttp
from quanteval.localproc import free_port
from quanteval.workflow import tasks

NS_VENV = Path(os.environ.get("QUANTEVAL_NS_VENV") or REPO / ".venv-nemo-skills")
NS = NS_VENV / "bin" / "ns"

if not NS.exists():
    reason = (f"NeMo-Skills' `ns` is not in {NS_VENV}: scripts/setup --dev builds it from QUANTEVAL_NEMO_SKILLS_SRC, "
              "../shared/vendor/ or GitHub, and said which of them it could not use")
    pytest.skip(reason, allow_module_level=True)
pytestmark = requires("nemo-skills", "slow")  # each `ns eval` takes minutes

sys.path.insert(0, str(Path(__file__).parent / "standins"))
from openai_router import Router  # noqa: E402

GSM8K = [{"problem": f"What is {a}+{b}?", "expected_answer": str(a + b)} for a in range(1, 5) for b in range(1, 4)]


def _mcq(n: int) -> dict:
    options = [n - 1, n, n + 1, n + 2]
    options = options[n % 4:] + options[:n % 4]  # the right letter moves around
    problem = f"Which option is equal to {n}?\n" + "\n".join(f"{'ABCD'[i]}) {v}" for i, v in enumerate(options))
    return {"problem": problem, "expected_answer": "ABCD"[options.index(n)]}


MMLU = [_mcq(n) for n in range(1, 9)]  # the router gets n == 1 wrong: 7/8
SVAMP = [{"problem": "What is 9+9? FAIL", "expected_answer": "18"}]  # the router answers 500: generation fails


def dataset_dir() -> Path:
    """Where `ns prepare_data` puts data: the installed package's nemo_skills/dataset (NeMo-Skills reads it there)."""
    out = subprocess.run([str(NS_VENV / "bin" / "python"), "-c",
                          "import nemo_skills.dataset as d, os; print(os.path.dirname(d.__file__))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return Path(out.stdout.strip())


def write_data(root: Path) -> None:
    for bench, rows in (("gsm8k", GSM8K), ("mmlu", MMLU), ("svamp", SVAMP)):
        (root / bench / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "max_response_len": 64}
SLIME = {  # slime's payload: a math benchmark (samples, every sampling parameter) and a multiple-choice one
    "rollout_id": 100,
    "defaults": DEFAULTS,
    "benchmarks": [{"name": "gsm8k", "n_samples_per_eval_prompt": 2, "top_k": 20, "max_problems": 6},
                   {"name": "mmlu", "n_samples_per_eval_prompt": 2}],
}
PARTIAL = {"rollout_id": 101, "benchmarks": [{"name": "svamp"}, {"name": "gsm8k", "max_problems": 3}]}
OWN_DATA = [{"problem": f"What is {a}+{a}?", "expected_answer": str(2 * a)} for a in (5, 6)]
OWN = {"rollout_id": 103, "benchmarks": [{"name": "gsm8k"}]}
MCQ_SHARDED = {"rollout_id": 102, "defaults": DEFAULTS,
               "benchmarks": [{"name": "mmlu", "n_samples_per_eval_prompt": 2, "shards": 2}]}


def _request(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("real-ns-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTEVAL_STATE_DIR", str(state))
        mp.setenv("QUANTEVAL_LEDGER", str(state / "ledger.sqlite3"))
        write_data(dataset_dir())
        # a data dir of our own (`--data-dir`): the benchmark's module and its data, as prepare_data lays them out
        own_data = tmp_path_factory.mktemp("real-ns-data") / "data"
        (own_data / "gsm8k").mkdir(parents=True)
        (own_data / "gsm8k" / "__init__.py").write_bytes((dataset_dir() / "gsm8k" / "__init__.py").read_bytes())
        (own_data / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in OWN_DATA))
        router = Router()
        servers, logs = [], []
        for data_dir in (None, str(own_data)):
            settings = ServerSettings(output_root=tmp_path_factory.mktemp("real-ns-out"), ns_command=str(NS),
                                      port=free_port(), max_concurrent_jobs=3, max_concurrent_requests=8,
                                      data_dir=data_dir)
            ready, stop = threading.Event(), threading.Event()
            thread = threading.Thread(target=evalhttp.serve, args=(settings, ready, stop), daemon=True)
            thread.start()
            assert ready.wait(10)
            servers.append((f"http://127.0.0.1:{settings.port}", stop, thread))
            logs.append(settings.root / FORKSERVER_LOG)
        url, own_url = servers[0][0], servers[1][0]
        try:
            health = _request(url, "GET", "/health")
            ids = {}
            for name, body, where in (("slime", SLIME, url), ("partial", PARTIAL, url),
                                      ("sharded", MCQ_SHARDED, url), ("own_data", OWN, own_url)):
                status, answer = _request(where, "POST", "/jobs", {**body, "router_url": router.url})
                assert status == 202, answer
                ids[name] = (where, answer["job_id"])
            deadline = time.monotonic() + 1500
            jobs: dict[str, dict] = {}
            while len(jobs) < len(ids):
                assert time.monotonic() < deadline, "the real ns eval runs did not finish in 25 minutes"
                time.sleep(3)
                for name, (where, job_id) in ids.items():
                    answer = _request(where, "GET", f"/jobs/{job_id}")[1]
                    if answer["status"] in ("succeeded", "failed", "cancelled"):
                        jobs[name] = answer
            yield {"health": health, "jobs": jobs, "router": router, "url": url, "own_url": own_url, "forkserver_logs": logs}
        finally:
            for _, stop, thread in servers:
                stop.set()
                thread.join(60)
            router.close()


def _gsm8k_requests(router: Router) -> list[dict]:
    return [r for r in router.requests if "What is" in r["messages"][-1]["content"] and "FAIL" not in r["messages"][-1]["content"]]


def _sampled(requests: list[dict]) -> list[dict]:
    """Requests of the jobs that sent the payload's temperature (the greedy gsm8k of PARTIAL sends 0)."""
    return [r for r in requests if r["temperature"] == 0.6]


def _mmlu_requests(router: Router) -> list[dict]:
    return [r for r in router.requests if "equal to" in r["messages"][-1]["content"]]


def test_health_reports_the_real_ns_version(real):
    status, health = real["health"]
    version = subprocess.run([str(NS_VENV / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('nemo_skills'))"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    assert status == 200 and health["status"] == "ok" and health["backend_ready"] is True
    assert health["ns_version"] == version and health["ns_path"] == str(NS)


def test_every_ns_eval_was_forked_from_one_warm_import_of_nemo_skills_pipeline(real):
    """`ns eval`'s driver imports NeMo-Skills' pipeline (~7 CPU-s) before it does anything: the server imports it once
    per `ns` and forks each run from there (quanteval/forkserver.py). The runs above, their metrics real (the tests
    below), every one of them forked, the failing svamp too."""
    runs = [run for job in real["jobs"].values() for run in job["runs"]]
    assert len(runs) == 6 and all(run.get("forked") for run in runs), runs
    # and each run's steps, `python -m` children of `ns eval`, from the same import: the generation (~9 CPU-s of
    # imports cold) once per sample and shard (gsm8k:2, mmlu:2, svamp, gsm8k, mmlu:2 in 2 shards, the own data's
    # gsm8k: 11), the summary (~4) once per benchmark and shard (7, the failing svamp's too); the metrics the tests
    # below check are what these summaries wrote
    logs = "".join(path.read_text() for path in real["forkserver_logs"] if path.exists())
    assert logs.count("python -m nemo_skills.inference.generate forked") == 11, logs[-3000:]
    assert logs.count("python -m nemo_skills.pipeline.summarize_results forked") == 7, logs[-3000:]


def test_slime_payload_math_with_samples_gets_real_metrics(real):
    job = real["jobs"]["slime"]
    assert job["status"] == "succeeded", job["errors"]
    assert set(job["raw_metrics"]) == {"gsm8k", "mmlu"}
    gsm8k = job["raw_metrics"]["gsm8k"]
    # NeMo-Skills' own keys for `gsm8k:2`; 6 problems (max_problems), 1+1 answered wrong in both samples
    assert {"pass@1", "pass@2", "pass@1[avg-of-2]", "majority@2"} <= set(gsm8k)
    assert gsm8k["pass@1[avg-of-2]"]["num_entries"] == 6
    assert gsm8k["pass@1[avg-of-2]"]["symbolic_correct"] == pytest.approx(100 * 5 / 6)
    run = job["runs"][0]
    assert "--benchmarks gsm8k:2" in run["command"] and "--server_type sglang" in run["command"]


def test_sampling_parameters_reach_the_router(real):
    requests = _sampled(_gsm8k_requests(real["router"]))
    assert len(requests) == 6 * 2  # max_problems x n_samples_per_eval_prompt
    for request in requests:
        assert request["temperature"] == 0.6 and request["top_p"] == 0.9  # the payload's, not NeMo-Skills' 0.7/0.95
        assert request["max_tokens"] == 64
        assert request["top_k"] == 20  # the sglang server type sends it; the openai one would refuse it
    assert {r["seed"] for r in requests} == {0, 1}  # two seeded samples per problem
    # defaults reach the multiple-choice benchmark too; it set no top_k, so none is sent
    mmlu = _mmlu_requests(real["router"])
    assert mmlu and all(r["temperature"] == 0.6 and r["max_tokens"] == 64 and "top_k" not in r for r in mmlu)


def test_a_plain_name_is_greedy_and_max_problems_limits_it(real):
    own = {row["problem"] for row in OWN_DATA}
    greedy = [r for r in _gsm8k_requests(real["router"])
              if r["temperature"] != 0.6 and not any(p in r["messages"][-1]["content"] for p in own)]
    assert len(greedy) == 3 and all(r["temperature"] == 0.0 for r in greedy)
    assert "--benchmarks gsm8k " in real["jobs"]["partial"]["runs"][1]["command"] + " "
    assert real["jobs"]["partial"]["raw_metrics"]["gsm8k"]["pass@1"]["num_entries"] == 3


def test_a_failed_benchmark_is_detected_although_ns_exits_0(real):
    job = real["jobs"]["partial"]
    assert job["status"] == "failed"
    svamp = job["runs"][0]
    assert svamp["status"] == "failed" and "exited 0 but wrote no" in svamp["error"]
    assert "svamp" not in job["raw_metrics"] and "gsm8k" in job["raw_metrics"]  # the good one is still there
    # the real cause is in the log tail the answer carries: the router's 500, then summarize finding nothing
    assert "router failure" in "\n".join(svamp["log_tail"])


def test_the_flat_metrics_map_holds_every_number_of_the_real_metrics(real):
    metrics = real["jobs"]["slime"]["metrics"]
    assert metrics["gsm8k/pass@1[avg-of-2]/symbolic_correct"] == pytest.approx(100 * 5 / 6)
    assert metrics["gsm8k/majority@2/num_entries"] == 6.0
    assert metrics["gsm8k/pass@1[avg-of-2]/symbolic_correct_statistics/avg"] == pytest.approx(5 / 6)
    assert all(isinstance(v, float) for v in metrics.values())


def test_multiple_choice_benchmark_gets_real_metrics(real):
    mmlu = real["jobs"]["slime"]["raw_metrics"]["mmlu"]
    assert mmlu["pass@1[avg-of-2]"]["num_entries"] == 8
    assert mmlu["pass@1[avg-of-2]"]["symbolic_correct"] == pytest.approx(100 * 7 / 8)


def test_shards_merge_exactly_as_the_unsharded_run(real):
    sharded, whole = real["jobs"]["sharded"], real["jobs"]["slime"]
    assert sharded["status"] == "succeeded", sharded["errors"]
    assert sharded["runs"][0]["shards"] == 2
    assert sharded["runs"][0]["command"].count("--num_chunks 2") == 2

    def without_timing(metrics: dict) -> dict:
        return {mode: {k: v for k, v in values.items() if k != "gen_seconds"} for mode, values in metrics.items()}

    assert without_timing(sharded["raw_metrics"]["mmlu"]) == without_timing(whole["raw_metrics"]["mmlu"])
    assert len(_mmlu_requests(real["router"])) == 2 * 8 * 2  # each problem x 2 samples, once per job


def _metrics_type(benchmark: str) -> str | None:
    init = dataset_dir() / benchmark / "__init__.py"
    match = re.search(r'^METRICS_TYPE\s*=\s*"(\w+)"', init.read_text(), re.MULTILINE) if init.exists() else None
    return match[1] if match else None


def test_recipe_score_keys_match_real_nemo_skills_metrics(real):
    """Recipes of NeMo-Skills tasks name metric/score keys; check them against real metrics.json of the same
    metric type (math: gsm8k:2, multichoice: mmlu:2), with the recipe's repeat count in place of ours."""
    real_keys = {"math": real["jobs"]["slime"]["raw_metrics"]["gsm8k"],
                 "multichoice": real["jobs"]["slime"]["raw_metrics"]["mmlu"]}
    by_task = {entry.name: entry for entry in tasks.catalogue()}
    checked = []
    for recipe in tasks.list_recipes():
        entry = by_task.get(recipe.nel_task.split(".")[-1])
        if entry is None or entry.harness != "nemo_skills" or not entry.harness_task:
            continue
        kind = _metrics_type(entry.harness_task)
        if kind not in real_keys:
            continue
        metric = re.sub(r"avg-of-\d+", "avg-of-2", recipe.metric)
        assert metric in real_keys[kind], f"{recipe.name}: metric {recipe.metric} is not a NeMo-Skills {kind} key"
        assert recipe.score in real_keys[kind][metric], f"{recipe.name}: score {recipe.score} not in {metric}"
        checked.append(recipe.name)
    assert len(checked) >= 3, checked  # gpqa, mmlu_pro, aime2025 at least


def test_a_data_dir_of_its_own_is_read_by_the_real_ns(real):
    """With executor none NeMo-Skills reads --data_dir relative to the working directory: the server runs ns
    from the data dir's parent, so the problems come from that dir, not from the installed package."""
    job = real["jobs"]["own_data"]
    assert job["status"] == "succeeded", job["errors"]
    assert job["raw_metrics"]["gsm8k"]["pass@1"]["num_entries"] == 2
    prompts = [r["messages"][-1]["content"] for r in real["router"].requests]
    assert sum("What is 5+5?" in p or "What is 6+6?" in p for p in prompts) == 2


def test_a_benchmark_ns_does_not_know_or_has_no_data_for_is_a_400_before_ns_runs(real):
    """`ns eval` fails such a benchmark after starting its pipeline (a 502 for what no retry mends): the server asks
    the NeMo-Skills behind its `ns` first, as `ns eval` resolves names and --data_dir, and answers 400 naming the fix."""
    sent = len(real["router"].requests)
    for where, name, expected in ((real["url"], "gsm8", "NeMo-Skills has no benchmark 'gsm8' (close: gsm8k"),
                                  (real["own_url"], "mmlu", "'mmlu' has no prepared data"),
                                  (real["url"], "hle", "run `ns prepare_data hle` where the server runs"),
                                  # graded by `cd /opt/benchmarks/IFBench && python -m run_eval`: its container's layout
                                  (real["url"], "ifbench", "with the code its container has at /opt/benchmarks/IFBench")):
        started = time.monotonic()
        status, answer = _request(where, "POST", "/evaluate", {"rollout_id": 7, "router_url": real["router"].url,
                                                              "benchmarks": [{"name": "gsm8k"}, {"name": name}]})
        assert status == 400 and expected in answer["error"], answer
        assert time.monotonic() - started < 30
    assert len(real["router"].requests) == sent  # nothing was generated

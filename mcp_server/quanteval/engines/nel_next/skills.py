"""NeMo-Skills benchmarks in nel-next (`skills://NAME`): does the NeMo-Skills in nel-next's venv fit it, what each
benchmark is (its METRICS_TYPE, prompt config and the data file nel-next will read), and the prompt NeMo-Skills
would send it, written in nel-next's own settings (a benchmark's `instruction_template`, its solver's
`system_prompt`).

Facts (nemo-evaluator 0.3.0's environments/skills.py, NeMo-Skills 467b057; see scripts/setup-nel-next):
- a `skills://NAME` benchmark takes none of its `params:` (the factory reads only its keyword arguments): the data
  is NAME's dataset module's data dir (the installed package's nemo_skills/dataset/, where `ns prepare_data NAME`
  writes, or the folder NEMO_SKILLS_EXTRA_BENCHMARK_MAP maps NAME to), DIR/NAME/<EVAL_SPLIT or test>.jsonl;
- a missing file is "prepared" by running `python -m nemo_skills.dataset.prepare NAME`, which downloads (up to
  300 s, then fails) — hence the check here, before anything is served. Some benchmarks ship their data in the
  package (DIR/NAME/<split>.txt of JSON rows: aime24, aime25, comp-math-24-25) and prepare only copies it: the
  probe runs that step itself, offline (challenge19's .txt lists ids its prepare downloads: not shipped);
- the prompt is the row's `problem` (else question/prompt/input/text), the answer its `expected_answer`; nel-next
  sends the bare problem unless the benchmark has an `instruction_template` (a Jinja file; `original_prompt` is
  the problem; the result is stripped). NeMo-Skills sends its prompt config's `user` text, format()ted with the
  row (`examples` empty by default), after its `system` text when it has one;
- grading: `math` -> NeMo-Skills' math_grader.extract_answer (the last \\boxed{}) and math_equal; `multichoice` ->
  the \\boxed{} letter, compared upper-cased (a response without \\boxed{} raises: nel-next retries the problem,
  then fails the benchmark). Hence multichoice benchmarks are sent the \\boxed{} form of their prompt config
  (BOXED_PROMPTS): NeMo-Skills' default for GPQA and MMLU-Pro asks for 'Answer: X', which nel-next does not read.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quanteval import configfile, envvars, kept, paths
from quanteval.engines.nel_next import nelnext
from quanteval.engines.nel_next.skillnames import SCHEME, name_problem, skills_names  # noqa: F401 (config.py, runs.py read skills.*)
from quanteval.engines.nemo_skills_source import NEMO_SKILLS_COMMIT, NEMO_SKILLS_UPSTREAM  # noqa: F401 (config.py reads skills.NEMO_SKILLS_*)
from quanteval.models import ToolError

REQUIRED_FIELDS = ("problem", "expected_answer")  # what NeMo-Skills' prompt configs and graders read from a row
# nel-next 0.3.0 grades these two with NeMo-Skills' grader (its _score_handlers); any other METRICS_TYPE goes to
# get_evaluator_class(type).eval_single({predicted_answer, expected_answer}), which only class evaluators have and
# which need more than those fields: on failure nel-next falls back, with a log warning, to exact match of the whole
# response (~0 for any model, baseline and candidate alike: "nothing lost" while measuring nothing).
SKILLS_GRADED_TYPES = ("math", "multichoice")
# NeMo-Skills prompt configs that ask for 'Answer: X', and their \boxed{} form (the one nel-next's grading reads).
BOXED_PROMPTS = {"eval/aai/mcq-4choices": "eval/aai/mcq-4choices-boxed", "eval/aai/mcq-10choices": "eval/aai/mcq-10choices-boxed"}
ALIAS_MODULE = "nemo_skills.evaluation.evaluator.math_grader"
# What the prompt asks of an answer, by METRICS_TYPE: the form nel-next's grading reads (the grading facts above).
ANSWER_FORMS = {"math": "the final answer in \\boxed{}, compared by NeMo-Skills' math_equal",
                "multichoice": "the choice letter in \\boxed{}: its prompt config's \\boxed{} form, which nel-next's grading reads"}
ANSWER_FORM_UNKNOWN = "the answer in \\boxed{}, which nel-next's grading reads"

_PROBE = r"""
import difflib, inspect, json, os, sys
from pathlib import Path
names, boxed = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    from nemo_skills.dataset import utils
    import nemo_skills
except ImportError as exc:
    print(json.dumps({"problem": f"NeMo-Skills is not installed in nel-next's venv ({exc})"})); raise SystemExit
from nemo_evaluator.environments import skills as nel
problems = []
found = utils.get_dataset_module("gsm8k")
if isinstance(found, tuple) and len(found) != 2:
    problems.append(f"its dataset_utils.get_dataset_module returns {len(found)} values where nel-next unpacks 2")
alias = Path(nemo_skills.__file__).parent / "evaluation" / "evaluator" / "math_grader.py"
needed = "ALIAS" in inspect.getsource(nel)
try:
    __import__("ALIAS")
except ImportError:
    if needed:
        problems.append("it has no ALIAS, which nel-next's math scoring imports")
out = {"problem": "this NeMo-Skills does not fit nel-next: " + "; ".join(problems) if problems else None,
       "alias": ("patched" if alias.is_file() and alias.read_text().startswith("# quanteval alias") else "native")
                if needed else "unneeded"}
home = Path(utils.__file__).parent
known = sorted({p.name for p in home.iterdir() if (p / "__init__.py").is_file()} | set(utils.get_extra_benchmark_map()))
config_dir = Path(nemo_skills.__file__).parent / "prompt" / "config"
def prompt(args):
    name = next((a.split("=", 1)[1] for a in args.split() if a.startswith("++prompt_config=")), None)
    if name is None:
        return None
    name = boxed.get(name, name)
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        return {"config": name, "error": f"no prompt config {path}"}
    import yaml
    text = yaml.safe_load(path.read_text()) or {}
    return {"config": name, "user": text.get("user"), "system": text.get("system")}
def rows_of_their_own(path):  # a <split>.txt of the rows themselves (JSON lines), not ids to fetch (challenge19)
    if not path.is_file():
        return False
    with open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), "")
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and all(row.get(f) is not None for f in REQUIRED)
benchmarks = {}
for name in names:
    try:
        module, default_dir = nel._unpack_module(utils.get_dataset_module(name))
    except Exception:
        benchmarks[name] = {"unknown": True, "close": difflib.get_close_matches(name, known, n=3, cutoff=0.5)}
        continue
    split = getattr(module, "EVAL_SPLIT", "test")
    data_dir = nel._resolve_data_dir(utils, default_dir)
    data = Path(data_dir) / name.replace(".", "/") / f"{split}.jsonl"
    info = {"metrics_type": getattr(module, "METRICS_TYPE", None) or "", "data_file": str(data), "data_dir": data_dir,
            "mapped": name in utils.get_extra_benchmark_map(),
            "prompt": prompt(getattr(module, "GENERATION_ARGS", "") or ""), "rows": 0, "bad_row": None}
    shipped = Path(module.__file__).parent / f"{split}.txt"
    if not data.is_file() and data.parent == shipped.parent and rows_of_their_own(shipped):
        # Data in the package (aime24/25, comp-math-24-25): NeMo-Skills' prepare copies it, offline,
        # as nel-next would at start; done here so the checks below read what the run will.
        import subprocess
        try:
            done = subprocess.run([sys.executable, "-m", "nemo_skills.dataset.prepare", name], capture_output=True,
                                  text=True, timeout=PREPARE_TIMEOUT_S)
            failed = None if data.is_file() else (done.stderr or done.stdout).strip()[-300:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed = str(exc)
        info["prepared"] = {"from": str(shipped), "error": failed}
    if data.is_file():
        with open(data, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                info["rows"] += 1
                try:
                    row = json.loads(line)
                except ValueError:
                    info["bad_row"] = [number, "is not JSON"]; break
                lacking = [f for f in REQUIRED if not isinstance(row, dict) or row.get(f) is None]
                if lacking:
                    info["bad_row"] = [number, "has no " + " and no ".join(repr(f) for f in lacking)]; break
    benchmarks[name] = info
out["benchmarks"] = benchmarks
print(json.dumps(out))
""".replace("ALIAS", ALIAS_MODULE).replace("REQUIRED", repr(REQUIRED_FIELDS)).replace("PREPARE_TIMEOUT_S", "60")


@dataclass
class Benchmark:
    """What the NeMo-Skills in nel-next's venv says about one `skills://NAME`."""

    name: str
    unknown: bool = False
    close: list[str] = field(default_factory=list)
    metrics_type: str = ""
    data_file: str = ""
    data_dir: str = ""
    rows: int = 0
    bad_row: tuple[int, str] | None = None
    prompt: dict[str, Any] | None = None
    mapped: bool = False  # registered through NEMO_SKILLS_EXTRA_BENCHMARK_MAP in this environment
    prepared: dict[str, Any] | None = None  # {"from": the package's data file, "error": why the copy failed or None}


@dataclass
class Probe:
    problem: str | None  # why skills:// cannot run from nel-next's venv, or None
    alias: str = ""  # patched (our alias module), native (NeMo-Skills has it), unneeded (nel-next no longer imports it)
    benchmarks: dict[str, Benchmark] = field(default_factory=dict)


# probe's answers that found every benchmark ready are kept (quanteval/kept.py) by (venv and its NeMo-Skills and
# nel-next installs, names, benchmark map), with the files they read as they were: an evaluation asks about its
# benchmarks up to 7 times (preflight, each side's config check and launches) in up to three processes, each ask a
# ~1 CPU-s child. Used only while those files are unchanged: data is prepared, and benchmark maps change, while a server
# runs; an answer that found anything missing or wrong is never kept (the next ask may find it fixed).
KEPT_AS = "skills-probes"


def _files_read(found: Probe) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of the benchmark map, what it maps, and each benchmark's data file; -1s where missing."""
    paths_read = [str(path) for _, path in map_paths()]
    paths_read += [str(Path(path) / "__init__.py") for path in paths_read[1:]]
    paths_read += [benchmark.data_file for benchmark in found.benchmarks.values()]
    return paths.file_stats(paths_read)


def _ready(found: Probe) -> bool:
    return found.problem is None and all(
        not b.unknown and b.rows and b.bad_row is None and not (b.prepared or {}).get("error") for b in found.benchmarks.values())


def probe(names: list[str]) -> Probe:
    """Ask the NeMo-Skills in nel-next's venv, as nel-next itself resolves things (its own helpers), about `names`."""
    python = nelnext.venv() / "bin" / "python"
    if not python.exists():
        return Probe(problem=f"nel-next is not installed at {nelnext.venv()}")
    if refusal := map_outside_root():
        return Probe(problem=refusal)
    names = [name for name in names if name_problem(name) is None]  # never imported: the caller says why
    raw_map = os.environ.get(MAP_VARIABLE)
    key = kept.key_of(str(python), sorted(set(names)), str(Path(raw_map).expanduser().absolute()) if raw_map else "",
                      kept.installs(nelnext.venv(), "nemo_skills", "nemo_evaluator"))
    if (answer := _kept_probe(key)) is not None:
        return answer
    found = _ask(python, names)
    if _ready(found):
        kept.keep(KEPT_AS, key, json.dumps({"probe": asdict(found), "files_read": _files_read(found)}))
    return found


def _kept_probe(key: str) -> Probe | None:
    """The kept answer, while every file it read is as it was."""
    try:
        answer = json.loads(kept.read(KEPT_AS, key) or "null")
        probe = Probe(problem=answer["probe"]["problem"], alias=answer["probe"]["alias"], benchmarks={
            name: _benchmark(info) for name, info in answer["probe"]["benchmarks"].items()})
        return probe if [list(stat) for stat in _files_read(probe)] == answer["files_read"] else None
    except (TypeError, KeyError, ValueError):
        return None


def _benchmark(info: dict[str, Any]) -> Benchmark:
    return Benchmark(**{key: (tuple(value) if key == "bad_row" and value else value) for key, value in info.items()})


def _ask(python: Path, names: list[str]) -> Probe:
    try:
        done = nelnext.run_script(python, _PROBE, json.dumps(sorted(set(names))), json.dumps(BOXED_PROMPTS))
        answer = nelnext.last_json(done.stdout)
    except (subprocess.TimeoutExpired, OSError, json.JSONDecodeError) as exc:
        return Probe(problem=f"the NeMo-Skills probe failed: {exc}")
    if not isinstance(answer, dict):
        return Probe(problem=f"the NeMo-Skills probe failed: {done.stderr.strip()[-300:]}")
    found = {name: _benchmark({"name": name, **info})
             for name, info in (answer.get("benchmarks") or {}).items()}
    return Probe(problem=answer.get("problem"), alias=answer.get("alias", ""), benchmarks=found)


MAP_VARIABLE = "NEMO_SKILLS_EXTRA_BENCHMARK_MAP"


def map_paths() -> list[tuple[str, Path]]:
    """(key, path) of the extra benchmark map this process passes to nel-next and of each folder it maps a name to
    (relative ones against the map's folder, as NeMo-Skills resolves them); none without the variable."""
    raw = os.environ.get(MAP_VARIABLE)
    if not raw:
        return []
    where = Path(raw).expanduser().absolute()
    try:
        mapping = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [(MAP_VARIABLE, where)]  # unreadable: the map itself is what gets checked (and refused outside)
    folders = mapping.items() if isinstance(mapping, dict) else []
    return [(MAP_VARIABLE, where), *((f"{MAP_VARIABLE} entry {name!r}", where.parent / str(folder)) for name, folder in folders)]


def map_outside_root() -> str | None:
    """Under an MCP server's --root: why the operator's extra benchmark map may not be used (the map, or a folder it
    maps a name to, lies outside the root: its __init__.py would be imported), else None. Relative folders resolve
    against the map's own folder, as NeMo-Skills resolves them."""
    policy = paths.CALL_POLICY.get()
    if policy is None or policy.root is None:
        return None
    try:
        for key, path in map_paths():
            paths.local_path(str(path), key, paths.Policy(root=policy.root))
    except ToolError as exc:
        return f"the server's {MAP_VARIABLE} cannot be used under its --root ({exc}); nothing was imported from it"
    return None


def grading_problem(name: str, metrics_type: str | None) -> str | None:
    """Why nel-next 0.3.0 would not grade this skills:// benchmark with NeMo-Skills' evaluation, or None."""
    if metrics_type is None or metrics_type in SKILLS_GRADED_TYPES:
        return None
    if metrics_type == "":
        return f"NeMo-Skills has no benchmark '{name}' with a METRICS_TYPE (nel-next would fail to load it or not grade it)"
    return (f"skills://{name} is scored as NeMo-Skills METRICS_TYPE '{metrics_type}', which nel-next 0.3.0 does not grade: "
            f"it grades only {' and '.join(SKILLS_GRADED_TYPES)}, and falls back to exact match of the whole response "
            "(near 0 for any model, baseline and candidate alike)")


# ---------------------------------------------------------------- the prompt, in nel-next's settings


class PromptError(ValueError):
    pass


def jinja_template(user: str) -> str:
    """NeMo-Skills' `user` text (a str.format template) as the Jinja text nel-next renders: {problem} is nel-next's
    original_prompt (the row's problem), {examples} is empty (NeMo-Skills' default: no few-shot examples)."""
    parts: list[str] = []
    for literal, name, spec, conversion in string.Formatter().parse(user):
        if literal:
            risky = any(mark in literal for mark in ("{{", "{%", "{#"))
            parts.append("{% raw %}" + literal + "{% endraw %}" if risky else literal)
        if name is None:
            continue
        if spec or conversion:
            raise PromptError(f"the prompt formats {{{name}}} with a spec, which nel-next's template cannot reproduce")
        if name == "problem":
            parts.append("{{ original_prompt }}")
        elif name != "examples":
            raise PromptError(f"the prompt uses the row's '{name}', which nel-next does not pass to its template "
                              "(only the problem)")
    return "".join(parts)


def template_file(prompt_config: str, user: str) -> Path:
    """The instruction_template file for a prompt config, written once per content (named by config and hash)."""
    text = jinja_template(user)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    folder = paths.make_dir(paths.call_state_dir() / "nel-next-prompts")
    path = folder / f"nemo-skills-{prompt_config.replace('/', '--')}-{digest}.md"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path = paths.write_file(path, text)
    return path


def prompt_settings(bench: Benchmark) -> dict[str, Any]:
    """The benchmark item's keys that send NeMo-Skills' prompt: instruction_template and solver.system_prompt."""
    prompt = bench.prompt or {}
    if not prompt.get("user"):
        return {}
    settings: dict[str, Any] = {"instruction_template": str(template_file(prompt["config"], prompt["user"]))}
    if prompt.get("system"):
        if "{" in str(prompt["system"]).replace("{{", "").replace("}}", ""):
            raise PromptError("its system text uses the row's fields, which nel-next's system_prompt cannot")
        settings["system_prompt"] = str(prompt["system"]).replace("{{", "{").replace("}}", "}")
    return settings


# NAME and the benchmark map in force -> its prompt settings: a prompt config does not change while quanteval runs,
# and the recipes' nel-next forms ask for many names (a probe is a ~1 s child).
_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {}


def benchmark_item(name: str, found: Probe | None = None) -> dict[str, Any]:
    """A `benchmarks` list item for `name`; a `skills://NAME` one is sent NeMo-Skills' prompt for NAME where the
    NeMo-Skills in nel-next's venv knows it (validate_config says why where not)."""
    item = nelnext.benchmark_item(name)
    if not name.startswith(SCHEME):
        return item
    short = name[len(SCHEME):]
    key = (short, os.environ.get(nelnext.SKILLS_BENCHMARK_MAP, ""))
    if key not in _SETTINGS:
        found = found or probe([short])
        bench = found.benchmarks.get(short)
        if found.problem or bench is None or bench.unknown:
            return item
        try:
            _SETTINGS[key] = prompt_settings(bench)
        except PromptError:
            return item
    settings = dict(_SETTINGS[key])
    if settings.get("instruction_template") and not Path(settings["instruction_template"]).is_file():
        _SETTINGS.pop(key)  # its file was removed (another state dir): write it again
        return benchmark_item(name, found)
    if "system_prompt" in settings:
        item["solver"]["system_prompt"] = settings.pop("system_prompt")
    return {**item, **settings}


def prompt_name(item: dict[str, Any]) -> str | None:
    """The NeMo-Skills prompt config an item's instruction_template was written from (its file name says), or None."""
    template = str(item.get("instruction_template") or "")
    stem = Path(template).stem
    if not stem.startswith("nemo-skills-"):
        return None
    return stem[len("nemo-skills-"):].rsplit("-", 1)[0].replace("--", "/")


def rendered_prompt(item: dict[str, Any], bench: Benchmark) -> str | None:
    """The first problem as nel-next will send it (its own template renderer), for the dry run; None when unknown."""
    template = item.get("instruction_template")
    if not bench.data_file or not Path(bench.data_file).is_file():
        return None
    with open(bench.data_file, encoding="utf-8") as handle:
        first = next((json.loads(line) for line in handle if line.strip()), None)
    if not isinstance(first, dict):
        return None
    problem = str(first.get("problem", ""))
    if not template:
        return problem
    from jinja2 import Environment

    return Environment(keep_trailing_newline=True).from_string(Path(template).read_text(encoding="utf-8")).render(
        original_prompt=problem).strip()


_METRICS_PROBE = r"""
import json, sys
from nemo_skills.dataset import utils
types = {}
for name in sys.argv[1:]:
    try:
        found = utils.get_dataset_module(name)
        module = found[0] if isinstance(found, tuple) else found
        types[name] = getattr(module, "METRICS_TYPE", None) or ""
    except Exception:  # an unknown benchmark: NeMo-Skills raises its own error types
        types[name] = ""
print(json.dumps(types))
"""
_METRICS_TYPES: dict[str, str | None] = {}


def metrics_types(names: list[str]) -> dict[str, str | None]:
    """Each NeMo-Skills benchmark's METRICS_TYPE, read from its dataset module by the NeMo-Skills in nel-next's venv,
    else the one `ns eval` runs from (QUANTEVAL_NS_VENV): '' for a benchmark NeMo-Skills does not have (or that sets
    none), None for all when no NeMo-Skills is installed to ask. For the task catalogue (its names are NeMo-Skills'
    own, so cached); a config's benchmarks are asked with probe()."""
    if map_outside_root():  # the catalogue is not worth importing from outside the root: unknown
        return {name: None for name in names}
    wanted = [name for name in names if name not in _METRICS_TYPES]
    if wanted:
        found: dict[str, str | None] = {}
        for python in (nelnext.venv() / "bin" / "python", envvars.engine_venv("QUANTEVAL_NS_VENV", ".venv-nemo-skills") / "bin" / "python"):
            if not python.exists():
                continue
            try:
                done = nelnext.run_script(python, _METRICS_PROBE, *wanted)
                found = (nelnext.last_json(done.stdout) if done.returncode == 0 else None) or {}
            except (subprocess.TimeoutExpired, OSError, json.JSONDecodeError):
                found = {}
            if found:
                break
        for name in wanted:
            _METRICS_TYPES[name] = found.get(name)
    return {name: _METRICS_TYPES[name] for name in names}


# ---------------------------------------------------------------- catalogue tasks as nel-next benchmarks


def benchmark_for_task(nel_task: str) -> tuple[str | None, str]:
    """The nel-next benchmark that runs this NEL catalogue task in-process (`skills://NAME` for a NeMo-Skills task
    whose metrics nel-next grades), or None; and why. add_tasks, convert_config and the recipes' nel-next forms use it."""
    from quanteval.engines.catalogue import lookup

    entries = lookup(nel_task)
    entry = entries[0] if len(entries) == 1 else None
    if entry is None or entry.harness != "nemo_skills" or not entry.harness_task:
        harness = entry.harness if entry else "unknown"
        return None, (f"no nel-next benchmark runs {nel_task} (harness {harness}) in-process: only NeMo-Skills tasks map, "
                      "to skills://NAME. Keep it on NEL 0.2.6, or write it as a BYOB benchmark.")
    name = entry.harness_task
    metrics_type = metrics_types([name])[name]
    if why := grading_problem(name, metrics_type):
        return None, f"{why}. Keep it on NEL 0.2.6."
    graded = f"graded as '{metrics_type}' by NeMo-Skills' grader" if metrics_type else "metrics type unknown: no NeMo-Skills here to ask"
    return f"{SCHEME}{name}", (f"{SCHEME}{name} runs NeMo-Skills' {name} data in-process, {graded}, sent NeMo-Skills' prompt "
                               f"config for it as the benchmark's instruction_template ({ANSWER_FORMS.get(metrics_type or '', ANSWER_FORM_UNKNOWN)}); "
                               "NEL's container scores may differ in prompt and sampling: compare nel-next runs only with "
                               "nel-next runs.")


def task_form(qualified_name: str, repeats: int = 1) -> tuple[dict[str, Any] | None, str]:
    """A catalogue task's nel-next form (get_task_recipe): its `benchmarks` list item with the recipe's repeats, or
    None; and what it scores, or why there is none (benchmark_for_task)."""
    name, note = benchmark_for_task(qualified_name)
    if name is None:
        return None, note
    benchmark = benchmark_item(name)
    if repeats > 1:
        benchmark["repeats"] = repeats
    return benchmark, note


def _benchmarks_list(doc: Any) -> list:
    return configfile.list_at(doc, "benchmarks", "benchmarks")


def task_keys(doc: Any, clear: bool) -> set[str]:
    """The catalogue tasks a nel-next config runs: its skills://NAME benchmarks, as NeMo-Skills tasks (nemo_skills.ns_NAME)."""
    from quanteval.engines.catalogue import catalogue

    items = _benchmarks_list(doc)
    if clear:
        items.clear()
    names = {str(item.get("name", ""))[len(SCHEME):] for item in items
             if isinstance(item, dict) and str(item.get("name", "")).startswith(SCHEME)}
    return {e.qualified_name for e in catalogue() if e.harness == "nemo_skills" and e.harness_task in names}


def add_task(doc: Any, qualified_name: str, fragment: dict[str, Any], repeats: int | None) -> str:
    """The task's nel-next form (a skills:// benchmark sent NeMo-Skills' prompt, the recipe's repeats) appended; NEL
    0.2.6's item (fragment) is not its form."""
    from quanteval.models import ToolError

    name, why = benchmark_for_task(qualified_name)
    if name is None:
        raise ToolError(why)
    from quanteval import configfile

    item = benchmark_item(name)
    if repeats and repeats > 1:
        item["repeats"] = repeats
    _benchmarks_list(doc).append(commented := configfile.as_round_trip(item))
    show_prompt(commented)
    return name


def show_prompt(item: Any) -> None:
    """The prompt itself, where the config is read: a comment above a benchmark item's instruction_template."""
    if prompt := prompt_name(item):
        text = Path(item["instruction_template"]).read_text(encoding="utf-8").splitlines()
        item.yaml_set_comment_before_after_key("instruction_template", indent=4, before="\n".join(
            [f"NeMo-Skills' prompt config {prompt}, as nel-next's template (original_prompt: the problem):"]
            + [f"| {line}" for line in text[:8]]))

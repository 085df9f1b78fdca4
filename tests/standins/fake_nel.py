"""Stand-in for `nel run --config X` with `deployment: none`: reads the real config the eval server
wrote, queries the endpoint it names, and writes NEL's results layout
`<output_dir>/<ts>-<invocation>/<task>.0/artifacts/results.yml`.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import yaml

QUESTIONS = [(a, b) for a in range(1, 5) for b in range(1, 4)]


def main(argv: list[str]) -> int:
    assert argv[:2] == ["run", "--config"], argv
    config = yaml.safe_load(Path(argv[2]).read_text())
    assert config["defaults"][1] == {"deployment": "none"}
    endpoint = config["target"]["api_endpoint"]
    task = config["evaluation"]["tasks"][0]
    params = task["nemo_evaluator_config"]["config"]["params"]
    repeats = params.get("extra", {}).get("num_repeats", 1)
    correct = 0
    for a, b in QUESTIONS:
        for _ in range(repeats):
            body = {"model": endpoint["model_id"], "messages": [{"role": "user", "content": f"What is {a}+{b}?"}],
                    "temperature": params.get("temperature", 0)}
            request = urllib.request.Request(endpoint["url"], data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                text = json.loads(response.read())["choices"][0]["message"]["content"]
            boxed = re.findall(r"\\boxed\{(\d+)\}", text)
            correct += bool(boxed) and boxed[-1] == str(a + b)
    total = len(QUESTIONS) * repeats
    invocation = uuid.uuid4().hex[:16]
    artifacts = Path(config["execution"]["output_dir"]) / f"{time.strftime('%Y%m%d_%H%M%S')}-{invocation}" / f"{task['name']}.0" / "artifacts"
    artifacts.mkdir(parents=True)
    value = correct / total
    results = {"results": {"tasks": {task["name"]: {"metrics": {"symbolic_correct": {"scores": {
        "symbolic_correct": {"value": value, "stats": {"count": total, "stderr": (value * (1 - value) / total) ** 0.5}}}}}}}}}
    (artifacts / "results.yml").write_text(yaml.safe_dump(results))
    print(f"Invocation {invocation} done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

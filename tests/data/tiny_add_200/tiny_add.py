"""tiny_add's first 200 problems (examples/benchmarks/tiny_add.py, same name, prompt and scorer), for tests whose
runs go through the inference stand-in: what they check does not need 1,000 problems, and each run is 5x shorter."""

import re
from pathlib import Path

from nemo_evaluator.environments.custom import benchmark, scorer
from nemo_evaluator.scoring import ScorerInput

# A relative dataset path would resolve against the current directory; anchor it to this file.
_DATA = str(Path(__file__).resolve().with_name("tiny_add.jsonl"))
_INT = re.compile(r"-?\d+")


@benchmark(name="tiny_add", dataset=_DATA, prompt="{question}", target_field="answer")
@scorer
def tiny_add_scorer(sample: ScorerInput) -> dict:
    m = _INT.search(sample.response or "")
    extracted = m.group(0) if m else ""
    correct = bool(m) and int(extracted) == int(str(sample.target).strip())
    return {"correct": correct, "extracted": extracted}

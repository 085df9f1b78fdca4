"""tiny_add: two-number addition (0-99 each), the benchmark of the embedded model examples/checkpoints/tiny-add-*.

    nel eval run --bench examples/benchmarks/tiny_add.py \
        --model-url http://127.0.0.1:PORT/v1/chat/completions --model-id NAME -o OUTDIR

1000 problems held out from training (examples/embedded/train.py writes tiny_add.jsonl next to this file).
The prompt is the bare question ("7+45"); the model's chat template wraps it. The score is exact match of the
first integer in the response against the answer.
"""

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

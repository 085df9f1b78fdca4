"""nel-next as an Engine (engines/base.py): configs with services/benchmarks/cluster/output, runs through `nel eval
run`; it evaluates a served model in one call (evaluate_quantization) without Docker."""

from quanteval.engines.base import Engine
from quanteval.engines.nel_next import configrole, evaluation, placement, runs

ENGINE = Engine(name="nel-next", config=configrole, run=runs, placement=placement, evaluation=evaluation)

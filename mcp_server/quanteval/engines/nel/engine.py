"""NEL 0.2.6 as an Engine (engines/base.py): configs with execution/deployment/evaluation, runs through NEL's Python
API. It has no evaluation capability: evaluate_quantization runs an engine that evaluates without Docker."""

from quanteval.engines.base import Engine
from quanteval.engines.nel import configrole, placement, runs

ENGINE = Engine(name="nel", config=configrole, run=runs, placement=placement)

"""nel-next (nemo-evaluator >= 0.3): `nel eval run` from its own Python 3.12 venv, configs with services/benchmarks/cluster/output."""

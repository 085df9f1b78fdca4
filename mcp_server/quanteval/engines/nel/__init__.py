"""NEL 0.2.6 (nemo-evaluator-launcher): `nel run`, Hydra configs with execution/deployment/evaluation."""

"""The eval server for training loops: NeMo-Skills benchmarks behind slime's eval-delegate API, below its faces.

- backend.py: what the job queue and its backends share (slime's payload, the server's settings, the backend
  interface, the shard commands a backend returns);
- jobs.py: the job queue (idempotency, cancellation, shutdown), which picks a backend from its registry;
- nemo_skills.py: the `nemo-skills` backend (`ns eval`); nel.py: the `nel` backend (NEL's nemo_skills tasks);
- liveness.py: whether the server a ledger record names still runs (eval_server_status and list_runs).

Its faces are faces/evalhttp.py (the HTTP layer) and faces/evalserver.py (start_eval_server, eval_server_status,
stop_eval_server); workflow/runs.py (list_runs) and workflow/confine.py read it too. It uses the engine registry and
the modules engines share (engines/*.py), serving and the core, never one engine's own package.
"""

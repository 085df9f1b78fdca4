"""Which NeMo-Skills this project installs: one commit, for nel-next's skills:// benchmarks (engines/nel_next/skills.py)
and the eval server's `ns eval` (evalserver/nemo_skills.py). scripts/nemo-skills-source.sh, which setup-nel-next and
setup-nemo-skills source, installs the same commit (tests/test_nemo_skills_source.py holds the two equal).

467b057 (2026-05-18): nel-next 0.3.0 unpacks two values from get_dataset_module, which NeMo-Skills returned from
144c70b (2026-02-19) on; earlier commits returned three.
"""

from __future__ import annotations

NEMO_SKILLS_COMMIT = "467b057"
NEMO_SKILLS_UPSTREAM = f"git+https://github.com/NVIDIA-NeMo/Skills@{NEMO_SKILLS_COMMIT}"

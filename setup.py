"""Bundles the skill pack into the wheel: skills/, recipes/ and references/ are copied to
quanteval/_pack/ at build time, so `quanteval skills install` and the MCP resources work
from an installed package with no network. The repository keeps its top-level layout;
an editable install reads it directly (quanteval.engines.recipes.pack_dir)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PACK_FOLDERS = ("skills", "recipes", "references")


class build_py_with_pack(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        pack = Path(self.build_lib) / "quanteval" / "_pack"
        for folder in PACK_FOLDERS:
            if (here / folder).is_dir():
                shutil.rmtree(pack / folder, ignore_errors=True)
                shutil.copytree(here / folder, pack / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": build_py_with_pack})

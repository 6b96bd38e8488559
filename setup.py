"""The build step pyproject.toml cannot express: config.toml and web/ live at the repository's top level (where a
reader looks for them) and are shipped inside the ``gateway`` package, where an installed gateway finds them
(gateway/shipped.py). Everything else about the package is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("config.toml", "web")


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads them where they are
            return
        package = Path(self.build_lib) / "gateway"
        for name in SHIPPED:
            source, target = ROOT / name, package / name
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("node_modules"))
            else:
                shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithShippedFiles})

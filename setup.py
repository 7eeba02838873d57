"""The package list, found instead of kept by hand (a hand list once left two subpackages out of
the wheel while editable installs, and so every test, still had them). The repository root is
the ``codepost`` package (``package-dir`` in pyproject.toml) and pyproject's finder cannot
prefix what it finds, hence this file; the metadata stays in pyproject.toml."""

import os

from setuptools import find_packages, setup

# The root's folders that are not part of the package, should one ever get an __init__.py.
NOT_PACKAGE = ("tests", "docs", "benchmarks", "scripts", "configs", "build", "site")

subpackages = find_packages(exclude=[*NOT_PACKAGE, *(f"{name}.*" for name in NOT_PACKAGE)])
setup(
    packages=["codepost", *(f"codepost.{name}" for name in subpackages)],
    # This file sits in the `codepost` package's folder: named as the setup script, it is not
    # shipped as a module of it (a PEP 517 build names the build hook's file instead).
    script_name=os.path.basename(__file__),
)

"""pyproject.toml: what `pip install gpudoctor` pulls, what each extra adds, the metadata.

torch is the user's (their CUDA or ROCm build must never be replaced by pip), TensorBoard
and its plugin come with the ``view`` extra, and ``test`` pulls everything the tests need
but torch (the README and .ci/run install torch==2.13.0 first).
"""

from __future__ import annotations

import re
import sys

import pytest
from installlib import ROOT
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra pulls tomli on 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
VIEW = {"tensorboard", "torch-tb-profiler"}


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


def test_pip_install_pulls_neither_torch_nor_tensorboard() -> None:
    base = names(PROJECT["dependencies"])
    assert "torch" not in base
    assert not base & VIEW
    assert {"click", "numpy", "msgspec", "scipy", "isal", "psutil", "nvidia-ml-py"} <= base


def test_torch_is_in_no_extra() -> None:
    for extra, reqs in PROJECT["optional-dependencies"].items():
        assert "torch" not in names(reqs), extra


def test_view_extra_holds_tensorboard_and_the_profiler_plugin() -> None:
    assert names(PROJECT["optional-dependencies"]["view"]) == VIEW


def test_test_extra_pulls_every_other_extra_and_the_test_tools() -> None:
    extras = PROJECT["optional-dependencies"]
    test = names(extras["test"])
    for extra, reqs in extras.items():
        assert names(reqs) <= test, f"the test extra lacks {names(reqs) - test} of [{extra}]"
    assert {"pytest", "jsonschema", "ruff"} <= test


def test_license_is_an_spdx_expression_with_its_text() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    for name in PROJECT["license-files"]:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "Apache License" in text and "Version 2.0, January 2004" in text
    # PEP 639: a license expression replaces the License :: classifiers
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_metadata_is_complete() -> None:
    for key in ("name", "version", "description", "readme", "requires-python", "authors", "keywords", "classifiers"):
        assert PROJECT.get(key), key
    assert (ROOT / PROJECT["readme"]).is_file()
    lowest = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert lowest is not None
    versions = {int(m) for c in PROJECT["classifiers"] for m in re.findall(r"^Programming Language :: Python :: 3\.(\d+)$", c)}
    assert versions and min(versions) == int(lowest.group(1))
    # the entry module installs the signal handlers before click is imported (tests/faults/test_faults_signals.py)
    assert PROJECT["scripts"]["gpudoctor"] == "gpudoctor.__main__:main"


@pytest.mark.parametrize("where", ["README.md", ".ci/run"])
def test_setup_installs_torch_first_then_the_test_extra(where: str) -> None:
    text = (ROOT / where).read_text(encoding="utf-8")
    torch = text.find("pip install -q torch==2.13.0" if where == ".ci/run" else "pip install torch==2.13.0")
    extra = text.find('-e ".[test]"')
    assert 0 <= torch < extra, f"{where} must install torch==2.13.0 before .[test] (which does not pull it)"
    if where == "README.md":
        assert 'pip install "gpudoctor[view]"' in text or "gpudoctor[view]" in text

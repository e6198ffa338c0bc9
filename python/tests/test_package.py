"""The package as users get it: pip-installed, and the example engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import kvfabric

PKG = Path(__file__).resolve().parent.parent


def readme_install_lines() -> list[str]:
    """The install lines of the repository README: the shell block that
    installs the package with --no-build-isolation, without its apt-get."""
    text = (PKG.parent / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        if "--no-build-isolation" in block:
            return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "sudo", "apt-get"))]
    raise AssertionError("README.md has no shell block installing the Python package with --no-build-isolation")


def test_readme_install_line(tmp_path):
    """The README's install lines, run as written from a copy of the
    repository's python/ folder, offline (PIP_NO_INDEX), with $HOME in a
    scratch folder: a venv on Debian's packages that imports the package,
    at the version pyproject gives it."""
    lines = readme_install_lines()
    assert any("venv --system-site-packages" in ln for ln in lines), lines
    # From a copy: a build writes build/ and *.egg-info beside the sources.
    shutil.copytree(PKG, tmp_path / "python", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    # The lines say python3; run them on this interpreter.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    done = subprocess.run(["bash", "-euc", "\n".join(lines)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{lines}:\n{done.stdout}{done.stderr}"
    pythons = list(home.glob("*/bin/python"))
    assert len(pythons) == 1, f"the lines made no venv under $HOME: {list(home.iterdir())}"
    out = subprocess.run(
        [str(pythons[0]), "-c", "import importlib.metadata as m, kvfabric, kvfabric._pb.fabric.fabricpb.engine_pb2_grpc as g; "
         "print(kvfabric.__file__); print(m.version('kvfabric'), kvfabric.__version__); "
         "print(kvfabric.block_hashes([1, 2, 3, 4], 4)[0]); print(hasattr(g, 'EngineStub'))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert out[0].startswith(str(home)) and out[0].endswith("site-packages/kvfabric/__init__.py"), out
    assert out[1:] == [f"{kvfabric.__version__} {kvfabric.__version__}", "14643705804678351452", "True"]
    assert (Path(out[0]).parent / "py.typed").exists()


def test_version_has_one_source():
    """pyproject.toml takes the version from kvfabric.__version__."""
    with open(PKG / "pyproject.toml", "rb") as f:
        meta = tomllib.load(f)
    assert "version" not in meta["project"], "pyproject.toml states a version of its own"
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvfabric.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvfabric.__version__)


def test_example_engine(kvfabric_bin):
    out = subprocess.run(
        [sys.executable, str(PKG / "examples" / "engine.py"), "--bin", kvfabric_bin, "--blocks", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stored 4 blocks at TP 4 on node1" in out.stdout
    assert "TP 2 on node2: all 4 blocks equal, element by element" in out.stdout

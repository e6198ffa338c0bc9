"""The package as users get it: pip-installed, and the example engine."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent


def test_pip_install(tmp_path):
    if importlib.util.find_spec("pip") is None:
        pytest.skip(f"{sys.executable} has no pip (Debian: python3-pip)")
    # From a copy: a build writes build/ and *.egg-info beside the sources.
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    # Offline: the build backend and the dependencies come from this interpreter.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
         "--no-build-isolation", "--target", str(tmp_path / "site"), str(src)],
        check=True,
        cwd=tmp_path,
    )
    out = subprocess.run(
        [sys.executable, "-c", "import kvfabric, kvfabric._pb.fabric.fabricpb.engine_pb2_grpc as g; "
         "print(kvfabric.__file__); print(kvfabric.block_hashes([1, 2, 3, 4], 4)[0]); print(hasattr(g, 'EngineStub'))"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [str(tmp_path / "site" / "kvfabric" / "__init__.py"), "14643705804678351452", "True"]
    assert (tmp_path / "site" / "kvfabric" / "py.typed").exists()


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

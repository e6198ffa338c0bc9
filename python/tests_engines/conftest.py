"""Tests against the real engines, run by ``make test-engines`` in the
engines' virtual environments (``make engines-venv``); the agents are the
same as the client's tests start (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package from the source tree

_spec = importlib.util.spec_from_file_location("kvfabric_test_agents", HERE.parent / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
agents = importlib.util.module_from_spec(_spec)
sys.modules["kvfabric_test_agents"] = agents
_spec.loader.exec_module(agents)

kvfabric_bin = agents.kvfabric_bin
cluster = agents.cluster
node1 = agents.node1
node2 = agents.node2
wait_for = agents.wait_for

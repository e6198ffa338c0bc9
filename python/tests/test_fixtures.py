"""The tests' own fixtures: the agents they start die with the pytest that
started them, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import wait_for

HERE = Path(__file__).resolve().parent


def gone(pid: int) -> bool:
    """Whether process pid has exited (a zombie that nothing reaps counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_agent_dies_with_a_killed_pytest():
    # A stand-in for pytest starts a stand-in for an agent as Agent.start
    # does (its own session, _die_with_parent), and is killed (SIGKILL: no
    # cleanup of its runs).
    code = textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {str(HERE)!r})
        from conftest import _die_with_parent
        p = subprocess.Popen(["sleep", "600"], start_new_session=True, preexec_fn=_die_with_parent)
        print(p.pid, flush=True)
        sys.stdin.read()
    """)
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as parent:
        assert parent.stdout is not None
        agent = int(parent.stdout.readline())
        try:
            parent.kill()
            parent.wait()
            wait_for("the agent killed with its parent", lambda: gone(agent))
        finally:
            if not gone(agent):
                os.kill(agent, signal.SIGKILL)

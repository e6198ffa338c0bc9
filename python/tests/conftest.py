"""Real agents of the built binary on loopback, shared by the tests.

The binary is $KVFABRIC_BIN, else bin/kvfabric of this repository, built
with go when missing (``make test-python`` builds it first). Each agent has
its own loopback address 127.B.C.i (one random B.C per run, so that runs
side by side never meet) with fixed ports, and everything lives under one
temporary directory.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package from the source tree

import kvfabric  # noqa: E402


def _die_with_parent() -> None:
    """Run in an agent's child before exec: the agent is killed (SIGKILL)
    when the process that started it ends, however it ends (a pytest killed
    at its limit runs no fixture's cleanup), instead of running on in its
    own session. Linux only (PR_SET_PDEATHSIG, which fires as the thread
    that started the agent ends: the tests start agents from their main
    thread); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


REPO = HERE.parent.parent
#: node2's session keepalive bound: short, so that the tests see it work.
KEEPALIVE_MS = 300


def wait_for(what: str, cond, timeout: float = 20.0, pause: float = 0.05):
    """Poll cond until it returns a true value; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # the agent may not answer yet
            last = e
        time.sleep(pause)
    raise AssertionError(f"{what}: not within {timeout} s (last error: {last!r})")


@pytest.fixture(scope="session")
def kvfabric_bin() -> str:
    env = os.environ.get("KVFABRIC_BIN")
    if env:
        if not os.access(env, os.X_OK):
            pytest.fail(f"KVFABRIC_BIN={env} is not an executable")
        return env
    path = REPO / "bin" / "kvfabric"
    if not path.exists():
        go = shutil.which("go")
        if go is None:
            pytest.fail(f"{path} is missing and there is no go to build it (run make build)")
        subprocess.run([go, "build", "-o", str(path), "./cmd/kvfabric"], cwd=REPO, check=True)
    return str(path)


@dataclass
class Agent:
    name: str
    ip: str
    root: Path
    bin: str
    extra: list[str] = field(default_factory=list)
    #: Variables added to the agent's environment (SOFTCUDA_* settings).
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / self.name

    @property
    def socket(self) -> str:
        return str(self.data_dir / "engine.sock")

    @property
    def gossip(self) -> str:
        return f"{self.ip}:7946"

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    def start(self, join: str | None = None) -> None:
        args = [
            self.bin, "agent", "--local", "--node", self.name, "--data-dir", str(self.data_dir),
            "--dev-ca-dir", str(self.root / "ca"), "--gossip-addr", self.gossip,
            "--peer-addr", f"{self.ip}:7947", "--metrics-addr", f"{self.ip}:7948",
            "--pool", "host=96MiB", "--block-set-slots", "64",
            "--dumpable",  # softcuda opens agents' memory from other processes
        ] + self.extra
        if join:
            args += ["--join", join]
        log = open(self.log, "ab")
        # The agent refuses KVFABRIC_ variables that are not its settings
        # (KVFABRIC_BIN is ours), and a test agent takes none of the
        # caller's anyway.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVFABRIC_")} | self.env
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True, env=env,
                                     preexec_fn=_die_with_parent)
        log.close()

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.ip}:7948/healthz", timeout=1) as r:
                    return r.status == 200 and os.path.exists(self.socket)
            except urllib.error.HTTPError as e:
                e.close()  # not ready yet (503): its connection is closed, not left to the collector
                return False

        try:
            wait_for(f"{self.name} healthy", healthy)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.tail()}") from None

    def client(self, **kw) -> kvfabric.Client:
        kw.setdefault("engine", f"test-{self.name}")
        return kvfabric.Client(self.socket, **kw)

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Cluster:
    agents: list[Agent]

    def __getitem__(self, i: int) -> Agent:
        return self.agents[i]


@pytest.fixture(scope="session")
def cluster(kvfabric_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two agents: node1 serves the descriptor only, node2 also a named
    memory file (--memory-dir), and ends silent sessions after KEEPALIVE_MS."""
    root = tmp_path_factory.mktemp("kvfabric")
    net = f"127.{random.randint(10, 209)}.{random.randint(1, 250)}."
    a = Agent("node1", net + "1", root, kvfabric_bin)
    b = Agent(
        "node2", net + "2", root, kvfabric_bin,
        extra=["--memory-dir", str(root / "mem2"), "--session-keepalive", f"{KEEPALIVE_MS}ms"],
    )
    c = Cluster([a, b])
    try:
        a.start()
        b.start(join=a.gossip)
        for ag in c.agents:
            with ag.client() as cl:
                wait_for(
                    f"{ag.name} sees both members",
                    lambda: sum(m.state == "alive" for m in cl.status().members) == 2,
                )
        yield c
    finally:
        for ag in reversed(c.agents):
            ag.stop()


@pytest.fixture
def node1(cluster: Cluster) -> Agent:
    return cluster[0]


@pytest.fixture
def node2(cluster: Cluster) -> Agent:
    return cluster[1]

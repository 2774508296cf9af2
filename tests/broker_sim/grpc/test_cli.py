"""``broker-sim serve --grpc-port``: bad input is one line on stderr, before any port is bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker_sim.grpc.policy import GroupPolicy
from broker_sim.grpc.protocol import PROTOCOL_ENV


def serve(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "broker_sim", "serve", "--store", str(tmp_path / "s"),
            "--namesrv-port", "0", "--broker-port", "0", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_grpc_port_without_the_protocol_modules_is_a_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, PROTOCOL_ENV: str(tmp_path / "nowhere")}
    r = serve(tmp_path, "--grpc-port", "0", env=env)
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("broker-sim: error: no rocketmq.grpc_protocol found")
    assert PROTOCOL_ENV in line  # the hint names the way out


def test_bad_group_policy_is_a_one_line_error(tmp_path: Path) -> None:
    r = serve(tmp_path, "--grpc-group", "orders:fifo,retries=3", env=dict(os.environ))
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert "unknown --grpc-group option 'retries=3'" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--grpc-group", "g:max_attempts=3", "--grpc-group", "g:fifo"], "--grpc-group 'g' given twice"),
        (["--grpc-group", "g:max_attempts=3"], "it needs --grpc-port"),
        (["--grpc-group", "g:max_attempts=x"], "max_attempts must be a whole number"),
    ],
)
def test_group_policies_that_would_be_ignored_or_half_applied_are_one_line_errors(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """Two options for one group: the second replaced the first, silently; a policy without the gRPC port
    was dropped, silently; ``max_attempts=x`` named neither the option nor the group."""
    r = serve(tmp_path, *args, env=dict(os.environ))
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("broker-sim: error:") and said in line


def test_group_policy_spec() -> None:
    name, policy = GroupPolicy.parse("orders:fifo,max_attempts=3,backoff=500ms;5s;1m")
    assert name == "orders"
    assert policy == GroupPolicy(fifo=True, max_attempts=3, backoff_s=(0.5, 5.0, 60.0))
    assert [policy.delay_s(n) for n in (1, 2, 3, 9)] == [0.5, 5.0, 60.0, 60.0]
    assert GroupPolicy.parse("plain")[1] == GroupPolicy()
    for bad in ("orders:max_attempts=0", "orders:backoff=soon", ":fifo"):
        with pytest.raises(ValueError):
            GroupPolicy.parse(bad)

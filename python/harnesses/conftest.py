"""Fixtures for the harness adapters' tests: a Docker engine, the kit's images, a task image
tag of each test's own (harnesses remove their task images when they tear down)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import docker
import docker.errors
import pytest

import support

# A leftover of an "agent" that solved nothing: whenever the reward file says anything but 1,
# it writes 1. It ignores SIGTERM and lives in a session of its own.
REWARD_FORGER = (
    'nohup setsid sh -c \'trap "" TERM; while :; do '
    '[ "$(cat /logs/verifier/reward.txt 2>/dev/null)" = 1 ] || '
    "echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done' >/dev/null 2>&1 &"
)


@pytest.fixture(scope="session")
def client() -> Iterator[docker.DockerClient]:
    """A Docker engine that answers, with the kit's test images built on it."""
    yield from support.docker_client("harnesses")


@pytest.fixture
def task_image(client: docker.DockerClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A tag of qhk-slim (or the test's `image` param) that the harness may delete."""
    base = getattr(request, "param", support.SLIM)
    tag = f"{support.PREFIX}task-{uuid.uuid4().hex[:8]}"
    client.images.get(base).tag(tag)
    yield tag
    with contextlib.suppress(docker.errors.DockerException):
        client.images.remove(tag)


@pytest.fixture
def project() -> Iterator[str]:
    """A Compose project name of this test's own; its containers are removed afterwards."""
    name = f"{support.PREFIX}{uuid.uuid4().hex[:8]}"
    yield name
    c = docker.from_env()
    for ctr in c.containers.list(all=True, filters={"label": f"com.docker.compose.project={name}"}):
        with contextlib.suppress(docker.errors.DockerException):
            ctr.remove(force=True)
    for net in c.networks.list(filters={"label": f"com.docker.compose.project={name}"}):
        with contextlib.suppress(docker.errors.DockerException):
            net.remove()

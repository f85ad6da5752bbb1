"""Agents for the Harbor switch's tests (test_harbor_switch.py), named to Harbor as
`harbor_agents:NAME` (python/harnesses is on PYTHONPATH).

DefaultUserAgent runs one command, $DEFAULT_USER_AGENT_CMD, as Harbor 0.25.0's Terminus-2 runs
its tmux server and every keystroke: `environment.exec(cmd, user=environment.default_user)`,
the user named. With task.toml's `[agent] user = "root"` that user is "root".
"""

from __future__ import annotations

import os

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class DefaultUserAgent(BaseAgent):  # type: ignore[misc]
    @staticmethod
    def name() -> str:
        return "default-user-agent"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        r = await environment.exec(
            os.environ["DEFAULT_USER_AGENT_CMD"], user=environment.default_user
        )
        (self.logs_dir / "default-user-agent.txt").write_text(
            f"default_user={environment.default_user!r} exit={r.return_code}\n"
            f"{r.stdout or ''}{r.stderr or ''}"
        )

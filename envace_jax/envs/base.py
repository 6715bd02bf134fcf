"""The executable tool-environment interface.

Host-side only (no jax). An environment is reset from one task record and then
executes tool calls, returning the response string the ACT role will read inside
``<tool_response>``. Bad calls are not exceptions: they come back as responses
with ``error=True`` carrying the environment's own error text, exactly as a real
tool would answer them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class ToolResult:
    content: str  # what the tool returned, as the caller sees it
    error: bool = False  # True when the environment rejected or failed the call


class ToolEnvironment(abc.ABC):
    """One live environment instance (one episode)."""

    @abc.abstractmethod
    def reset(self, task: Mapping[str, Any]) -> None:
        """Rebuilds pristine state from a task record (its ``env`` field or benchmark entry)."""

    @abc.abstractmethod
    def execute(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Executes one call with already-parsed keyword arguments."""

    @property
    @abc.abstractmethod
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas ``{"type": "function", "function": {...}}`` of the live tools."""


class NoToolEnvironment(ToolEnvironment):
    """Fails loudly on any call: used to prove that a code path never touches a real tool."""

    def __init__(self, schemas: list[dict[str, Any]] | None = None):
        self._schemas = list(schemas or [])
        self.calls: list[tuple[str, dict]] = []

    def reset(self, task: Mapping[str, Any]) -> None:
        self._schemas = list(task.get("tools", self._schemas))

    def execute(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        self.calls.append((name, dict(arguments)))
        raise RuntimeError(f"real tool {name!r} was called where no real tool may run")

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._schemas

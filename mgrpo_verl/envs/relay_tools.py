"""The sub-agent's tool of the "relay_tools" task: ``read_secret`` reads the sample's secret digit.

:class:`ReadSecretTool` is a verl ``BaseTool`` (a "native" tool of verl's tool config format, see
``mgrpo_verl/config/tools/relay_sub_tools.yaml`` = :data:`mgrpo_verl.envs.relay.SUB_TOOL_CONFIG`).

How the digit reaches it: each dataset row carries ``extra_info.tools_kwargs =
{"read_secret": {"create_kwargs": {"secret": "<digit>"}}}`` (:func:`mgrpo_verl.envs.relay.secret_tools_kwargs`).
verl's ``RLHFDataset`` copies ``extra_info.tools_kwargs`` into the row's ``tools_kwargs``, the agent-loop
worker passes it to the loop as ``kwargs["tools_kwargs"]``, and ``ToolAgentLoop._call_tool`` calls
``tool.create(create_kwargs=tools_kwargs[tool name]["create_kwargs"])`` once per call, then
``execute(instance_id, arguments)`` and ``release(instance_id)``. The tool-delegation loop passes the main
row's ``tools_kwargs`` on to each sub-agent call, so the sub-agent's ``read_secret`` sees the sample's digit.

The tool takes no arguments (any given are ignored). A sample without a secret is not a crash: the tool
answers ``"<error: no secret for this sample>"``.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

#: What the tool answers when the sample gave it no secret.
NO_SECRET = "<error: no secret for this sample>"


def secret_schema(name: str = "read_secret") -> OpenAIFunctionToolSchema:
    """The tool's OpenAI function schema (no parameters), used when the tool config gives none."""
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "Read the secret digit of this task.",
                "parameters": {"type": "object", "properties": {}, "required": []},
            },
        }
    )


class ReadSecretTool(BaseTool):
    """``read_secret()``: returns ``"The secret digit is <d>."`` for the sample's digit ``d``.

    State per instance (one instance per call, created and released by verl's tool loop): the secret
    given in ``create_kwargs``.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        self._secrets: dict[str, Optional[str]] = {}
        super().__init__(config, tool_schema or secret_schema())

    async def create(
        self, instance_id: Optional[str] = None, create_kwargs: Optional[dict[str, Any]] = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """A new instance holding ``create_kwargs["secret"]`` (or ``kwargs["secret"]``; ``None`` when absent)."""
        instance_id = instance_id or str(uuid4())
        secret = (create_kwargs or {}).get("secret", kwargs.get("secret"))
        self._secrets[instance_id] = None if secret is None else str(secret)
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """The secret of ``instance_id``; reward 0 (the task's scorer scores the answers)."""
        secret = self._secrets.get(instance_id)
        if secret is None:
            return ToolResponse(text=NO_SECRET), 0.0, {}
        return ToolResponse(text=f"The secret digit is {secret}."), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._secrets.pop(instance_id, None)

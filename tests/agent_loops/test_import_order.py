"""Our agent loops register with verl whichever of our modules a process imports first.

``mgrpo_verl.plugin`` registers the loops when verl's ``agent_loop`` module is imported; the loop modules import
``mgrpo_verl.agent_loops.common``, which imports verl's ``agent_loop`` itself. So when ``common`` is a process's first
import, the loops are imported while ``common`` is half-initialised, and a loop module that used one of its names at
import time failed (``cooperative._FAILED = common.Generation(...)``: ``recipes/research_baselines.sh``'s report,
which imports ``common`` first, stopped with "partially initialized module ... has no attribute 'Generation'")."""

from __future__ import annotations

import pytest

CHECK = """
import importlib, json
importlib.import_module("{first}")
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
print(json.dumps(sorted(_agent_loop_registry)))
"""

OUR_LOOPS = {"magrpo_coop", "mgrpo_delegate", "mgrpo_relay", "mgrpo_relay_sub"}


@pytest.mark.parametrize("first", ["mgrpo_verl.agent_loops.common", "mgrpo_verl.agent_loops.cooperative",
                                   "mgrpo_verl.agent_loops.tool_delegation", "mgrpo_verl.agent_loops.delegation",
                                   "mgrpo_verl.experiments.research_eval", "verl.experimental.agent_loop"])
def test_every_loop_registers_whatever_is_imported_first(first):
    from tests.platform.conftest import run_python

    registered = set(run_python(CHECK.format(first=first), timeout=300))
    assert OUR_LOOPS <= registered, (first, sorted(registered))

"""The multi-agent agent loops, registered with verl's agent-loop registry when verl's agent-loop module is
imported (:func:`mgrpo_verl.plugin.register_multi_agent`), and what they share.

- :mod:`.delegation`: ``mgrpo_relay`` (forced delegation: plan, d sub-agent calls, answer) and
  ``mgrpo_relay_sub`` (one sub-agent call, served to a decoupled main side);
- :mod:`.tool_delegation`: ``mgrpo_delegate`` (the main agent calls ``ask_<sub>(task)`` tools, each sub-agent
  runs its own tool loop);
- :mod:`.cooperative`: ``magrpo_coop`` (MAGRPO's tree of joint actions);
- :mod:`.common`: the pieces they share (settings, generation call, agent handle, row metadata record);
- :mod:`.multi_client`, :mod:`.remote_sub`, :mod:`.sub_service`: calling each agent's own model, locally or
  on a decoupled sub side; :mod:`.testing`: building a loop as verl's worker does, without Ray.

The inference backend the loops may call on CPU is another package, :mod:`mgrpo_verl.hf_rollout`.
"""

"""vLLM as a rollout backend of several agents (the vLLM counterpart of :mod:`mgrpo_verl.hf_rollout`).

:mod:`.lora`: several agents' LoRA adapters served by one vLLM engine (vLLM's multi-LoRA). Importing this
package imports nothing of vLLM; importing :mod:`.lora` does.
"""

"""Placing the agents' resource pools on the nodes of a multi-node Ray cluster (docs/multinode.md).

verl makes every resource pool one STRICT_PACK placement group per entry of its spec; our pools
(``agent_<name>``, one per model-owning agent) have one entry, so all of an agent's GPUs are on one node,
and Ray picks the node. Two things differ from verl here, both opt-in:

- **pinning**: :class:`PinnedResourcePoolManager` adds a node's custom resource (declared at
  ``ray start --resources='{"node_main": 1}'``) to every bundle of a pool, so the pool can only land on
  that node. It uses verl's own hook for this, ``RayResourcePool(accelerator_type=...)``, which adds
  ``{<name>: 1e-4}`` to each bundle (meant for accelerator-type labels; any custom resource works).
- **a check before placement**: verl checks only the cluster's total GPUs, and a pool that no node can
  hold makes its ``placement_group(...).ready()`` wait forever. :func:`placement_problem` searches for an
  assignment of the pools to the nodes' free GPUs and CPUs (exactly; a handful of pools) and the manager
  raises ``ValueError`` naming the agent's setting when there is none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl.single_controller.ray.base import RayResourcePool, ResourcePoolManager

#: Our pools are named ``agent_<agent name>`` (``MultiAgentTrainer._init_resource_pool_mgr``).
POOL_PREFIX = "agent_"

#: The amount of a pinning resource each bundle takes (what verl's ``accelerator_type`` hook adds): a node
#: that declares ``{name: 1}`` holds up to 10,000 bundles.
PIN_AMOUNT = 1e-4


def setting_of(pool: str, key: str = "n_gpus_per_node") -> str:
    """The config key behind a pool, for error messages."""
    if pool.startswith(POOL_PREFIX):
        return f"multi_agent.agents.{pool[len(POOL_PREFIX):]}.{key}"
    return f"resource pool {pool!r}"


def node_slots(resources: Mapping[str, float], gpu: str, cpus_per_bundle: int) -> int:
    """How many of verl's bundles (``{CPU: cpus_per_bundle, <gpu>: 1}``) fit in a node's free ``resources``."""
    gpus = math.floor(resources.get(gpu, 0) + 1e-9)
    cpus = math.floor(resources.get("CPU", 0) / cpus_per_bundle + 1e-9) if cpus_per_bundle > 0 else gpus
    return max(0, min(gpus, cpus))


def placement_problem(
    pools: Mapping[str, int],
    pins: Mapping[str, str],
    nodes: Mapping[str, Mapping[str, float]],
    gpu: str = "GPU",
    cpus_per_bundle: int = 1,
) -> str | None:
    """None when every pool (name -> GPUs, all on one node) fits on some node at once, else why not.

    ``pins``: pool -> custom resource its node must have; ``nodes``: node id -> free resources (Ray's
    ``available_resources_per_node()``). Exact search over assignments (largest pool first).
    """
    slots = {node: node_slots(res, gpu, cpus_per_bundle) for node, res in nodes.items()}
    eligible = {
        pool: [n for n in nodes if pool not in pins or nodes[n].get(pins[pool], 0) >= PIN_AMOUNT * size]
        for pool, size in pools.items()
    }
    for pool, size in pools.items():
        where = f" with resource {pins[pool]!r}" if pool in pins else ""
        if not eligible[pool]:
            return (f"{setting_of(pool, 'node_resource')}: no node of the cluster has the resource {pins[pool]!r} "
                    f"(with room for {size} bundles)")
        best = max(slots[n] for n in eligible[pool])
        if size > best:
            return (
                f"{setting_of(pool)}={size}: an agent's workers are one placement group on one node (STRICT_PACK), "
                f"but the largest node{where} has {best} free {gpu} (with {cpus_per_bundle} CPUs each); "
                f"verl would wait forever for it"
            )

    order = sorted(pools, key=lambda p: (-pools[p], p))

    def place(i: int, free: dict[str, int]) -> bool:
        if i == len(order):
            return True
        pool = order[i]
        for node in eligible[pool]:
            if free[node] >= pools[pool]:
                free[node] -= pools[pool]
                if place(i + 1, free):
                    return True
                free[node] += pools[pool]
        return False

    if place(0, dict(slots)):
        return None
    wanted = ", ".join(f"{setting_of(p)}={pools[p]}" + (f" on {pins[p]!r}" if p in pins else "") for p in order)
    return f"the agents' pools do not fit together on the nodes' free {gpu}: {wanted}; free per node: {slots}"


@dataclass
class PinnedResourcePoolManager(ResourcePoolManager):
    """verl's ``ResourcePoolManager`` with optional node pins per pool and a per-node placement check.

    ``node_resources``: pool name -> custom resource of the node its bundles must land on (pools not
    listed are placed by Ray, as in verl). The check runs in ``create_resource_pool``, after Ray is up and
    before any placement group is requested.
    """

    node_resources: dict[str, str] = field(default_factory=dict)

    def create_resource_pool(self):
        unknown = sorted(set(self.node_resources) - set(self.resource_pool_spec))
        if unknown:
            raise ValueError(f"node_resources names pools {unknown} that are not in the spec "
                             f"{sorted(self.resource_pool_spec)}")
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=True,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
                accelerator_type=self.node_resources.get(name),
            )
        self._check_resource_available()

    def _check_resource_available(self):
        super()._check_resource_available()  # the cluster-wide total, as verl
        import ray
        from verl.plugin.platform import get_platform

        gpu = get_platform().ray_resource_name()
        pools = {}
        for name, process_on_nodes in self.resource_pool_spec.items():
            for i, count in enumerate(process_on_nodes):
                pools[name if len(process_on_nodes) == 1 else f"{name}[{i}]"] = count
        pins = {p: self.node_resources[p.split("[")[0]] for p in pools if p.split("[")[0] in self.node_resources}
        nodes = ray._private.state.available_resources_per_node()
        problem = placement_problem(pools, pins, nodes, gpu=gpu, cpus_per_bundle=self.max_colocate_count)
        if problem:
            raise ValueError(problem)

"""TransferQueue storage hosted in its controller's process: storage backend ``ControllerHosted``.

verl's v1 trainer always starts TransferQueue: a controller and ``SimpleStorage`` units, each a Ray actor and so a
process of its own (~270 MiB each on CPU, torch imported). This backend runs TransferQueue's own
``SimpleStorageUnit`` (its class, its ZMQ protocol, its settings under ``backend.SimpleStorage``) inside the
controller's process, started there through Ray's ``__ray_call__``, and clients reach it with TransferQueue's own
``AsyncSimpleStorageManager``, registered under this name too. Both registrations go through TransferQueue's
registries (``StorageBootstrapProvider``, ``StorageManagerFactory``) in every process that imports verl
(:mod:`mgrpo_verl.plugin`). One process fewer: the CPU default (``mgrpo_base.yaml``); on accelerators verl's
layout stays, its units spread over the nodes.

What differs from ``SimpleStorage``: one unit, in the controller's process (its Ray CPU and its lifetime; it dies
with the controller, which ``tq.close()`` kills: TransferQueue's warning that it cannot close this backend is
dropped, :class:`_ClosedWithController`); no SSD offload (its allocator setting is
per process), no Prometheus exporter for the unit.
"""

from __future__ import annotations

import logging
from typing import Any

BACKEND = "ControllerHosted"

#: the name TransferQueue gives its first storage unit; clients key their routing by it
UNIT_NAME = "TransferQueueStorageUnit#0"

#: in the controller's process: the units hosted there (a unit stops when it is garbage-collected)
_HOSTED: list[Any] = []


class _ClosedWithController:
    """Drops ``tq.close()``'s warning that it cannot close the storage of backend ``ControllerHosted``: the unit lives
    in the controller's process, which ``tq.close()`` kills right after; any other record passes."""

    message = f"close for _TQ_STORAGE with key {BACKEND} is not supported for now."

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


def _host_unit(controller: Any, settings: dict[str, Any]) -> Any:
    """Run in the controller's process (``__ray_call__`` passes the actor first): start one storage unit there and
    return its ZMQ server information."""
    from transfer_queue.storage.simple_storage import SimpleStorageUnit

    unit = SimpleStorageUnit.__ray_actor_class__(config=settings)
    _HOSTED.append(unit)
    return unit.get_zmq_server_info()


def start_hosted_storage(conf: Any) -> dict[str, Any]:
    """TransferQueue's bootstrap of backend ``ControllerHosted`` (called by ``tq.init`` after it started the
    controller): one ``SimpleStorageUnit`` with the settings of ``backend.SimpleStorage``, in the controller's
    process; writes its address into ``backend.ControllerHosted.zmq_info`` as the SimpleStorage bootstrap does."""
    from uuid import uuid4

    import ray

    settings = dict(conf.backend.SimpleStorage)
    units = settings.get("num_data_storage_units", 1)
    if units != 1:
        raise ValueError(
            f"transfer_queue.backend.SimpleStorage.num_data_storage_units={units}: storage backend {BACKEND} hosts "
            "one unit, in the controller's process; set it to 1 or choose storage_backend=SimpleStorage"
        )
    if (settings.get("ssd_offload") or {}).get("enabled", False):
        raise ValueError(
            f"transfer_queue.backend.SimpleStorage.ssd_offload.enabled=true: storage backend {BACKEND} has no SSD "
            "offload (it sets the allocator of a process of its own); choose storage_backend=SimpleStorage"
        )
    settings["_run_id"] = uuid4().hex  # as TransferQueue's own bootstrap
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    info = ray.get(controller.__ray_call__.remote(_host_unit, settings))
    conf.backend[BACKEND].zmq_info = {UNIT_NAME: info}
    interface = logging.getLogger("transfer_queue.interface")
    if not any(isinstance(f, _ClosedWithController) for f in interface.filters):
        interface.addFilter(_ClosedWithController())
    return {UNIT_NAME: controller}


def register() -> None:
    """Register the backend with TransferQueue's two registries when their modules are imported (now if they are)."""
    from mgrpo_verl.platform._import_hooks import when_imported

    when_imported("transfer_queue.storage.bootstrap.provider",
                  lambda m: m.StorageBootstrapProvider.register_provider(BACKEND)(start_hosted_storage))
    when_imported("transfer_queue.storage.managers.simple_storage_manager",
                  lambda m: m.StorageManagerFactory.register(BACKEND)(m.AsyncSimpleStorageManager))

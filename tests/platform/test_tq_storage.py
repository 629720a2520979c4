"""Storage backend ``ControllerHosted`` (mgrpo_verl/trainer/tq_storage.py): TransferQueue's own storage unit in the
controller's process, one Ray process fewer than ``SimpleStorage`` with one unit, the same data out as in."""

from __future__ import annotations

import inspect
import logging

import pytest
from omegaconf import OmegaConf

from mgrpo_verl.trainer.tq_storage import BACKEND, _ClosedWithController, start_hosted_storage

# a fresh interpreter: a private Ray, TransferQueue started as verl's TaskRunner starts it (tq.init with the run's
# transfer_queue section), rows written here and read back in a Ray task (another process, as verl's workers)
SESSION = """
import json, logging
import psutil, ray, torch
from omegaconf import OmegaConf
from tensordict import TensorDict
import verl  # loads our plugin, which registers the backend, as in every process of a run
import transfer_queue as tq
from mgrpo_verl.platform import ray_cpu_session

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("transfer_queue").addHandler(Keep())

conf = OmegaConf.create({"backend": {"storage_backend": "%(backend)s", "SimpleStorage": {"num_data_storage_units": 1},
                                      "ControllerHosted": {"zmq_info": None}}})
info = {}
with ray_cpu_session(num_cpus=4):
    tq.init(conf)
    kids = psutil.Process().children(recursive=True)
    info["actors"] = sorted(p.cmdline()[0] for p in kids if p.cmdline() and p.cmdline()[0].startswith("ray::"))
    rows = TensorDict({"x": torch.tensor([[1, 2], [3, 4], [5, 6]])}, batch_size=3)
    tq.kv_batch_put(keys=["a", "b", "c"], partition_id="train", fields=rows)

    @ray.remote
    def read():
        import verl  # noqa: F401  (the plugin, as in a worker)
        import transfer_queue as tq
        tq.init()
        return [t.tolist() for t in tq.kv_batch_get(keys=["c", "a"], partition_id="train")["x"].unbind()]

    info["read"] = ray.get(read.remote())
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    info["controller_imports_verl"] = ray.get(controller.__ray_call__.remote(
        lambda _: __import__("sys").modules.get("verl") is not None))
    tq.close()
info["warnings"] = [w for w in warnings if "close" in w]
print(json.dumps(info))
"""


def test_rows_go_through_the_unit_in_the_controllers_process(python_runner):
    """The same rows come back from another process, as with ``SimpleStorage``, and the run has no
    ``SimpleStorageUnit`` actor: its one unit runs in the controller's process (which imports no verl: it stays
    TransferQueue's process); ``tq.close()`` says nothing about a backend it cannot close."""
    hosted = python_runner(SESSION % {"backend": BACKEND}, timeout=300)
    assert hosted["read"] == [[5, 6], [1, 2]]
    assert hosted["actors"].count("ray::TransferQueueController") == 1
    assert not [a for a in hosted["actors"] if "StorageUnit" in a], hosted["actors"]
    assert hosted["controller_imports_verl"] is False
    assert hosted["warnings"] == []


def test_the_control_simple_storage_has_a_process_of_its_own(python_runner):
    """The control for the test above: the same session on TransferQueue's ``SimpleStorage`` reads the same rows and
    starts a ``SimpleStorageUnit`` actor, so the count above can see a unit process when there is one."""
    simple = python_runner(SESSION % {"backend": "SimpleStorage"}, timeout=300)
    assert simple["read"] == [[5, 6], [1, 2]]
    assert [a for a in simple["actors"] if "SimpleStorageUnit" in a], simple["actors"]


@pytest.mark.parametrize(
    ("settings", "key"),
    [({"num_data_storage_units": 2}, "num_data_storage_units=2"),
     ({"num_data_storage_units": 1, "ssd_offload": {"enabled": True}}, "ssd_offload.enabled=true")],
)
def test_settings_it_cannot_honour_are_refused_by_name(settings, key):
    """Refused before any Ray call (no Ray runs here), naming the key and the way out."""
    conf = OmegaConf.create({"backend": {"storage_backend": BACKEND, "SimpleStorage": settings, BACKEND: {}}})
    with pytest.raises(ValueError, match=key) as caught:
        start_hosted_storage(conf)
    assert "storage_backend=SimpleStorage" in str(caught.value)


def test_the_close_warning_filter_drops_that_warning_only():
    keep = _ClosedWithController()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("transfer_queue.interface", logging.WARNING, __file__, 1, message, None, None)

    assert not keep.filter(record(f"close for _TQ_STORAGE with key {BACKEND} is not supported for now."))
    assert keep.filter(record("close for _TQ_STORAGE with key Yuanrong is not supported for now."))
    assert keep.filter(record("Failed to gracefully shut down SimpleStorage units: boom"))


def test_transfer_queue_still_writes_the_warning_the_filter_drops():
    """Fails when TransferQueue rewords ``close()``'s warning: the filter would then let the new wording through, or
    TransferQueue learnt to close other backends and the filter can go."""
    import transfer_queue.interface as interface

    source = inspect.getsource(interface.close)
    assert 'logger.warning(f"close for _TQ_STORAGE with key {key} is not supported for now.")' in source
    assert "ray.kill(_TQ_CONTROLLER)" in source  # the hosted unit goes with its process

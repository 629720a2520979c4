"""recipes/gpu_carry.sh pins the wheels it carries to the GPU machine by hand (the image already has torch,
transformers and the rest, so no resolution of the whole set is wanted). This keeps those pins inside
pyproject.toml's own requirements, so a bump there cannot leave the carry installing a version we no
longer support."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def test_carried_pins_satisfy_pyproject():
    requirements = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    block = re.search(r"^PACKAGES=\((.*?)\)", (ROOT / "recipes" / "gpu_carry.sh").read_text(), re.S | re.M).group(1)
    pins = {canonicalize_name(name): version for name, version in (p.split("==") for p in block.split())}
    assert len(pins) > 20 and pins["verl"]  # the block was found and parsed
    checked = []
    for req in requirements:
        name = canonicalize_name(req.name)
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(req.specifier))
            checked.append(name)
    # verl, hydra, omegaconf, tensordict, the trainer's undeclared imports and BM25 are all carried
    assert {"verl", "hydra-core", "omegaconf", "tensordict", "transferqueue", "rank-bm25"} <= set(checked), checked

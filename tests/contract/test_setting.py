"""``mgrpo_verl.config.setting``: the one "value at a dotted key, with a default" of the package, over the three
kinds of config it meets (an OmegaConf config, a plain mapping, verl's typed dataclass configs)."""

from dataclasses import dataclass, field

from omegaconf import OmegaConf

from mgrpo_verl.config import setting


@dataclass
class _Turns:
    format: str = "hermes"
    max_user_turns: int | None = None


@dataclass
class _Rollout:
    n: int = 4
    multi_turn: _Turns = field(default_factory=_Turns)


def test_setting_reads_each_kind_of_config_level_by_level():
    cfg = OmegaConf.create({"a": {"b": 3, "c": None, "d": "???", "e": "${a.b}", "s": {"x": 1}}})
    assert setting(cfg, "a.b") == 3
    assert setting(cfg, "a.e") == 3  # an interpolation, resolved
    assert setting(cfg, "a.s") == {"x": 1} and type(setting(cfg, "a.s")) is dict  # a section: a plain container
    # absent, null and ??? all give the default
    assert setting(cfg, "a.nope", 7) == 7 and setting(cfg, "a.c", 7) == 7 and setting(cfg, "a.d", 7) == 7
    assert setting(cfg, "z.y.x", "d") == "d" and setting(None, "a", "d") == "d"
    assert setting({"a": {"b": 2}}, "a.b") == 2 and setting({"a": {"b": 2}}, "a.c", 0) == 0
    rollout = _Rollout()
    assert setting(rollout, "n") == 4 and setting(rollout, "multi_turn.format") == "hermes"
    assert setting(rollout, "multi_turn.max_user_turns", 1) == 1 and setting(rollout, "nope", 0) == 0
    # an OmegaConf config wrapping a dataclass's values, in struct mode: an absent key is the default, not an error
    struct = OmegaConf.structured(_Rollout())
    assert setting(struct, "multi_turn.format") == "hermes" and setting(struct, "nope", 5) == 5

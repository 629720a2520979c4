"""The one loader of user hooks (``mgrpo_verl.user_code``): what it returns, and what each bad spec says."""

from __future__ import annotations

import dataclasses
import pickle
import sys

import pytest

from mgrpo_verl.user_code import load_function

KEY = "multi_agent.delegation.scorer"


def write(path, text):
    path.write_text(text)
    return path


def test_a_file_function_is_loaded_and_its_module_registered(tmp_path):
    # a dataclass defined in the user's file pickles only if its module is found in sys.modules
    f = write(tmp_path / "hooks.py", "import dataclasses\n@dataclasses.dataclass\nclass Row:\n    x: int\n"
                                     "def make(x):\n    return Row(x)\n")
    make = load_function(f"{f}:make", KEY)
    row = make(3)
    assert dataclasses.asdict(row) == {"x": 3}
    assert sys.modules[make.__module__].__file__ == str(f)
    assert pickle.loads(pickle.dumps(row)) == row


def test_an_edited_file_is_seen_on_the_next_load(tmp_path):
    f = write(tmp_path / "hooks.py", "def score(*a):\n    return 1.0\n")
    assert load_function(f"{f}:score", KEY)() == 1.0
    write(f, "def score(*a):\n    return 2.0\n")
    assert load_function(f"{f}:score", KEY)() == 2.0


def test_a_module_function_is_imported():
    from mgrpo_verl.envs import relay

    assert load_function("mgrpo_verl.envs.relay:default_scorer", KEY) is relay.default_scorer


@pytest.mark.parametrize("spec, says", [
    ("score", "must be 'module:function' or 'file.py:function'"),
    ("{tmp}/missing.py:score", "no such file {tmp}/missing.py"),
    ("{tmp}/broken.py:score", "loading {tmp}/broken.py failed: ZeroDivisionError"),
    ("{tmp}/ok.py:nope", "{tmp}/ok.py has no function 'nope'"),
    ("{tmp}/ok.py:VALUE", "{tmp}/ok.py has no function 'VALUE'"),
    ("no_such_module_xyz:score", "importing module 'no_such_module_xyz' failed: ModuleNotFoundError"),
    ("mgrpo_verl.envs.relay:nope", "module mgrpo_verl.envs.relay has no function 'nope'"),
])
def test_every_bad_spec_names_the_key_and_what_is_wrong(tmp_path, spec, says):
    write(tmp_path / "broken.py", "1 / 0\n")
    write(tmp_path / "ok.py", "VALUE = 3\n")
    spec, says = spec.format(tmp=tmp_path), says.format(tmp=tmp_path)
    with pytest.raises(ValueError) as err:
        load_function(spec, KEY)
    assert str(err.value).startswith(KEY) and says in str(err.value)


def test_a_file_that_fails_leaves_no_module_behind(tmp_path):
    f = write(tmp_path / "broken.py", "1 / 0\n")
    before = set(sys.modules)
    with pytest.raises(ValueError):
        load_function(f"{f}:score", KEY)
    assert set(sys.modules) == before

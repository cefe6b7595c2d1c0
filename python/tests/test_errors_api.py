"""Errors per status, poisoning, the documented API, typing files and the version."""

from __future__ import annotations

import importlib.metadata
import inspect
from pathlib import Path

import pytest

import kvblock
from conftest import make_manager, prompt


def test_every_status_has_its_exception():
    for status in kvblock.Status:
        if status == kvblock.Status.OK:
            continue
        name = "".join(part.title() for part in status.name.split("_")) + "Error"
        cls = getattr(kvblock, name)
        assert issubclass(cls, kvblock.Error) and issubclass(cls, RuntimeError)
        assert cls.status == status


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: m.add_token(99, 1), kvblock.UnknownRequestError, "99"),
        (lambda m: m.remove_sequence(99), kvblock.UnknownRequestError, "99"),
        (lambda m: (m.add_sequence(1, prompt(4)), m.add_sequence(1, prompt(4))), kvblock.DuplicateRequestError, "1"),
        (lambda m: m.add_sequence(1, prompt(4), input_length=8), kvblock.TooFewTokensError, None),
        (lambda m: m.add_sequence(1, prompt(4), beam_width=4), kvblock.BeamWidthExceededError, None),
        (lambda m: m.add_sequence(1, prompt(300)), kvblock.SequenceTooLongError, None),
        (lambda m: m.add_sequence(1, prompt(200)), kvblock.OutOfBlocksError, None),
        (lambda m: m.get_block_info(256, 10_000), kvblock.InvalidArgumentError, None),
        (lambda m: m.advance_time(5), kvblock.Error, None),
    ],
    ids=["unknown", "unknown-remove", "duplicate", "too-few", "beam", "too-long", "out-of-blocks", "bad-id",
         "no-manual-clock"],
)
def test_statuses_raise_with_the_library_message(call, error, message):
    with make_manager() as m:
        with pytest.raises(error, match=message) as info:
            call(m)
        assert str(info.value)  # the library's message
        assert isinstance(info.value.status, kvblock.Status)
        m.check_invariants()  # a failed call changes nothing


def test_invalid_config_raises():
    with pytest.raises(kvblock.InvalidConfigError):
        kvblock.KVCacheManager(kvblock.ManagerConfig([], max_sequence_length=64))
    with pytest.raises(ValueError):
        kvblock.KVCacheManager(kvblock.ManagerConfig([kvblock.WindowConfig(64, 0)], max_sequence_length=64))


def test_a_poisoned_manager_raises_on_every_call():
    m = make_manager()
    m.add_sequence(1, prompt(9))
    with pytest.raises(kvblock.InternalError):
        m._debug_trigger_panic()
    for call in (m.get_num_free_blocks, lambda: m.add_token(1, 2), m.get_latest_events, m.check_invariants):
        with pytest.raises(kvblock.PoisonedError):
            call()
    m.close()  # destroying still works


def test_closed_manager_raises_destroyed():
    with make_manager() as m:
        pass
    with pytest.raises(kvblock.DestroyedError):
        m.add_sequence(1, prompt(4))
    with pytest.raises(kvblock.DestroyedError):
        m.close()


def test_every_public_method_is_documented():
    undocumented = []
    for cls_name in kvblock.__all__:
        obj = getattr(kvblock, cls_name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for name, member in vars(obj).items():
            if name.startswith("__"):
                continue
            doc = getattr(member, "__doc__", None)
            if not doc or not doc.strip():
                undocumented.append(f"{cls_name}.{name}")
    help_text = kvblock.KVCacheManager.__doc__
    assert "GIL" in help_text
    assert not [u for u in undocumented if u.startswith("KVCacheManager.")], undocumented


def test_stubs_and_py_typed_are_installed():
    package = Path(kvblock.__file__).parent
    assert (package / "py.typed").is_file()
    stub = (package / "_kvblock.pyi").read_text()
    assert "class KVCacheManager" in stub and "def add_sequence" in stub
    assert "def get_block_offsets_of_batch" in stub


def test_version_matches_the_library_and_the_distribution():
    assert kvblock.__version__ == "{}.{}.{}".format(*kvblock.version())
    assert kvblock.__version__ == importlib.metadata.version("kvblock")

"""One patcher for every check: exact restoration of own and inherited attributes, last patch undone first."""
import types

from torchlint.sanitizer.patching import Patch, Patcher


class Base:
    def method(self):
        return "base"

    @staticmethod
    def make():
        return "made"


class Child(Base):
    pass


def test_an_inherited_attribute_is_deleted_again_not_copied_onto_the_subclass():
    patcher = Patcher()
    patcher.wrap(Child, "method", lambda original: lambda self: "wrapped " + original(self))
    assert Child().method() == "wrapped base" and "method" in vars(Child)
    patcher.restore_all()
    assert "method" not in vars(Child) and Child().method() == "base"


def test_an_own_staticmethod_comes_back_as_the_same_descriptor():
    descriptor = vars(Base)["make"]
    patcher = Patcher()
    patcher.replace(Base, "make", staticmethod(lambda: "replaced"))
    assert Base.make() == "replaced"
    patcher.restore_all()
    assert vars(Base)["make"] is descriptor and Base.make() == "made"


def test_two_checks_wrapping_one_function_unwind_in_reverse_order():
    module = types.SimpleNamespace(synchronize=lambda: "sync")
    original = module.synchronize
    first, second = Patcher(), Patcher()
    first.wrap(module, "synchronize", lambda f: lambda: "first(" + f() + ")")
    second.wrap(module, "synchronize", lambda f: lambda: "second(" + f() + ")")
    assert module.synchronize() == "second(first(sync))"
    second.restore_all()
    assert module.synchronize() == "first(sync)"
    first.restore_all()
    assert module.synchronize is original


def test_warning_hooks_in_place_are_counted_per_text():
    from torchlint.sanitizer.patching import WarningHook

    first, second = WarningHook("some text", lambda: True), WarningHook("some text", lambda: True)
    assert WarningHook.listening("some text") == 0
    first.install(); second.install()
    assert WarningHook.listening("some text") == 2 and WarningHook.listening("other text") == 0
    second.remove(); second.remove()  # removing twice counts once
    first.remove()
    assert WarningHook.listening("some text") == 0


def test_a_patch_changes_nothing_until_applied():
    module = types.SimpleNamespace(value=1)
    patch = Patch(module, "value", lambda current: current + 1)
    assert module.value == 1 and patch.replacement == 2
    patch.apply()
    assert module.value == 2
    patch.restore()
    assert module.value == 1

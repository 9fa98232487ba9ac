"""User-frame attribution: which files are user code, and which frame is the site."""
import os
import sys
import sysconfig

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer import frames  # noqa: E402
from san_sync_helpers import install_fake_library, line_of, write_distribution, write_user_module  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_frames():
    frames.reset()
    yield
    frames.reset()


def test_library_stdlib_torchlint_and_pseudo_files_are_not_user_code():
    assert not frames.is_user_file(torch.__file__)
    assert not frames.is_user_file(os.__file__)
    assert not frames.is_user_file(frames.__file__)
    assert not frames.is_user_file(pytest.__file__)
    assert not frames.is_user_file("<string>")
    assert not frames.is_user_file("<frozen importlib._bootstrap>")


def test_files_under_a_root_and_elsewhere_are_user_code(tmp_path):
    frames.add_user_root(str(tmp_path))
    assert frames.is_user_file(str(tmp_path / "train.py"))
    assert frames.is_user_file("/some/other/place/script.py")
    assert frames.origin_of(str(tmp_path / "train.py")) == frames.USER


def test_installed_package_under_test_stays_user_code(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "src" / "mymodel").mkdir(parents=True)
    (project / "src" / "mymodel" / "__init__.py").write_text("")
    installed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name in ("mymodel", "numpy", "torch"):
        write_distribution(installed, name, "")
    monkeypatch.syspath_prepend(str(installed))
    assert not frames.is_user_file(str(installed / "mymodel" / "layers.py"))
    frames.add_user_root(str(project))
    assert frames.is_user_file(str(installed / "mymodel" / "layers.py"))
    assert not frames.is_user_file(str(installed / "numpy" / "core.py"))
    assert not frames.is_user_file(str(installed / "torch" / "nn" / "modules" / "linear.py"))


def test_an_installed_folder_inside_the_project_is_not_user_code(tmp_path, monkeypatch):
    # A venv or a `pip install --target deps/` inside the project: the metadata says installed.
    frames.add_user_root(str(tmp_path))
    for folder in (tmp_path / ".venv" / "lib" / "python3.11" / "site-packages", tmp_path / "deps"):
        write_distribution(folder, "requests", "")
        monkeypatch.syspath_prepend(str(folder))
        assert frames.origin_of(str(folder / "requests" / "api.py")) == frames.LIBRARY
        frames.reset()
        frames.add_user_root(str(tmp_path))
    (tmp_path / "src").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "src"))  # a src layout on the path is the user's
    assert frames.is_user_file(str(tmp_path / "src" / "mypkg" / "model.py"))


def test_no_folder_name_decides(tmp_path, monkeypatch):
    # A project folder named site-packages stays the user's; the same name with metadata is installed.
    project = tmp_path / "project"
    (project / "site-packages").mkdir(parents=True)
    frames.add_user_root(str(project))
    monkeypatch.syspath_prepend(str(project / "site-packages"))
    assert frames.origin_of(str(project / "site-packages" / "mine.py")) == frames.USER
    write_distribution(project / "site-packages", "theirs", "")
    frames.reset()
    frames.add_user_root(str(project))
    assert frames.origin_of(str(project / "site-packages" / "theirs" / "api.py")) == frames.LIBRARY
    assert frames.origin_of(str(project / "site-packages" / "mine.py")) == frames.USER


def test_torch_and_pytest_are_libraries_wherever_they_come_from(tmp_path, monkeypatch):
    target = tmp_path / "project" / "target"
    (target / "_pytest").mkdir(parents=True)
    frames.add_user_root(str(tmp_path / "project"))
    monkeypatch.syspath_prepend(str(target))
    assert frames.origin_of(str(target / "_pytest" / "python.py")) == frames.LIBRARY


def test_a_registered_test_module_is_user_code_wherever_it_lives(tmp_path, monkeypatch):
    installed = write_distribution(tmp_path / "deps", "suite", "")
    monkeypatch.syspath_prepend(str(installed))
    path = str(installed / "suite" / "test_model.py")
    assert frames.origin_of(path) == frames.LIBRARY
    frames.add_user_file(path)
    assert frames.origin_of(path) == frames.USER


def test_short_path_is_the_import_path():
    assert frames.short_path(torch.__file__) == os.path.join("torch", "__init__.py")
    assert frames.short_path("/not/on/the/path.py") == "/not/on/the/path.py"


def test_add_user_package_counts_an_installed_package():
    path = os.path.join(sysconfig.get_paths()["purelib"], "somepkg", "mod.py")
    assert not frames.is_user_file(path)
    frames.add_user_package("somepkg.sub")
    assert frames.is_user_file(path)


def test_user_stack_skips_library_frames(tmp_path):
    lib = install_fake_library(tmp_path)
    model = write_user_module(tmp_path, "model_a", """
        import fakecuda
        from torchlint.sanitizer.frames import user_stack

        def forward():
            return fakecuda.call(user_stack)  # FORWARD
    """)
    stack = model.forward()
    assert stack[0].file == model.__file__
    assert stack[0].line == line_of(model.__file__, "# FORWARD")
    assert stack[0].function == "forward"
    assert all(frames.is_user_file(f.file) for f in stack)
    assert stack[1].file == __file__  # this test called forward()
    assert not any(f.file == lib.__file__ for f in stack)


def test_limit_and_innermost_first(tmp_path):
    model = write_user_module(tmp_path, "model_b", """
        from torchlint.sanitizer.frames import user_stack

        def a():
            return b()

        def b():
            return user_stack(limit=2)
    """)
    stack = model.a()
    assert [f.function for f in stack] == ["b", "a"]


def test_test_frames_are_skipped_when_code_under_test_is_on_the_stack(tmp_path):
    model = write_user_module(tmp_path, "trainer_c", """
        def fit(loss_fn):
            return loss_fn()  # FIT
    """)
    from torchlint.sanitizer.frames import user_stack

    def loss_fn():
        return user_stack()  # a callback written in the test

    stack = model.fit(loss_fn)
    assert stack[0].file == model.__file__ and stack[0].line == line_of(model.__file__, "# FIT")
    assert stack[1].file == __file__  # the test stays in the stack, outside the site


def test_a_sync_written_in_a_test_is_attributed_to_the_test():
    stack = frames.user_stack(); here = sys._getframe().f_lineno
    assert stack[0].file == __file__ and stack[0].line == here


def test_raw_user_stack_reports_library_frame_and_internal(tmp_path):
    lib = install_fake_library(tmp_path, "fakecuda_raw")
    user, library, internal = lib.call(frames.raw_user_stack)
    assert library is not None and library[0] == lib.__file__ and library[2] == "call"
    assert user[0][0] == __file__
    assert internal is False


def test_test_file_patterns_follow_pytest_config():
    assert frames.is_test_file("/x/test_model.py") and frames.is_test_file("/x/model_test.py")
    assert frames.is_test_file("/x/conftest.py") and not frames.is_test_file("/x/model.py")
    frames.set_test_file_patterns(["check_*.py"])
    assert frames.is_test_file("/x/check_model.py") and not frames.is_test_file("/x/test_model.py")


def test_a_captured_stack_symbolized_later_selects_the_same_frames(tmp_path):
    # The race check captures stacks with gather_traceback and symbolizes only
    # the ones a report reads: the selection must match the live walk's.
    model = write_user_module(tmp_path, "trainer_d", """
        def fit(loss_fn):
            return loss_fn()  # FIT
    """)
    profiler = torch._C._profiler

    def both():
        live = frames.raw_user_stack(limit=4)[0]
        captured = profiler.gather_traceback(True, False, False)
        return live, captured

    live, captured = model.fit(both)
    entries = [(e["filename"], e["line"], e["name"]) for e in profiler.symbolize_tracebacks([captured])[0]]
    assert frames.user_frames_of(entries, limit=4) == live
    assert live[0][0] == model.__file__  # the code under test, as in the live walk


def test_a_lazy_race_site_compares_and_hashes_as_its_frames():
    from torchlint.sanitizer.races import ops as race_ops

    # start() binds these where torch has them; bind them here without a session.
    race_ops.bind_tracebacks(torch)
    site = race_ops.capture_site(); here = sys._getframe().f_lineno
    assert isinstance(site, race_ops.Site)
    assert site[0] == (__file__, here, "test_a_lazy_race_site_compares_and_hashes_as_its_frames")
    assert site == tuple(site) and hash(site) == hash(tuple(site))
    assert {site: 1}[tuple(site)] == 1


def _both_walks():
    """The short walk and the full walk, taken from the same caller's frame."""
    top = frames.sync_site_top(skip=1)
    user, library, internal, callee = frames.sync_site_stack(skip=1)
    return top, (user, library, internal, callee)


def _agree(top, full):
    (site, library_name, internal, callee), (user, library, full_internal, full_callee) = top, full
    assert site == (user[0][:2] if user else None)
    assert library_name == (library[2] if library else None)
    assert internal == full_internal and callee is full_callee


def test_the_short_walk_finds_what_the_full_walk_finds(tmp_path):
    # A repeated sync takes frames.sync_site_top; a new site takes sync_site_stack:
    # both must name the same site, library frame, callee and internal flag.
    lib = install_fake_library(tmp_path, "fakecuda_top")
    model = write_user_module(tmp_path, "trainer_top", """
        def fit(callback, lib):
            return lib.call(callback)  # FIT
    """)
    _agree(*_both_walks())  # a test's own line
    _agree(*lib.call(_both_walks))  # through a library frame
    top, full = model.fit(lambda: lib.call(_both_walks), lib)  # test -> user code -> library -> test callback
    _agree(top, full)
    assert top[0] == (model.__file__, line_of(model.__file__, "# FIT"))
    generator = (lib.call(_both_walks) for _ in range(1))  # a generator callee is no callee
    _agree(*next(generator))
    namespace = {}
    exec(compile("def inner(walk):\n    return walk()\n", frames.__file__, "exec"), namespace)
    top, full = namespace["inner"](_both_walks)  # torchlint's own frame below the user's
    _agree(top, full)


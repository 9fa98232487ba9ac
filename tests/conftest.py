"""Set-up shared by every test folder."""
import pytest


@pytest.fixture(autouse=True)
def _no_cache_folder_from_the_environment(monkeypatch):
    """A developer's TORCHLINT_CACHE_DIR must not change what a test sees: the
    cache tests name their own folder, the rest get the default place (their
    temporary project). Subprocesses inherit the cleared environment."""
    monkeypatch.delenv("TORCHLINT_CACHE_DIR", raising=False)

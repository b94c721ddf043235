"""mvsink's Arrow pool: the system allocator, unless the user chose one (pyarrow's setting)."""

import pyarrow as pa
import pytest

from mvsink.arrow_memory import POOL_SETTING, use_system_allocator


@pytest.fixture
def mimalloc_default(monkeypatch):
    """pyarrow's default pool set to mimalloc for the test, then put back as it was."""
    was = pa.default_memory_pool()
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    monkeypatch.delenv(POOL_SETTING, raising=False)
    yield
    pa.set_memory_pool(was)


def test_the_system_allocator_becomes_the_default_pool(mimalloc_default):
    use_system_allocator()
    assert pa.default_memory_pool().backend_name == "system"
    assert pa.array([1, 2, 3]).sum().as_py() == 6


def test_a_pool_the_user_chose_is_kept(mimalloc_default, monkeypatch):
    monkeypatch.setenv(POOL_SETTING, "mimalloc")
    use_system_allocator()
    assert pa.default_memory_pool().backend_name == "mimalloc"

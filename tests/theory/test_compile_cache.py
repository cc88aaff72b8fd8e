"""torch.compile's cache folder (theory/kernels/compile_cache.py): gradstat's own private folder where the user names
none, and a folder another user can write (or owns, or a link) refused: the fused kernels then stay eager, with one
warning, and nothing is compiled."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gradstat.theory.kernels import compile_cache, fused, policy
from gradstat.theory.kernels.compile_cache import ENV_INDUCTOR, UnsafeCacheError, check_private, ensure_compile_cache

posix = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX users here")


@pytest.fixture
def unset(monkeypatch, tmp_path):
    """No folder named by the environment; gradstat's cache root in a fresh folder."""
    monkeypatch.delenv(ENV_INDUCTOR, raising=False)
    monkeypatch.setenv("GRADSTAT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@posix
def test_where_none_is_named_a_private_folder_of_gradstat_s_is_made_and_named(unset, monkeypatch):
    old = os.umask(0o002)  # a permissive umask (shared groups) must not loosen it
    try:
        path = ensure_compile_cache()
    finally:
        os.umask(old)
    assert path == unset / "torchinductor" and os.environ[ENV_INDUCTOR] == str(path)
    assert (path.stat().st_mode & 0o777, unset.stat().st_mode & 0o777) == (0o700, 0o700)
    assert path.stat().st_uid == os.getuid()
    assert ensure_compile_cache() == path  # a second call: the named folder, checked again


def test_the_default_root_is_the_user_s_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("GRADSTAT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_root() == tmp_path / "gradstat"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache.cache_root() == compile_cache.Path(os.path.expanduser("~")) / ".cache" / "gradstat"


@posix
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o722], ids=lambda m: f"{m:04o}")
def test_a_folder_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    """The user's own named folder included (e.g. a shared /tmp/torchinductor_<user> made 0775 under umask 002)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv(ENV_INDUCTOR, str(shared))
    with pytest.raises(UnsafeCacheError, match=f"can be written by other users \\(mode {mode & 0o7777:04o}\\)"):
        ensure_compile_cache()
    shared.chmod(0o755)
    assert ensure_compile_cache() == shared  # readable by others, writable by no one else: accepted


@posix
def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    try:
        os.chown(theirs, os.getuid() + 1, -1)
    except PermissionError:
        pytest.skip("only the superuser can give a folder to another user")
    with pytest.raises(UnsafeCacheError, match=f"belongs to user id {os.getuid() + 1}, not to this user"):
        check_private(theirs)


def test_a_link_or_a_file_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafeCacheError, match="not a folder"):
        check_private(link)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(ENV_INDUCTOR, str(tmp_path / "file"))
    with pytest.raises(UnsafeCacheError, match="cannot be created|not a folder"):
        ensure_compile_cache()


@posix
def test_an_unsafe_folder_keeps_every_fused_kernel_eager_with_one_warning(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(ENV_INDUCTOR, str(shared))
    policy.cache_problem.cache_clear()
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
    kernels = [fused.Fused(lambda x: x.abs().sum()), fused.Fused(lambda x: (x * x).sum())]
    x = torch.arange(-3.0, 4.0)
    try:
        with policy.forced("always"):
            with pytest.warns(RuntimeWarning, match="can be written by other users.*the fused kernels run eagerly"):
                assert not kernels[0].compiled_for(x) and kernels[0](x) == 12.0
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the second kernel, and later calls: no second warning
                assert kernels[1](x) == 28.0 and kernels[0](x) == 12.0
        assert not compiled and not any(shared.iterdir())
    finally:
        policy.cache_problem.cache_clear()


@posix
def test_a_safe_folder_lets_the_kernels_compile(unset, monkeypatch):
    policy.cache_problem.cache_clear()
    try:
        with policy.forced("always"):
            assert fused.Fused(lambda x: x.sum()).compiled_for(torch.ones(3))
        assert os.environ[ENV_INDUCTOR] == str(unset / "torchinductor")
    finally:
        policy.cache_problem.cache_clear()

"""Rendezvous URL parsing and field checks: every bad field fails at once, naming it.

No MPI and no store server here: every case raises before a store is made.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from hpcdist.rendezvous import register_rendezvous_handler, registered_schemes, rendezvous
from hpcdist.rendezvous.fields import query_to_dict
from hpcdist.rendezvous.ports import broken_mpi_reason

T = timedelta(seconds=5)


def first(url: str, rank: int = -1, world_size: int = -1):
    return next(rendezvous(url, rank, world_size, timeout=T))


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_builtin_schemes_registered():
    assert {"env", "tcp", "file", "mpi"} <= set(registered_schemes())


def test_import_does_no_mpi_work():
    code = "import sys, hpcdist.rendezvous; sys.exit('mpi4py.MPI' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


# --- registry --------------------------------------------------------------------------


def test_register_custom_handler_and_call_it():
    def handler(url, **kwargs):
        q = query_to_dict(url.split("?", 1)[1], scheme="unittestrdzv")
        yield "a store", int(q["rank"]), int(q["world_size"])

    register_rendezvous_handler("unittestrdzv", handler)
    assert first("unittestrdzv://x", rank=1, world_size=3) == ("a store", 1, 3)
    with pytest.raises(RuntimeError, match="already registered"):
        register_rendezvous_handler("unittestrdzv", handler)


@pytest.mark.parametrize("scheme", ["", "1abc", "a b", None, "env://"])
def test_register_bad_scheme(scheme):
    with pytest.raises(ValueError, match="scheme"):
        register_rendezvous_handler(scheme, lambda url: iter(()))


def test_register_handler_not_callable():
    with pytest.raises(TypeError, match="handler"):
        register_rendezvous_handler("unittestnotcallable", 42)


def test_unknown_scheme():
    with pytest.raises(ValueError, match=r"No rendezvous handler for nosuch://"):
        first("nosuch://host:1")


def test_url_without_scheme():
    with pytest.raises(ValueError, match="no scheme"):
        first("127.0.0.1:29500")


def test_rank_in_url_and_argument():
    with pytest.raises(ValueError, match="node-specific"):
        first("tcp://127.0.0.1:29500?rank=0&world_size=2", rank=0)


@pytest.mark.parametrize("kw", [{"rank": "0"}, {"world_size": 1.5}])
def test_rank_world_size_types(kw):
    with pytest.raises(RuntimeError, match="must be an integer"):
        rendezvous("env://", **kw)


def test_url_type():
    with pytest.raises(RuntimeError, match="must be a string"):
        rendezvous(42)  # type: ignore[arg-type]


# --- env:// ----------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_env_missing_variable(clean_env, missing):
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for k, v in env.items():
        if k != missing:
            clean_env.setenv(k, v)
    with pytest.raises(ValueError, match=f"environment variable {missing} expected"):
        first("env://")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "zero"}, "RANK must be an integer"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be an integer"),
        ({"WORLD_SIZE": "0"}, "world_size must be >= 1"),
        ({"WORLD_SIZE": "-3"}, "world_size must be >= 1"),
        ({"RANK": "2"}, r"rank must be in \[0, world_size\)"),
        ({"RANK": "-1"}, r"rank must be in \[0, world_size\)"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT must be an integer"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT must be a TCP port"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port"),
        ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR 'no-such-host.invalid' does not resolve"),
    ],
)
def test_env_malformed(clean_env, env, match):
    base = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for k, v in {**base, **env}.items():
        clean_env.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        first("env://")


def test_env_query_overrides_environment(clean_env):
    # rank=5 in the query beats RANK=0: checked (and refused) before any store is made
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        clean_env.setenv(k, v)
    with pytest.raises(ValueError, match="got 5"):
        first("env://?rank=5")


# --- tcp:// ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("tcp://127.0.0.1?rank=0&world_size=2", "port number missing"),
        ("tcp://127.0.0.1:port?rank=0&world_size=2", "port .* is not a number"),
        ("tcp://127.0.0.1:0?rank=0&world_size=2", "port must be a TCP port"),
        ("tcp://:29500?rank=0&world_size=2", "host missing"),
        ("tcp://127.0.0.1:29500?world_size=2", "rank parameter missing"),
        ("tcp://127.0.0.1:29500?rank=0", "world_size parameter missing"),
        ("tcp://127.0.0.1:29500?rank=0&world_size=0", "world_size must be >= 1"),
        ("tcp://127.0.0.1:29500?rank=3&world_size=2", r"rank must be in \[0, world_size\)"),
        ("tcp://127.0.0.1:29500?rank=x&world_size=2", "rank must be an integer"),
        ("tcp://127.0.0.1:29500?rank&world_size=2", "malformed URL query parameter 'rank'"),
        ("tcp://no-such-host.invalid:29500?rank=0&world_size=2", "host 'no-such-host.invalid' does not resolve"),
    ],
)
def test_tcp_malformed(url, match):
    with pytest.raises(ValueError, match=match):
        first(url)


def test_tcp_rank_from_arguments_checked():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        first("tcp://127.0.0.1:29500", rank=0, world_size=0)


# --- file:// ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("file://?rank=0&world_size=2", "path missing"),
        ("file:///tmp/x?world_size=2", "rank parameter missing"),
        ("file:///tmp/x?rank=0", "world_size parameter missing"),
        ("file:///tmp/x?rank=0&world_size=-1", "world_size must be >= 1"),
        ("file:///no/such/dir/x?rank=0&world_size=2", "does not exist"),
    ],
)
def test_file_malformed(url, match):
    with pytest.raises(ValueError, match=match):
        first(url)


def test_file_single_process(tmp_path):
    store, rank, world_size = first(f"file://{tmp_path}/store?rank=0&world_size=1")
    store.set("k", "v")
    assert (store.get("k"), rank, world_size) == (b"v", 0, 1)


# --- MPI version check ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "broken"),
    [
        ("MPICH Version:      5.0.0\nMPICH Release date: ...", True),
        ("MPICH Version:\t5.0.1rc1\n", True),
        ("MPICH Version:      4.3.2\nMPICH Release date: Mon Oct  6", False),
        ("MPICH Version:      5.1.0\n", False),
        ("Open MPI v5.0.3, package: Open MPI", False),
    ],
)
def test_broken_mpich_detected(version, broken):
    reason = broken_mpi_reason(version)
    assert (reason is not None) == broken
    if broken:
        assert "mpich>=4.3,<4.4" in reason and "launcher" in reason


# --- join_world argument types (checked before any MPI work) ---------------------------


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"init_method": 5}, TypeError, "init_method must be a URL string"),
        ({"rank": "0"}, TypeError, "rank must be an int"),
        ({"world_size": True}, TypeError, "world_size must be an int"),
        ({"timeout": 30}, TypeError, "timeout must be a datetime.timedelta, got int"),
        ({"timeout": timedelta(0)}, ValueError, "timeout must be a positive timedelta"),
    ],
)
def test_join_world_argument_types(kw, error, match):
    from hpcdist.rendezvous import join_world

    args = {"init_method": None, "store": None, "rank": -1, "world_size": -1, "timeout": T, **kw}
    init_method = args.pop("init_method")
    with pytest.raises(error, match=match):
        join_world(init_method, **args)


@pytest.mark.parametrize("kw", [{"rank": "0"}, {"world_size": 1.5}, {"rank": True}])
def test_rank_world_size_types_are_checked_alike_everywhere(kw):
    """rendezvous(), join_world() and init_process_group() share one check: the same error, the same words."""
    import hpcdist
    from hpcdist.rendezvous import join_world

    name = next(iter(kw))
    calls = [
        lambda: rendezvous("env://", **kw),
        lambda: join_world(None, store=None, timeout=T, **{"rank": -1, "world_size": -1, **kw}),
        lambda: hpcdist.init_process_group("mpi", **kw),
    ]
    messages = set()
    for call in calls:
        with pytest.raises(TypeError) as info:
            call()
        assert isinstance(info.value, RuntimeError)  # what torch's rendezvous() raises
        messages.add(str(info.value))
    assert messages == {f"{name} must be an integer, got {type(kw[name]).__name__} ({kw[name]!r})"}

"""LocalEnvironment: defaults, values from the environment, the free port, validate_settings."""

from __future__ import annotations

import socket

import pytest

from torchfleet.environments import LocalEnvironment, find_free_port
from torchfleet.errors import ConfigurationError


def test_defaults(env):
    e = LocalEnvironment()
    assert LocalEnvironment.detect()
    assert not e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (1, 0, 0, 0)
    assert e.main_address == "127.0.0.1"


def test_world_size_and_rank_are_set_by_the_strategy(env):
    e = LocalEnvironment()
    e.set_world_size(4)
    e.set_global_rank(3)
    assert (e.world_size(), e.global_rank()) == (4, 3)


def test_stray_world_size_in_the_main_process_is_ignored(env):
    env(WORLD_SIZE=8, RANK=5)
    e = LocalEnvironment()
    assert (e.world_size(), e.global_rank()) == (1, 0)


def test_child_started_for_us(env):
    env(LOCAL_RANK=1, NODE_RANK=2, MASTER_ADDR="10.0.0.5", MASTER_PORT=29511, WORLD_SIZE=6, RANK=5)
    e = LocalEnvironment()
    assert e.creates_processes_externally
    assert (e.local_rank(), e.node_rank(), e.world_size(), e.global_rank()) == (1, 2, 6, 5)
    assert (e.main_address, e.main_port) == ("10.0.0.5", 29511)
    e.set_world_size(4)  # what the strategy sets wins
    e.set_global_rank(3)
    assert (e.world_size(), e.global_rank()) == (4, 3)


def test_free_port_is_bindable_and_stable(env):
    e = LocalEnvironment()
    port = e.main_port
    assert 0 < port < 65536
    assert all(e.main_port == port for _ in range(3))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # raises if it was not free


def test_master_port_wins_over_the_free_port(env):
    e = LocalEnvironment()
    chosen = e.main_port
    env(MASTER_PORT=chosen + 1 if chosen < 65535 else chosen - 1)
    assert e.main_port != chosen


def test_free_port_on_an_address_that_is_not_local(env):
    env(MASTER_ADDR="192.0.2.1")  # TEST-NET-1: never an address of this machine
    e = LocalEnvironment()
    port = e.main_port
    assert e.main_port == port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_localhost_address(env):
    env(MASTER_ADDR="localhost")
    assert LocalEnvironment().main_port > 0


def test_find_free_port_is_free():
    port = find_free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_validate_single_node(env):
    LocalEnvironment().validate_settings(2, 1)


def test_validate_multi_node_needs_address_and_port(env):
    with pytest.raises(ConfigurationError) as info:
        LocalEnvironment().validate_settings(2, 3)
    text = str(info.value)
    assert "num_nodes=3" in text and "MASTER_ADDR and MASTER_PORT" in text and "NODE_RANK=0..2" in text
    env(MASTER_ADDR="10.0.0.1")
    with pytest.raises(ConfigurationError, match="needs MASTER_PORT in the environment"):
        LocalEnvironment().validate_settings(2, 3)
    env(MASTER_PORT=29500, NODE_RANK=2)
    LocalEnvironment().validate_settings(2, 3)


def test_validate_node_rank_out_of_range(env):
    env(MASTER_ADDR="10.0.0.1", MASTER_PORT=29500, NODE_RANK=2)
    with pytest.raises(ConfigurationError, match=r"NODE_RANK=2 is outside the 2 node\(s\)"):
        LocalEnvironment().validate_settings(1, 2)


def test_validate_local_rank_out_of_range(env):
    env(LOCAL_RANK=2)
    with pytest.raises(ConfigurationError, match="LOCAL_RANK=2 is outside the 2 processes per node"):
        LocalEnvironment().validate_settings(2, 1)


def test_bad_integer_in_the_environment(env):
    env(LOCAL_RANK="one")
    with pytest.raises(ConfigurationError, match="LOCAL_RANK='one' should be an integer"):
        LocalEnvironment().local_rank()

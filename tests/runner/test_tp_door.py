"""Who may join a tensor-parallel group: the spawned group listens on loopback only (no
TCP store on every interface: its rendezvous is a file in a directory only this user can
read), and a worker unpickles only commands signed with the group's secret."""

from __future__ import annotations

import os
import pickle
import stat
import sys

import pytest
import torch

from minicb.parallel import tp_group, tp_messages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def listening_addresses(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net shows them) these processes listen on."""
    ours = set().union(*(_socket_inodes(p) for p in pids))
    found = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in ours:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1


@pytest.mark.slow  # spawns a two-rank group
def test_the_spawned_group_listens_on_loopback_only():
    group = tp_group.get_group(2, torch.device("cpu"))
    try:
        store_dir = group._store_dir
        assert store_dir and stat.S_IMODE(os.stat(store_dir).st_mode) == 0o700
        listening = listening_addresses([os.getpid(), *tp_group.worker_pids()])
        assert listening and set(listening) <= LOOPBACK, listening  # was "::" for the store
    finally:
        tp_group.shutdown_group()
    assert not os.path.exists(store_dir)


def test_a_command_is_unpickled_only_under_the_groups_secret():
    class Boom:
        def __reduce__(self):  # what a stranger's pickle would do when loaded
            return (pytest.fail, ("a stranger's pickle was loaded",))

    data = pickle.dumps(("step", 0, None))
    signed = tp_messages.sign(b"k" * 32, data) + data
    assert tp_messages.checked(signed, b"k" * 32) == data
    forged = pickle.dumps(Boom())
    for attempt in (tp_messages.sign(b"guess", forged) + forged, b"\0" * 32 + forged, forged):
        with pytest.raises(tp_messages.TensorParallelError, match="signature check"):
            tp_messages.checked(attempt, b"k" * 32)

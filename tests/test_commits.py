"""A host's commits on disk (hvdplus.elastic.commits): the newest one read back whole, written
over the older of two files, and never lost to a write that did not finish."""

import os
import pickle

import numpy as np
import pytest

from hvdplus.elastic.commits import HostCommits, host_folder


HEADER_BYTES = 24  # a commit file's header: its magic and its commit number


def snapshot(value):
    return {"weights": np.full(1000, value, dtype=np.float32), "step": int(value)}


def test_the_newest_commit_is_read_back_whole(tmp_path):
    commits = HostCommits(host_folder(str(tmp_path)), 0)
    assert commits.newest() == 0 and commits.read() is None
    for number in range(1, 6):
        commits.write_in_background(number, snapshot(number))
    commits.wait()
    number, values = commits.read()
    assert number == commits.newest() == 5
    np.testing.assert_array_equal(values["weights"], np.full(1000, 5, dtype=np.float32))
    # Two files take turns: the one before is still whole beside it.
    assert sorted(os.listdir(tmp_path / "commits")) == ["state-0.a.commit", "state-0.b.commit"]


def test_a_write_that_did_not_finish_leaves_the_commit_before(tmp_path):
    commits = HostCommits(host_folder(str(tmp_path)), 3)
    commits.write(1, snapshot(1))
    commits.write(2, snapshot(2))
    # A process killed inside its write leaves the file it wrote with its header cleared and
    # its values cut short: the other file, with commit 2, is what counts.
    older = min(commits.paths, key=lambda path: pickle.loads(open(path, "rb").read()[HEADER_BYTES:])["step"])
    with open(older, "r+b") as file:
        file.write(bytes(HEADER_BYTES))
        file.truncate(100)
    assert commits.newest() == 2
    assert commits.read()[1]["step"] == 2
    commits.write(3, snapshot(3))  # into the file cut short, not over commit 2
    assert commits.read()[0] == 3 and commits.newest() == 3


def test_a_commit_that_cannot_be_written_raises_at_the_next_wait(tmp_path):
    commits = HostCommits(host_folder(str(tmp_path)), 0)
    commits.write_in_background(1, {"value": lambda: None})  # a lambda cannot be pickled
    with pytest.raises(OSError, match="could not write a commit"):
        commits.wait()


def test_nodes_that_share_a_machine_keep_commits_apart(tmp_path, monkeypatch):
    # Ray's workers are nodes of their own to hvdplus (HVDPLUS_NODE_ID) on one machine: the
    # local rank 0 of each writes its commits, and two writers must not share files.
    folders = []
    for node in ["hvdplus-ray-1", "hvdplus/ray 2"]:
        monkeypatch.setenv("HVDPLUS_NODE_ID", node)
        folders.append(host_folder(str(tmp_path)))
    HostCommits(folders[0], 0).write(1, {"from": 0})
    HostCommits(folders[1], 0).write(1, {"from": 1})
    assert [HostCommits(folder, 0).read() for folder in folders] == [(1, {"from": 0}), (1, {"from": 1})]
    assert os.path.basename(folders[1]) == "node-hvdplus_ray_2"

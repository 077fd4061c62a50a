"""The ranks' messages to hvdplusrun, in lines of their output: taken out of the stream
whole, however the stream is cut into reads, and everything else passed on unchanged."""

import pytest

from hvdplus.common.launcher_messages import MARKER, MessageFilter, encode

RESTART = {"restart": "failure", "failed_ranks": [2], "failed_hosts": ["node-b"]}


def filtered(stream: bytes, read_size: int):
    messages = []
    messages_filter = MessageFilter(messages.append)
    out = b"".join(messages_filter.feed(stream[at:at + read_size]) for at in range(0, len(stream), read_size))
    return out + messages_filter.close(), messages


@pytest.mark.parametrize("read_size", [1, 2, 7, 4096])
@pytest.mark.parametrize("before, after, expected", [
    (b"step 1\n", b"step 2\n", b"step 1\nstep 2\n"),
    (b"[1,0]<stderr>: step 1\n[1,0]<stderr>: ", b"[1,0]<stderr>: done\n",
     b"[1,0]<stderr>: step 1\n[1,0]<stderr>: done\n"),  # Open MPI's tags
    (b"[2] loss 0.5\n[2] ", b"", b"[2] loss 0.5\n"),  # hvdplusrun's tags of MPICH's pieces
    (b"epoch 3 of 9 ", b"ok\n", b"epoch 3 of 9 ok\n"),  # a line the rank had not finished
    (b"", b"\r 10%\r 20%", b"\r 10%\r 20%"),
], ids=["plain", "open-mpi-tags", "mpich-tags", "unfinished-line", "progress-bar"])
def test_a_message_is_taken_out_and_the_rest_passed_on(read_size, before, after, expected):
    out, messages = filtered(before + encode(RESTART) + after, read_size)
    assert messages == [RESTART]
    assert out == expected


@pytest.mark.parametrize("read_size", [1, 3, 4096])
@pytest.mark.parametrize("text", [
    b"a record separator \x1e in data\n",
    MARKER + b"{not json\n",
    MARKER + b"[1, 2]\n",
    b"\x1e\x1e" + MARKER[1:5] + b"\n",
    b"ends with a separator \x1e",
], ids=["separator", "bad-json", "not-an-object", "marker-start", "at-the-end"])
def test_what_is_no_whole_message_passes_unchanged(read_size, text):
    out, messages = filtered(b"before\n" + text + b"after\n", read_size)
    assert messages == []
    assert out == b"before\n" + text + b"after\n"


def test_several_messages_arrive_in_order_between_lines():
    lost = {"lost_hosts": ["node-c"]}
    out, messages = filtered(b"x\n" + encode(lost) + b"y\n" + encode(RESTART) + b"z\n", 5)
    assert messages == [lost, RESTART]
    assert out == b"x\ny\nz\n"

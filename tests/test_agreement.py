"""The cross-rank agreement check, on hand-made requests (no MPI needed)."""

import pytest

from hvdplus.common.errors import TensorMismatchError
from hvdplus.common.reduce_ops import Max, Sum
from hvdplus.engine.protocol import Agreement, Collective, GroupLayout, Request
from hvdplus.engine.agreement import check_agreement, describe_by_rank, input_error


def allreduce_request(shape=(2,), op=Sum, name="g"):
    return Request(Collective.ALLREDUCE, name, Agreement(dtype="float32", shape=shape, reduce_op=op))


def test_agreeing_requests_pass():
    check_agreement([allreduce_request(), allreduce_request(), allreduce_request()])


def test_describe_groups_ranks_by_value():
    assert describe_by_rank([(1,), (2,), (1,)]) == "ranks 0, 2 had (1,), rank 1 had (2,)"
    assert describe_by_rank([Sum, Max]) == "rank 0 had Sum, rank 1 had Max"


def test_first_differing_field_is_reported():
    mismatch = r"Mismatched reduce ops for 'g' \(allreduce\): rank 0 had Sum, rank 1 had Max"
    with pytest.raises(TensorMismatchError, match=mismatch):
        check_agreement([allreduce_request(), allreduce_request(op=Max)])


def test_different_names_or_kinds():
    with pytest.raises(TensorMismatchError, match="rank 0 had allreduce 'a', rank 1 had allreduce 'b'"):
        check_agreement([allreduce_request(name="a"), allreduce_request(name="b")])


def test_input_errors_keep_their_type_and_name_every_failing_rank():
    requests = [
        allreduce_request(),
        input_error(Collective.ALLREDUCE, "g", TypeError("bad dtype")),
        input_error(Collective.ALLREDUCE, "g", ValueError("bad shape")),
    ]
    with pytest.raises(TypeError, match="rank 1: bad dtype; rank 2: bad shape"):
        check_agreement(requests)


def test_a_group_against_a_single_tensor_names_the_members():
    group = Request(Collective.ALLREDUCE, "g", Agreement(member_dtypes=("float32",), member_shapes=((2,),),
                                                         in_place=True, dtype="float32", shape=(2,), reduce_op=Sum))
    with pytest.raises(TensorMismatchError, match=r"Mismatched member dtypes for 'g' \(allreduce\): "
                                                  r"rank 0 had None, rank 1 had \('float32',\)"):
        check_agreement([allreduce_request(), group])


def test_a_mismatch_in_members_is_reported_before_the_packed_length():
    def group(shapes):
        return Request(Collective.ALLREDUCE, "g", Agreement(
            member_dtypes=("float32",) * len(shapes), member_shapes=shapes, dtype="float32",
            shape=(sum(s[0] for s in shapes),), reduce_op=Sum))

    with pytest.raises(TensorMismatchError, match=r"Mismatched member shapes .*rank 0 had \(\(2,\), \(3,\)\)"):
        check_agreement([group(((2,), (3,))), group(((3,), (3,)))])


def test_ranks_that_lay_a_group_out_differently_fail_the_check():
    def group(layout):
        return Request(Collective.ALLREDUCE, "g", Agreement(member_dtypes=("float32",), member_shapes=((2,),),
                                                            dtype="float32", shape=(2,), reduce_op=Sum, layout=layout))

    with pytest.raises(TensorMismatchError, match="Mismatched group layouts for 'g' \\(allreduce\\): "
                                                  "rank 0 had members, rank 1 had packed"):
        check_agreement([group(GroupLayout.MEMBERS), group(GroupLayout.PACKED)])

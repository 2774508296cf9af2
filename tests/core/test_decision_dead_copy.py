"""The guard's rule for a copy of a message its group gave up on, as a pure table (no database).

A sender that cannot address one consumer group (Kafka, RocketMQ 5.x) puts the sweeper's resend for group A
on the topic, labelled for A. Group B, which gave up on the message (``DEAD``, ``attempts >= max_attempts``)
and dead-lettered it once, answered every such copy ``gave_up``, and the adapter dead-lettered it again: one
more dead letter per resend for another group. A copy labelled for another group is now a settled duplicate;
an unlabelled copy (the producer's, a broker redelivery) and one labelled for B keep ``gave_up`` — and so
does the labelled copy whose own failure made B give up, delivered again (``fatal_record``: B's journal has
its ``DEAD_LETTER`` at that position): a crash between the give-up and the dead-letter copy lost it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reliable.guard.decision import OUTCOMES, Reason, Verdict, held_verdict, judge, verdict_reason
from reliable.types import ConsumeResult, LogOutcome, StubStatus

MAX = 3


@given(
    status=st.sampled_from(list(StubStatus)),
    attempts=st.integers(0, 2 * MAX),
    for_other_group=st.booleans(),
    fatal_record=st.booleans(),
)
def test_only_a_gave_up_row_tells_a_copy_for_another_group_apart(
    status: StubStatus, attempts: int, for_other_group: bool, fatal_record: bool
) -> None:
    v = judge(
        status, "h", False, "h", attempts, MAX, for_other_group=for_other_group, fatal_record=fatal_record
    )
    gave_up = status is StubStatus.DEAD and attempts >= MAX
    if gave_up:  # only a copy for another group that is not the fatal record is a settled duplicate
        assert v is (Verdict.DEAD_COPY if for_other_group and not fatal_record else Verdict.GAVE_UP)
    else:  # the label and the journal change nothing on any other row
        assert v is judge(status, "h", False, "h", attempts, MAX)


def test_the_fatal_copy_for_another_group_redelivered_is_dead_lettered_again() -> None:
    v = judge(StubStatus.DEAD, "h", False, "h", MAX, MAX, for_other_group=True, fatal_record=True)
    assert v is Verdict.GAVE_UP
    assert OUTCOMES[verdict_reason(v, "m", "h", "h")[0]][0] is ConsumeResult.DEAD_LETTER


def test_a_copy_for_another_group_is_acked_as_a_duplicate_never_dead_lettered_again() -> None:
    reason, detail, error = verdict_reason(Verdict.DEAD_COPY, "m", "h", "h")
    assert (reason, error) == (Reason.DUPLICATE_OF_DEAD, None)
    assert detail is not None and "another group" in detail
    assert OUTCOMES[reason] == (ConsumeResult.SUCCESS, LogOutcome.DUPLICATE, True)
    # another worker holding the lease does not make it wait: the row is settled
    assert held_verdict(Verdict.DEAD_COPY) is Verdict.DEAD_COPY


def test_any_other_copy_of_a_gave_up_row_is_still_dead_lettered() -> None:
    """Unlabelled (the producer's copy, a producer's retry, a broker redelivery of a record whose dead letter
    a crash may have kept from the broker) or labelled for this very group (a resend after a revive)."""
    v = judge(StubStatus.DEAD, "h", False, "h", MAX, MAX, for_other_group=False)
    assert v is Verdict.GAVE_UP
    assert OUTCOMES[verdict_reason(v, "m", "h", "h")[0]][0] is ConsumeResult.DEAD_LETTER


def test_a_changed_body_is_a_mismatch_whoever_the_copy_is_for() -> None:
    assert judge(StubStatus.DEAD, "h1", False, "h2", MAX, MAX, for_other_group=True) is Verdict.MISMATCH

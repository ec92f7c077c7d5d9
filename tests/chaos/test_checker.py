"""The checker itself, on fabricated observations: every broken promise is reported, and a
clean observation passes. No process is started (these run in ``make test-fast``)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.chaos.checker import (
    Call,
    Email,
    FaultWindow,
    Observation,
    RunState,
    check,
)

W03 = "<digest-2031-w03@durable-digest>"


def clean() -> Observation:
    """Two weeks: w02 emailed its two items, w03 waits for approval holding the third."""
    return Observation(
        items=["c0000", "c0001", "c0002"],
        weeks=["2031-w02", "2031-w03"],
        emails=[Email("2031-w02", "<digest-2031-w02@durable-digest>", ("c0000", "c0001"), 10.0)],
        calls=[
            Call("c0000", 1.0, 2.0),
            Call("c0001", 1.0, 2.0),
            Call(None, 2.0, 3.0, opening=("c0000", "c0001")),
            Call("c0002", 5.0, 6.0, batch=True),
        ],
        runs={
            "2031-w02": RunState(
                "2031-w02",
                "done",
                {"approval": False},
                send="done",
                fence=1,
                step_fences={"select": 1, "send": 1},
                summarized=("c0000", "c0001"),
                opened=("c0000", "c0001"),
            ),
            "2031-w03": RunState(
                "2031-w03",
                "waiting",
                {"approval": True},
                lease=False,
                fence=2,
                step_fences={"select": 1, "summarize:c0002": 2},
                summarized=("c0002",),
            ),
        },
        claims={"c0002": "digest:2031-w03"},
        seen={"c0000", "c0001"},
        statuses={"2031-w02": ["running", "done"], "2031-w03": ["running", "waiting"]},
        fences={"2031-w02": [1], "2031-w03": [1, 2]},
    )


def rules(observation: Observation) -> list[str]:
    return [violation.rule for violation in check(observation)]


def test_a_clean_observation_passes() -> None:
    assert check(clean()) == []


def test_two_emails_for_one_run_are_reported() -> None:
    observation = clean()
    again = dataclasses.replace(observation.emails[0], received_at=20.0)
    observation.emails.append(again)
    [violation] = [v for v in check(observation) if v.rule == "emails"]
    assert "emailed 2 times" in violation.message
    assert violation.at == 20.0
    assert len(violation.evidence["emails"]) == 2


def test_copies_of_an_ambiguous_send_under_one_message_id_are_allowed() -> None:
    observation = clean()
    observation.emails.append(dataclasses.replace(observation.emails[0], received_at=20.0))
    observation.ambiguous.add("2031-w02")
    assert check(observation) == []


def test_copies_under_one_message_id_are_allowed_where_the_deployment_resends_itself() -> None:
    observation = clean()
    observation.emails.append(dataclasses.replace(observation.emails[0], received_at=20.0))
    observation.copies_allowed = True
    assert check(observation) == []


def test_copies_of_an_ambiguous_send_under_two_message_ids_are_reported() -> None:
    observation = clean()
    observation.emails.append(
        dataclasses.replace(observation.emails[0], message_id="<other@durable-digest>")
    )
    observation.ambiguous.add("2031-w02")
    assert rules(observation) == ["emails"]


@pytest.mark.parametrize("decision", ["rejected", "timed-out", None])
def test_an_email_of_a_gated_run_not_approved_is_reported(decision: str | None) -> None:
    observation = clean()
    observation.runs["2031-w03"].approval = decision
    observation.emails.append(Email("2031-w03", "<digest-2031-w03@durable-digest>", (), 30.0))
    [violation] = check(observation)
    assert violation.rule == "emails"
    assert f"approval was {decision or 'never given'}" in violation.message


def test_an_approved_gated_run_may_send() -> None:
    observation = clean()
    observation.runs["2031-w03"].approval = "approved"
    observation.runs["2031-w03"].status = "done"
    observation.claims.clear()
    observation.emails.append(
        Email("2031-w03", "<digest-2031-w03@durable-digest>", ("c0002",), 30.0)
    )
    assert check(observation) == []


def test_an_item_in_two_runs_emails_is_reported() -> None:
    observation = clean()
    observation.emails.append(
        Email("2031-w03", "<digest-2031-w03@durable-digest>", ("c0001",), 30.0)
    )
    observation.runs["2031-w03"].args = {}
    violations = check(observation)
    assert [v.rule for v in violations] == ["items"]
    assert "c0001" in violations[0].message and "2031-w02, 2031-w03" in violations[0].message
    assert [run["run_id"] for run in violations[0].evidence["runs"]] == ["2031-w02", "2031-w03"]


def test_a_forks_email_is_not_a_second_email_of_its_items() -> None:
    observation = clean()
    observation.runs["2031-w02-fork1"] = RunState("2031-w02-fork1", "done", fork_of="2031-w02")
    fork = Email("2031-w02-fork1", "<digest-2031-w02-fork1@durable-digest>", ("c0000", "c0001"), 40)
    observation.emails.append(fork)
    assert check(observation) == []


def test_an_item_nobody_holds_and_no_email_carried_is_reported_dropped() -> None:
    observation = clean()
    del observation.claims["c0002"]
    [violation] = check(observation)
    assert violation.rule == "items"
    assert "silently dropped" in violation.message


def test_an_item_marked_seen_but_never_emailed_is_reported() -> None:
    observation = clean()
    del observation.claims["c0002"]
    observation.seen.add("c0002")
    [violation] = check(observation)
    assert "marked seen" in violation.message


def test_an_item_held_by_a_run_digest_runs_does_not_show_is_reported() -> None:
    observation = clean()
    observation.runs["2031-w03"].listed = False
    [violation] = check(observation)
    assert violation.rule == "items" and "does not show" in violation.message


def test_an_item_held_by_a_run_done_without_emailing_it_is_reported() -> None:
    observation = clean()
    observation.runs["2031-w03"].status = "done"
    observation.statuses["2031-w03"].append("done")
    assert rules(observation) == ["items"]


def test_a_missing_week_is_reported() -> None:
    observation = clean()
    observation.weeks.append("2031-w04")
    [violation] = check(observation)
    assert violation.rule == "weeks" and "no run at all" in violation.message


def test_a_week_whose_run_never_started_is_reported() -> None:
    observation = clean()
    observation.weeks.append("2031-w04")
    observation.runs["2031-w04"] = RunState("2031-w04", None)
    [violation] = check(observation)
    assert "state None" in violation.message


def test_a_repeated_paid_call_no_fault_explains_is_reported() -> None:
    observation = clean()
    observation.calls.append(Call("c0000", 8.0, 9.0))
    [violation] = check(observation)
    assert violation.rule == "paid-calls" and "c0000" in violation.message


def test_a_repeated_batch_request_counts_as_a_paid_call() -> None:
    observation = clean()
    observation.calls.append(Call("c0002", 8.0, 9.0, batch=True))
    assert rules(observation) == ["paid-calls"]


def test_a_call_repeated_because_a_fault_hit_it_in_flight_is_allowed() -> None:
    observation = clean()
    observation.calls.append(Call("c0000", 8.0, 9.0))
    observation.faults.append(FaultWindow("kill-child", 1.5, 1.5, "a/123"))
    assert check(observation) == []


def test_one_fault_explains_one_repeat_only() -> None:
    observation = clean()
    observation.calls += [Call("c0000", 8.0, 9.0), Call("c0000", 12.0, 13.0)]
    observation.faults.append(FaultWindow("kill-child", 1.5, 1.5, "a/123"))
    assert rules(observation) == ["paid-calls"]


def test_a_fault_after_the_answer_was_recorded_explains_nothing() -> None:
    observation = clean()
    observation.calls.append(Call("c0000", 8.0, 9.0))
    observation.faults.append(FaultWindow("kill-child", 4.0, 4.0, "a/123"))
    assert rules(observation) == ["paid-calls"]


def cancelled_holding_c0002(cancel_at: float) -> Observation:
    """w03 paid for c0002 in a batch, then an operator cancelled it before it recorded the
    answer (its holder crashed while recording); w04 paid for c0002 again and recorded it."""
    observation = clean()
    observation.weeks.append("2031-w04")
    observation.runs["2031-w03"] = dataclasses.replace(
        observation.runs["2031-w03"],
        status="cancelled",
        step_fences={"select": 1},
        summarized=(),
        frozen=("c0002",),
    )
    observation.runs["2031-w04"] = RunState(
        "2031-w04",
        "waiting",
        {"approval": True},
        fence=1,
        step_fences={"select": 1, "summarize:c0002": 1},
        summarized=("c0002",),
        frozen=("c0002",),
    )
    observation.claims = {"c0002": "digest:2031-w04"}
    observation.statuses["2031-w03"] = ["running", "waiting", "cancelled"]
    observation.statuses["2031-w04"] = ["running", "waiting"]
    observation.fences["2031-w04"] = [1]
    observation.calls.append(Call("c0002", 20.0, 21.0))
    observation.faults.append(FaultWindow("operator-cancel", cancel_at, cancel_at + 2, "2031-w03"))
    return observation


def test_an_answer_a_cancelled_run_paid_for_and_never_recorded_may_be_paid_again() -> None:
    assert check(cancelled_holding_c0002(cancel_at=12.0)) == []


def test_a_cancel_explains_only_what_its_run_had_paid_for_before_it() -> None:
    assert rules(cancelled_holding_c0002(cancel_at=0.5)) == ["paid-calls"]


def test_a_repeated_opening_paragraph_no_fault_explains_is_reported() -> None:
    observation = clean()
    observation.calls.append(Call(None, 8.0, 9.0, opening=("c0001", "c0000")))
    [violation] = check(observation)
    assert violation.rule == "paid-calls"
    assert violation.message.startswith("the opening paragraph of c0000, c0001 was paid for 2")


def test_a_repeated_opening_paragraph_in_a_batch_is_reported() -> None:
    observation = clean()
    observation.calls.append(Call(None, 8.0, 9.0, batch=True, opening=("c0000", "c0001")))
    assert rules(observation) == ["paid-calls"]


def test_an_opening_paragraph_hit_in_flight_may_be_asked_again() -> None:
    observation = clean()
    observation.calls.append(Call(None, 8.0, 9.0, opening=("c0000", "c0001")))
    observation.faults.append(FaultWindow("kill-worker", 2.5, 2.5, "a"))
    assert check(observation) == []


def test_a_forks_own_opening_paragraph_of_the_same_items_is_paid_once_more() -> None:
    observation = clean()
    observation.calls.append(Call(None, 8.0, 9.0, opening=("c0000", "c0001")))
    observation.runs["2031-w02-fork1"] = RunState(
        "2031-w02-fork1", "done", fork_of="2031-w02", opened=("c0000", "c0001")
    )
    assert check(observation) == []


def test_each_item_of_a_batch_made_twice_is_a_repeated_paid_call() -> None:
    observation = clean()
    observation.calls += [Call("c0000", 8.0, 9.0, batch=True), Call("c0001", 8.0, 9.0, batch=True)]
    violations = check(observation)
    assert [v.rule for v in violations] == ["paid-calls", "paid-calls"]
    assert [v.evidence["item"] for v in violations] == ["c0000", "c0001"]


def test_a_fence_that_went_down_is_reported() -> None:
    observation = clean()
    observation.fences["2031-w03"] = [1, 2, 1, 3]
    [violation] = check(observation)
    assert violation.rule == "journal" and "from 2 to 1" in violation.message


def test_a_rewritten_step_is_reported() -> None:
    observation = clean()
    observation.rewritten.append(("2031-w02", "send", '{"fence":1}', '{"fence":2}'))
    [violation] = check(observation)
    assert violation.rule == "journal" and "recorded twice" in violation.message


def test_a_lease_left_on_an_ended_run_is_reported() -> None:
    observation = clean()
    observation.runs["2031-w02"].lease = True
    [violation] = check(observation)
    assert violation.rule == "journal" and "lease" in violation.message


def test_a_lease_of_a_run_not_ended_is_fine() -> None:
    observation = clean()
    observation.runs["2031-w03"].lease = True
    assert check(observation) == []


def test_a_step_recorded_above_the_fence_counter_is_reported() -> None:
    observation = clean()
    observation.runs["2031-w03"].step_fences["compose"] = 5
    assert rules(observation) == ["journal"]


def test_a_forks_copied_records_may_carry_its_parents_fences() -> None:
    observation = clean()
    observation.runs["2031-w02-fork1"] = RunState(
        "2031-w02-fork1", "done", fence=1, step_fences={"select": 3}, fork_of="2031-w02"
    )
    assert check(observation) == []


@pytest.mark.parametrize(
    ("statuses", "allowed"),
    [
        (["running", "done"], True),
        (["running", "waiting", "done"], True),  # a sample may miss running in between
        (["waiting", "failed"], True),
        (["done", "running"], False),
        (["cancelled", "running"], False),
        (["running", "done", "cancelled"], False),
    ],
)
def test_status_changes_outside_transitions_are_reported(
    statuses: list[str], allowed: bool
) -> None:
    observation = clean()
    observation.statuses["2031-w02"] = statuses
    assert rules(observation) == ([] if allowed else ["journal"])


def test_every_violation_is_reported_not_only_the_first() -> None:
    observation = clean()
    observation.emails.append(dataclasses.replace(observation.emails[0], received_at=20.0))
    observation.weeks.append("2031-w09")
    observation.fences["2031-w02"] = [2, 1]
    assert sorted(rules(observation)) == ["emails", "journal", "weeks"]


def test_a_run_stuck_after_the_quiet_period_is_reported() -> None:
    observation = clean()
    observation.runs["2031-w03"].stuck = True
    [violation] = check(observation)
    assert violation.rule == "progress" and "2031-w03" in violation.message

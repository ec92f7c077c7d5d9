"""The run protocol, model-checked: every interleaving of spec/protocol.pml, with SPIN.

The model checks safety (assertions, every reachable state) and liveness (an LTL property
under weak fairness), of the run and its fenced effect, and of beat's weekly dispatcher. A
model that passes proves nothing if it cannot fail, so each property has a mutant, the model
with one guard of the real code removed, that SPIN must refute with a counterexample trail
naming that property; and the known limits are checked to still fail, so whoever closes one
is told to promote it to a property.

Every check is exhaustive (``-DSAFETY`` for the safety ones: no cycle search); the bounds that
keep them inside the test's time are the model's own (two workers, one crash, one expiry, one
transport failure, one operator's decision; two weeks for the dispatcher), each documented there.

Needs ``spin`` (Debian's package) and a C compiler; skipped, with that reason, without them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[2] / "spec" / "protocol.pml"
CC = shutil.which("gcc") or shutil.which("cc")

pytestmark = [
    pytest.mark.slow,  # each test compiles and runs the model checker: processes of its own
    pytest.mark.skipif(
        shutil.which("spin") is None or CC is None,
        reason="the protocol model needs spin and a C compiler (apt-get install spin gcc)",
    ),
]


@dataclass(frozen=True)
class Verdict:
    errors: int
    states: int
    output: str
    workdir: Path
    defines: tuple[str, ...]

    def trail(self) -> str:
        """The counterexample SPIN wrote, replayed step by step."""
        replay = subprocess.run(
            ["spin", *self.defines, "-t", "-p", "-g", MODEL.name],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return replay.stdout + replay.stderr

    def violated(self) -> str:
        """The property the trail violates: each assertion reads ``assert(holds || NAME)``."""
        trail = self.trail()
        failed = re.search(r"text of failed assertion: (.*)", trail)
        assert failed, trail[-3000:]
        return failed.group(1).rsplit("||", 1)[-1].strip(" ()")


# The checks: the lease, records, meta, durable sleep and due sweep; the fenced effect, not
# repeatable (an operator decides) and repeatable (the effect's safety reads nothing of the due
# index or the sleep, and together they are far too many states for a test); and beat's
# dispatcher, which shares nothing with the run.
JOURNAL: tuple[str, ...] = ()
EFFECT = ("-DSLEEP=0", "-DEFFECT=1", "-DSWEEPERS=0")
REPEATABLE = (*EFFECT, "-DREPEATABLE=1")
DISPATCH = ("-DDISPATCH=1",)


def check(tmp_path: Path, *defines: str, liveness: bool = False, mutant: bool = False) -> Verdict:
    """Generate the verifier for the model with ``defines``, compile it and run it."""
    workdir = tmp_path / ("live" if liveness else "safe")
    workdir.mkdir()
    shutil.copy(MODEL, workdir / MODEL.name)

    def run(*command: str, timeout: float = 300) -> str:
        done = subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    run("spin", *defines, "-a", MODEL.name)
    mode = ["-DNFAIR=4"] if liveness else ["-DNOCLAIM", "-DSAFETY"]
    # A mutant's trail is found in a few states: compiling it fast beats running it fast.
    optimize = "-O0" if mutant else "-O2"
    run(str(CC), optimize, *mode, *defines, "-o", "pan", "pan.c")
    output = run("./pan", "-m200000", *(["-a", "-f"] if liveness else []))
    errors = re.search(r"errors: (\d+)", output)
    states = re.search(r"([\d.e+]+) states, stored", output)
    assert errors and states, output
    return Verdict(int(errors.group(1)), int(float(states.group(1))), output, workdir, defines)


def report(capsys: pytest.CaptureFixture[str], what: str, verdict: Verdict) -> None:
    with capsys.disabled():
        print(f"\n  spin: {what}: {verdict.states:,} states explored, {verdict.errors} errors")


def report_refuted(capsys: pytest.CaptureFixture[str], what: str, verdict: Verdict) -> None:
    depth = re.search(r"at depth (\d+)", verdict.output)
    with capsys.disabled():
        print(
            f"\n  spin: {what}: refuted after {verdict.states:,} states, "
            f"a trail of {depth.group(1) if depth else '?'} steps"
        )


@pytest.mark.parametrize(
    ("config", "properties"),
    [
        (JOURNAL, "R1 R2 M1 M2 I1 S1"),
        (EFFECT, "R1 R2 M1 M2 E1 E2 E3"),
        (REPEATABLE, "R1 R2 M1 M2 E1 E2 E3"),
        (DISPATCH, "D1"),
        # An effect unclaimed at the opening is claimed by its confirmation; each of the two
        # guards of that keeps the effect safe alone (both gone: refuted, below).
        ((*EFFECT, "-DEFFECTS_UNREAD"), "E1 E2 E3, renew.lua's guard alone"),
        ((*EFFECT, "-DCLAIM_OVERWRITTEN"), "E1 E2 E3, the opening's read alone"),
    ],
    ids=[
        "journal",
        "effect",
        "effect-repeatable",
        "dispatch",
        "effect-claim-at-confirmation-unread",
        "effect-claim-at-confirmation-overwritten",
    ],
)
def test_every_interleaving_keeps_the_safety_properties(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: tuple[str, ...], properties: str
) -> None:
    verdict = check(tmp_path, *config)
    report(capsys, f"safety {properties} ({config_name(config)})", verdict)
    assert verdict.errors == 0, verdict.trail()[-5000:]
    assert verdict.states > 100_000  # the adversary really ran: crashes, expiry, sweeps
    assert "invalid end states\t+" in verdict.output  # deadlocks were checked too


def config_name(config: tuple[str, ...]) -> str:
    names = {JOURNAL: "journal", EFFECT: "effect", REPEATABLE: "effect, repeatable"}
    if config[: len(EFFECT)] == EFFECT and config not in names:
        return f"effect, {config[-1].removeprefix('-D')}"
    return names.get(config, "dispatch")


@pytest.mark.parametrize(
    ("config", "what"),
    [
        (JOURNAL, "<>done: while deliveries keep arriving, the run ends done"),
        (DISPATCH, "<>published: every week the schedule reaches is published"),
    ],
    ids=["journal", "dispatch"],
)
def test_every_fair_schedule_gets_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: tuple[str, ...], what: str
) -> None:
    verdict = check(tmp_path, *config, liveness=True)
    report(capsys, f"liveness {what}, under weak fairness ({config_name(config)})", verdict)
    assert verdict.errors == 0, verdict.trail()[-5000:]


@pytest.mark.parametrize(
    ("config", "mutant", "breaks"),
    [
        (JOURNAL, "-DNO_RECORD_FENCE", "R1"),  # record.lua without the lease comparison
        (JOURNAL, "-DOVERWRITE", "R2"),  # record.lua with HSET for HSETNX, and no comparison
        (JOURNAL, "-DNO_META_FENCE", "M1"),  # close.lua without the lease comparison
        (JOURNAL, "-DNO_RECHECK", "M2"),  # execute trusts the meta it read before acquiring
        (JOURNAL, "-DUNFENCED_INDEX", "I1"),  # index writes without the WATCH on the lease
        (JOURNAL, "-DSPLIT_CLAIM", "S1"),  # claim_due as two commands instead of one script
        (EFFECT, "-DCLAIM_SKIPPED", "E1"),  # effect_claim.lua ignores a live earlier claim
        (EFFECT, "-DSTAMP_AFTER_REPLY", "E1"),  # claimed_at taken after the claim's reply
        # effect_settle.lua writes "released" for "ambiguous": the next holder acts unasked
        (EFFECT, "-DAMBIGUOUS_AS_RELEASED", "E2"),
        # effect_claim.lua takes a confirmed claim over, though not repeatable nor decided
        (EFFECT, "-DCONFIRMED_TAKEN_OVER", "E2"),
        # effect_settle.lua refuses the claimant's late receipt once a later holder found the
        # claim ambiguous: the operator, asked, resends what was done
        (EFFECT, "-DLATE_RECEIPT_REFUSED", "E3"),
        (EFFECT, "-DDONE_FORGOTTEN", "E3"),  # effect_claim.lua claims a done effect again
        # The opening reads no effect (each one is claimed by its confirmation) and renew.lua
        # takes a claim whatever stands: a done effect is claimed and acted again.
        ((*EFFECT, "-DEFFECTS_UNREAD"), "-DCLAIM_OVERWRITTEN", "E3"),
        # dispatch_due passes a week another dispatcher claims and has not published
        (DISPATCH, "-DWATERMARK_PAST_CLAIM", "D1"),
    ],
    ids=lambda value: value.removeprefix("-D") if isinstance(value, str) else "",
)
def test_each_safety_property_is_refuted_when_its_guard_is_removed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config: tuple[str, ...],
    mutant: str,
    breaks: str,
) -> None:
    verdict = check(tmp_path, *config, mutant, mutant=True)
    assert verdict.errors == 1, verdict.output
    assert verdict.violated() == breaks
    report_refuted(capsys, f"{mutant.removeprefix('-D')} -> {breaks}", verdict)


@pytest.mark.parametrize(
    ("config", "mutant"),
    [
        # a suspending run keeps its lease: once expiries run out, no delivery can take it
        (JOURNAL, "-DNO_RELEASE"),
        # a week's claim without its TTL: a dispatcher dead on another host holds it for ever
        (DISPATCH, "-DCLAIM_NEVER_EXPIRES"),
    ],
    ids=lambda value: value.removeprefix("-D") if isinstance(value, str) else "",
)
def test_liveness_is_refuted_when_its_guard_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: tuple[str, ...], mutant: str
) -> None:
    verdict = check(tmp_path, *config, mutant, liveness=True, mutant=True)
    assert verdict.errors == 1, verdict.output
    assert "acceptance cycle" in verdict.output
    report_refuted(capsys, f"{mutant.removeprefix('-D')} -> an acceptance cycle", verdict)


@pytest.mark.parametrize(
    ("config", "check_", "name"),
    [
        # A holder that confirmed and then paused before DATA passes its irreversible moment
        # after a newer holder acquired the lease: the lease cannot serialize an effect, the
        # claim does (E1: the newer holder waits for the claim's timeout before it claims).
        (EFFECT, "-DEFFECT_LEASE", "EFFECT_UNDER_LEASE"),
        # effect_claim.lua answers resumed=0 for a released claim: a holder that took over a
        # claim that may have acted, then stopped before its own act and released, leaves the
        # next holder acting again while told it is the first (the same key all the same).
        (REPEATABLE, "-DRESUMED_TOLD", "RESUMED"),
    ],
    ids=["effect-outlives-the-lease", "resumed-forgotten-after-a-release"],
)
def test_the_known_limit_still_has_a_counterexample(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config: tuple[str, ...],
    check_: str,
    name: str,
) -> None:
    verdict = check(tmp_path, *config, check_, mutant=True)
    assert verdict.errors == 1, f"{check_} holds now: promote it to a property of the model"
    assert verdict.violated() == name
    report_refuted(capsys, f"known limit {check_.removeprefix('-D')}", verdict)

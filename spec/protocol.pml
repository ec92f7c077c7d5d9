/*
 * The run protocol of journal/, and beat's weekly dispatcher (tasks/worker/dispatch.py), checked
 * exhaustively with SPIN.
 *
 * One run, WORKERS deliveries that keep arriving (Celery redelivers at least once), two due
 * sweepers (two beats), and an adversary that expires leases, crashes workers and moves time.
 * Redis is shared state; each Lua script is one d_step (a script runs atomically in Redis);
 * everything a worker does between two scripts is a separate step, so a worker may pause at
 * any point and any other process may run in between. A crash (kill[id]) can strike before
 * any statement of a worker; the worker comes back as a fresh delivery with a new token.
 *
 * Abstractions, and why they are sound for the properties below:
 * - A lease value "<fence>:<token>" is modelled by its fence: fences are unique per
 *   acquisition (INCR), so comparing fences is comparing the full value.
 * - Lease expiry is an event that may strike any live lease at any time, whatever the TTL
 *   and the heartbeat did: a pause of the holder (SIGSTOP, GC, a frozen VM) makes any
 *   expiry possible. Only the number of expiries is bounded (EXPIRIES), for the liveness check.
 * - A holder whose process crashed may have its lease taken over at once (journal/holder.py:
 *   same host, pid gone), or may be on another host and wait for expiry: both are possible.
 * - The due index holds one entry for the run: ABSENT, ARMED (scored in the future) or DUE
 *   (its time has come); time passing turns ARMED into DUE.
 * - The workflow: one step ("work"), a durable sleep ("sleep:nap"), the fenced effect
 *   ("send", run.effect), then finish. `woke` is the sleep's wake-up time having passed.
 * - The checks (tests/journal/test_model.py), each its own -D flags: the journal one
 *   (-DSLEEP=1, the default: sleep and sweep, no effect); the effect one, not repeatable
 *   (-DSLEEP=0 -DEFFECT=1 -DSWEEPERS=0) and repeatable (the same and -DREPEATABLE=1): the
 *   effect reads nothing of the due index or the sleep, and together they are far over the
 *   test's budget; and the dispatcher (-DDISPATCH=1), at the end of this file, which shares
 *   nothing with the run.
 * - Without sweepers (the effect checks) a renewal writes nothing the model keeps, and a lost
 *   one ends the delivery as the next fenced script, which checks the lease again, does: the
 *   heartbeat is no step of its own there.
 *
 * The fenced effect (journal/_effects.py, the scripts effect_claim/confirm/settle/decide.lua):
 * - The claim's states, as the effects hash keeps them: CLAIMED (before the irreversible
 *   moment), CONFIRMED (at or past it), SETTLED ("done", with its receipt), RELEASED (it did
 *   not happen), AMBIGUOUS (it may have, nobody knows), RESEND (an operator chose to repeat
 *   it). `cf` is the fence in "<fence>:<deadline>:<state>", the deadline is `sage` below.
 * - Time is discrete ticks: `sage` counts them since the claim on the server's clock (the
 *   claim's deadline is TIMEOUT ticks later), `lage[w]` since the worker's own claimed_at
 *   (time.monotonic(), taken before the claim request, so it is never younger). TIMEOUT is 1:
 *   every guard compares a clock with the timeout (confirm's `asked`, last_moment, the claim's
 *   deadline, decide's "abandoned"), so what matters is which side of it each clock is, and
 *   with lage never behind sage there are three cases: the claimant may act and a later holder
 *   must wait; the claimant may no longer act and a later holder must still wait; the later
 *   holder may go on. Ticks pass from one to the next whatever TIMEOUT is. Effect.claim's
 *   proof, its claimed_at and the claim script are one step: a tick between the stamp and the
 *   script only puts the claimant's clock further ahead, which lets it act less
 *   (-DSTAMP_AFTER_REPLY puts the stamp after the reply). The claim's margin, CLAIM_MARGIN_S,
 *   covers the two clocks' rates; here they tick together, so a deadline a later holder
 *   waited out on its own clock (ARGV[6]) is the server's deadline passed.
 * - The effect's one assumption (journal/_effects.py, tasks/mail/smtp.py): the irreversible moment
 *   (the server taking the message at the end-of-data marker) happens within the effect's
 *   timeout of claimed_at or not at all: last_moment checks it with no I/O at the instant
 *   before the marker, and the model makes the check and the act one step. A pause between
 *   the two longer than the claim's margin is the window docs/guarantees.md names.
 * - An effect the run's opening read no claim of (open.lua's HKEYS of the effects hash:
 *   `unclaimed`, cf == 0) is not claimed before the function starts: until its confirmation
 *   it cannot have happened, so nothing can wait on it. Its confirmation takes the claim,
 *   confirmed (renew.lua, unless any claim stands), its claimed_at stamped again right before.
 *   Only the lease holder claims, and renew.lua checks the lease first, so no claim can appear
 *   between the opening's read and the confirmation; each guard (the read, renew.lua's "no
 *   claim stands") keeps E1-E3 alone (-DEFFECTS_UNREAD, -DCLAIM_OVERWRITTEN: checked safe),
 *   and without both a done effect is acted again (refuted, E3).
 * - The claimant's process gone (holder.py) is `cdead`: a crash while its claim is open. The
 *   waiting holder may prove it (same host), or not (another host): both are tried.
 * - What the claimant knows after DATA: the 250 (settle "done"), or no answer (settle
 *   "ambiguous"); before the marker: a timeout at last_moment (settle "released"; LeaseLost),
 *   or the transport's refusal (the mailer releases; _fail closes the run). The transport's
 *   failures, the lost answer and the refusal, are bounded together (FAILURES). A receipt the
 *   store refused (ReceiptUnsaved) leaves the claim confirmed and the lease gone, as a crash
 *   after the act does (not modelled apart); an ambiguous settle after no act is the same as
 *   after one, with one act fewer (the act branch covers it).
 * - An operator (digest mark-sent / resend: journal.control.decide, effect_decide.lua) decides
 *   on an ambiguous effect, or a confirmed one past its deadline whose run nobody holds, at
 *   most DECISIONS times; the operator may be wrong either way: both choices are tried. A run
 *   that suspended for a decision is delivered again once it is decided (make_due).
 * - `resumed`, the flag effect_claim.lua returns, is kept only for -DRESUMED_TOLD: no property
 *   of the passing checks reads it. The idempotency key is the run's and the step's
 *   (Run.idempotency_key), so every act of the effect carries the same key by construction.
 * - A delivery that ends on LeaseLost while its lease is still live (the effect's timeout
 *   passed) leaves the lease to run out, as one of the EXPIRIES: its process is not gone.
 * - Not modelled: cancel (cancel.lua), parking, signals and retry waits: each is one more
 *   fenced field of the same scripts, and adds states without adding an interleaving kind.
 *
 * Map of model steps to the code they stand for. The code runs several model steps in one
 * script, hence atomically: its executions are a subset of the model's interleavings (each
 * script is one of them with no other process in between), so what the model proves of the
 * finer steps holds for the scripts.
 *   meta read, meta read again, acquire, update_meta(RUNNING), index(ARMED), snapshot
 *                                    journal/lua/open.lua via Lease.open (lease.py) from
 *                                    Journal.execute: the TERMINAL check, SET NX (or the
 *                                    takeover of a holder proved dead, ARGV[5], holder.py),
 *                                    the announcement, ZADD due, HGETALL steps
 *   heartbeat, index(ARMED) ........ Heartbeat._renew: journal/lua/renew.lua, which pushes the
 *                                    due time in the same script (Lease.due)
 *   record(s) ...................... Run._record -> Run._write: journal/lua/record.lua
 *   update_meta(WAITING), index, release  (suspend())
 *                                    Journal._suspend -> Journal._close: journal/lua/close.lua
 *                                    (status, ZADD due at the wake-up, DEL lease); and
 *                                    Journal._fail, a failure retried: close.lua too
 *   update_meta(DONE), index(ABSENT), release
 *                                    Journal._finish -> Journal._close: close.lua (status,
 *                                    ZREM due, DEL lease)
 *   claim .......................... journal/lua/claim_due.lua via Journal.claim_due and
 *                                    Durable.sweep (durable.py)
 *   proved; lage = 0; effect_claim() Effect.claim: ProcessIdentity.provably_gone, claimed_at,
 *                                    journal/lua/effect_claim.lua: {1} claimed, {2} done
 *                                    earlier (ok 3), {3} wait (ok 2: sleep, claim again with
 *                                    the deadline or "dead"), {4} ambiguous (ok 4:
 *                                    EffectAmbiguous -> Run.effect's Suspend(decision))
 *   la = lage[id]; the confirm step  Effect.confirm: the timeout check, then Heartbeat.confirm:
 *                                    journal/lua/renew.lua renews and confirms the claim, or,
 *                                    `unclaimed` (Run._effects_begun lacks it), takes it
 *   the act ........................ Effect.last_moment, then the end-of-data marker taken
 *                                    (tasks/mail/smtp.py _Envelope.transmit)
 *   settle(SETTLED) ................ effect.accepted: journal/lua/effect_settle.lua "done"
 *   settle(AMBIGUOUS) .............. run_effect -> Effect.ambiguous: effect_settle.lua
 *   settle(RELEASED) ............... run_effect / SmtpMailer._deliver -> Effect.release
 *   unsure() ....................... run_effect's raise: EffectAmbiguous -> Suspend, or the
 *                                    transport's error -> _fail, both close.lua; LeaseLost
 *                                    (effect_settle.lua's 2, or -3) leaves the lease
 *   Operator ....................... journal.control.decide: journal/lua/effect_decide.lua
 *
 * Safety (assertions; pan -DNOCLAIM):
 *   R1  a step is recorded only by the holder whose acquisition is the latest (fence == my)
 *   R2  a recorded step is never overwritten; a run is done only with every step recorded
 *   M1  a meta transition is written only by the latest holder
 *   M2  a done run stays done
 *   I1  an index write lands only for the latest holder
 *   S1  a sweeper claims only the due entry it read: two sweepers never claim one entry
 *   E1  the irreversible moment is passed only under the current claim: the actor's own,
 *       still confirmed (no later holder claimed it, or found it ambiguous)
 *   E2  exactly once, or marked: not repeatable, the effect is acted at most once, plus once
 *       per operator's resend (each resend is a decision on an ambiguous outcome);
 *       repeatable, every repeat is paid for by a crash, a lease expiry or a transport failure
 *       (and carries the effect's one key, by construction)
 *   E3  never acted once known done: after its receipt reached the store under its own claim
 *       (whether or not the store kept it), or an operator said it happened
 *   D1  (dispatcher) the watermark never passes a week that is not published
 * Liveness (pan -a -f: weak fairness):
 *   ltl `done`, in the journal check: while deliveries keep arriving, the run ends done.
 *   ltl `published`, in the dispatcher check: every week the schedule reaches is published,
 *   whichever dispatcher dies where (no week lost). (The effect checks' liveness search is
 *   many times their safety states: over the test's time budget.)
 * Known limits, checked to fail (tests/journal/test_model.py keeps them honest):
 *   -DEFFECT_LEASE "no effect start by a holder after another's acquisition": a holder that
 *                  confirmed, then paused before DATA, acts after a newer holder acquired;
 *                  the lease cannot serialize an act outside Redis, the claim does (E1).
 *   -DRESUMED_TOLD "a repeat's claim says it is resumed" (repeatable): effect_claim.lua
 *                  answers resumed=0 for a released claim, and a holder that took over a
 *                  claim that may have acted, then released its own (it stopped before the
 *                  marker), leaves `released`: the next holder acts again, told it is the
 *                  first. Its key is the same, so the receiver drops it; a function that read
 *                  `effect.resumed` to choose a key would not.
 * Mutants (each must be refuted with a trail):
 *   -DNO_RECORD_FENCE   record.lua without the lease comparison            -> R1
 *   -DOVERWRITE         record.lua with HSET for HSETNX and no comparison  -> R2
 *   -DNO_META_FENCE     close.lua without the lease comparison             -> M1
 *   -DUNFENCED_INDEX    index writes as plain commands after the fenced script (as they
 *                       were before open.lua and close.lua took them in): a paused holder's
 *                       ZADD/ZREM lands after a newer holder's acquisition  -> I1
 *   -DSPLIT_CLAIM       claim_due as ZRANGEBYSCORE then ZADD, not a script -> S1
 *   -DNO_RECHECK        Journal.execute trusts the meta it read before acquiring: a delivery
 *                       that read `running` before another finished re-opens the done run -> M2
 *   -DCLAIM_SKIPPED     effect_claim.lua ignores a live claim of an older fence -> E1
 *   -DSTAMP_AFTER_REPLY claimed_at taken after the claim's reply: confirm trusts a claim
 *                       older than it thinks, and acts past its deadline    -> E1
 *   -DAMBIGUOUS_AS_RELEASED  effect_settle.lua writes "released" for "ambiguous": the next
 *                       holder acts again, unasked                          -> E2
 *   -DCONFIRMED_TAKEN_OVER   effect_claim.lua takes a confirmed claim past its deadline over
 *                       as a claimed one, not repeatable and undecided     -> E2
 *   -DLATE_RECEIPT_REFUSED   effect_settle.lua refuses a receipt once a later holder found
 *                       the claim ambiguous: the operator, asked, resends a done act -> E3
 *   -DDONE_FORGOTTEN    effect_claim.lua without its "done" answer: a done effect claimed
 *                       again                                              -> E3
 *   -DEFFECTS_UNREAD -DCLAIM_OVERWRITTEN   the opening reads no effect and renew.lua takes
 *                       a claim whatever stands: a done effect is acted again -> E3
 *   -DNO_RELEASE        a suspending run keeps its lease: once expiries run out, no later
 *                       delivery can take the run                      -> ltl done
 *   -DWATERMARK_PAST_CLAIM   dispatch_due counts a week another dispatcher claims as no
 *                       gap: the watermark passes a week not yet published  -> D1
 *   -DCLAIM_NEVER_EXPIRES    the week's claim without its TTL: a dispatcher that dies on
 *                       another host holds its week for ever         -> ltl published
 * (The mailer's own check of effect.earlier, the old -DRECEIPT_IGNORED, is not a guard of the
 * protocol any more: effect_claim.lua answers "done" with no claim, and renew.lua (confirming)
 * refuses a fence that holds none, so a mailer that ignored it could not act.)
 */

#ifndef WORKERS
#define WORKERS 2
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef EXPIRIES
#define EXPIRIES 1
#endif
#ifndef SWEEPERS
#define SWEEPERS 2
#endif
/* Which parts interleave: the sleep and the sweep in one check, the effect in another (the
   effect's safety does not read the due index, and together they are far over a test's time). */
#ifndef SLEEP
#define SLEEP 1
#endif
#ifndef EFFECT
#define EFFECT 0
#endif
#ifndef EARLY
#define EARLY 1
#endif

#define STEPS 3
#define WORK 0
#define NAP 1
#define SEND 2

/* the effect: its claim's state in the effects hash (effect_claim.lua's states) */
#define CLAIMED 1                                   /* before its irreversible moment */
#define CONFIRMED 2                                 /* at or past it: renew.lua confirming */
#define SETTLED 3                                   /* done: a receipt */
#define RELEASED 4                                  /* it did not happen */
#define AMBIGUOUS 5                                 /* it may have happened: nobody knows */
#define RESEND 6                                    /* an operator chose to repeat it */
#ifndef TIMEOUT
#define TIMEOUT 1
#endif
#define ACTING (cstate == CLAIMED || cstate == CONFIRMED)   /* its deadline counts */
/* The effect's variant: `repeatable` (the receiver drops a repeat of the key: the next holder
   repeats an effect that may have happened) or not (the run waits for an operator). */
#ifndef REPEATABLE
#define REPEATABLE 0
#endif
#ifndef DECISIONS
#define DECISIONS 1
#endif
#ifndef FAILURES
#define FAILURES 1
#endif

/* meta status */
#define NEW 0
#define RUNNING 1
#define WAITING 2
#define DONE 3

/* the run's entry in journal:due */
#define ABSENT 0
#define ARMED 1
#define DUE 2

/* Each assertion names its property: `assert(holds || R1)` fails, naming R1, when it does not
   hold (these are always 0, and hidden: they are labels, not state). */
hidden byte R1, R2, M1, M2, I1, S1, E1, E2, E3, D1, EFFECT_UNDER_LEASE, RESUMED;

/* Redis */
byte lease;          /* journal:{RUN}:lease, as its fence; 0: no key */
byte fence;          /* journal:{RUN}:fence */
bool rec[STEPS];     /* journal:{RUN}:steps: whether each step is recorded */
byte status;         /* journal:{RUN}:meta status */
byte due;            /* the run's entry in journal:due */
bool fresh[2];       /* ghost: sweeper k read the entry and no sweeper claimed it since */

byte cf;             /* journal:{RUN}:effects "send": the claim's fence; 0: no claim */
byte cstate;         /* ... and its state: CLAIMED ... RESEND ("send:receipt" with SETTLED) */
byte sage;           /* ticks since the claim, by the server's clock (saturates at TIMEOUT):
                        the claim's deadline has passed at TIMEOUT */
bool cdead;          /* the claimant's process crashed: provably gone on its host */

/* ghosts of the outside world */
byte lage[WORKERS];  /* ticks since each worker's claimed_at (time.monotonic()), saturating */
byte acts;           /* emails the SMTP server accepted */
byte licence;        /* acts allowed: 1, plus one per operator's resend */
bool known;          /* a receipt reached the store under its own claim, or an operator
                        said it happened: the effect is known done */
byte failures;       /* the transport's failures: an answer lost after the end of data, a
                        refusal before it (bounded: FAILURES) */
byte decisions;      /* operator's decisions (bounded: DECISIONS) */

/* the adversary */
bool woke;           /* the durable sleep's wake-up time has passed */
byte crashes;
byte expiries;
byte early;          /* deliveries of the waiting run before its wake-up time */
byte dead;           /* fence of a holder whose process crashed (provably gone on its host) */
bool kill[WORKERS];

inline update_meta(new) {
  d_step {
#ifndef NO_META_FENCE
    if
    :: lease == my ->
#endif
       assert(status != DONE || new == DONE || M2);
       assert(fence == my || M1);
       if
       :: new == DONE -> assert(rec[WORK] && (rec[NAP] || !SLEEP) && (rec[SEND] || !EFFECT) || R2)
       :: else -> skip
       fi;
       status = new;
       ok = 1
#ifndef NO_META_FENCE
    :: else -> ok = 0                                 /* -1 expired / -2 fenced: LeaseLost */
    fi
#endif
  }
}

inline record(s) {
  d_step {
#if !defined(NO_RECORD_FENCE) && !defined(OVERWRITE)
    if
    :: lease == my ->
#endif
#ifdef OVERWRITE
       assert(!rec[s] || R2);                         /* HSET would overwrite */
       rec[s] = 1;
#else
       assert(fence == my || R1);
       if
       :: rec[s] == 0 -> rec[s] = 1                   /* HSETNX wrote: 1 */
       :: else -> skip                                /* {2, existing}: the caller adopts it */
       fi;
#endif
       ok = 1
#if !defined(NO_RECORD_FENCE) && !defined(OVERWRITE)
    :: else -> ok = 0                                 /* {-1} / {-2, holder}: LeaseLost, Fenced */
    fi
#endif
  }
}

/* The index writes of open.lua, renew.lua and close.lua, after GET lease == holder:
   they write nothing once the lease expired or passed to another holder. */
inline index(v) {
#if SWEEPERS
  d_step {
#ifndef UNFENCED_INDEX
    if
    :: lease == my ->
#endif
       assert(fence == my || I1);
       due = v
#ifndef UNFENCED_INDEX
    :: else -> skip
    fi
#endif
  }
#else
  skip
#endif
}

inline release() {
  d_step {
    if
    :: lease == my -> lease = 0                        /* compare-and-DEL */
    :: else -> skip
    fi
  }
}

/* effect_settle.lua: only the claim's own fence settles it, with its lease or without; a
   receipt or a release also settles a claim a later holder made ambiguous, or an operator
   chose to resend (unknown never overwrites what is known). ok: 1 settled by the lease holder,
   2 settled without the lease (make_due; LeaseLost), 0: -3, no longer this fence's claim. */
inline settle(state) {
  d_step {
    if
    :: state == SETTLED && cf == my -> known = 1     /* the receipt reaches its own claim */
    :: else -> skip
    fi;
    if
    :: cf == my && (cstate == CLAIMED || cstate == CONFIRMED
#ifndef LATE_RECEIPT_REFUSED
                    || state != AMBIGUOUS && (cstate == AMBIGUOUS || cstate == RESEND)
#endif
                   ) ->
#ifdef AMBIGUOUS_AS_RELEASED
       if :: state == AMBIGUOUS -> cstate = RELEASED :: else -> cstate = state fi;
#else
       cstate = state;
#endif
       if :: lease == my -> ok = 1 :: else -> ok = 2 fi
    :: else -> ok = 0
    fi
  }
}

/* effect_claim.lua, after its lease check. The guards, each one a mutant's target: */
#ifdef DONE_FORGOTTEN
#define RECEIPT 0
#else
#define RECEIPT (cstate == SETTLED)                 /* {2, receipt}: nothing written */
#endif
#ifdef CLAIM_SKIPPED
#define LIVE_EARLIER 0
#else                                               /* {3, remaining}: wait, or prove it dead */
#define LIVE_EARLIER ((cstate == CLAIMED || cstate == CONFIRMED) && cf != my && sage < TIMEOUT && !proved)
#endif
#ifdef CONFIRMED_TAKEN_OVER
#define ASK (cstate == AMBIGUOUS && !REPEATABLE)
#else                                               /* {4}: (now) ambiguous: a decision */
#define ASK ((cstate == CONFIRMED || cstate == AMBIGUOUS) && !REPEATABLE)
#endif
inline effect_claim() {
  d_step {
    if
    :: lease != my -> ok = 0                          /* {-1} / {-2}: LeaseLost */
    :: else ->
       if
       :: RECEIPT -> ok = 3
       :: else ->
          if
          :: LIVE_EARLIER -> ok = 2
          :: else ->
             if
             :: ASK -> cstate = AMBIGUOUS; ok = 4      /* the claimant's fence kept */
             :: else ->                                /* {1, resumed}: claimed */
#ifdef RESUMED_TOLD
                resumed = (cstate == CLAIMED || cstate == CONFIRMED || cstate == AMBIGUOUS || cstate == RESEND);
#endif
                cf = my; cstate = CLAIMED; sage = 0; cdead = 0; ok = 1
             fi
          fi
       fi
    fi
  }
}

/* Journal._suspend, or Journal._fail (a retried failure): close.lua writes a status that is
   not terminal, and releases the lease; the next delivery takes the run on. */
inline suspend() {
  update_meta(WAITING);
  if :: !ok -> goto start :: else -> skip fi;
  index(ARMED);
  release();
  goto start
}

/* The delivery ends with an exception while its lease may still be live: the heartbeat stops
   and the lease runs out, one of the EXPIRIES (no process is gone: no takeover before that). */
inline leave() {
  goto start
}

/* After an effect's failure that settled it: EffectAmbiguous (Suspend: a decision) or the
   transport's error (_fail: retried) closes the run when the settle kept the lease, and
   LeaseLost (settled without it, or -3 Fenced) leaves it. */
inline unsure() {
  if :: ok == 1 -> suspend() :: else -> leave() fi
}

/* Without sweepers a renewal writes nothing the model keeps, and a lost one ends the delivery
   just as the next fenced script, which checks the lease again, does: no step of its own. */
inline heartbeat() {
#if SWEEPERS
  if
  :: skip                                             /* no renewal due before this step */
  :: d_step { if :: lease == my -> ok = 1 :: else -> ok = 0 fi };   /* renew.lua */
     if
     :: ok ->                                         /* on_renew: ZADD due, fenced */
        index(ARMED)                                  /* renew.lua */
     :: else -> goto start                            /* lost: ensure() raises LeaseLost */
     fi
  fi
#else
  skip
#endif
}

proctype Worker(byte id) {
  byte my;
  byte ok;
  bool seen[STEPS];
  bool proved, resumed;
  bool unclaimed;      /* the opening read no claim of the effect: its confirmation claims */
  byte la;
start:
  atomic {
    my = 0; ok = 0; seen[WORK] = 0; seen[NAP] = 0; seen[SEND] = 0; lage[id] = TIMEOUT;
    unclaimed = 0
  };
  {
    /* Journal.execute: the meta read; a terminal run is already-done */
    if
    :: status == DONE -> goto retire
    :: else -> skip
    fi;
    /* open.lua: SET NX, or take over a holder proved dead */
    d_step {
      if
      :: lease == 0 || (lease == dead && dead != 0) ->   /* takeover: same host only */
         fence++; lease = fence; my = fence; dead = 0
      :: lease == dead && dead != 0 -> skip          /* another host: wait for expiry */
      :: else -> skip
      fi
    };
    if
    :: my == 0 -> goto start                          /* LeaseBusy: the delivery retries */
    :: else -> skip
    fi;
#ifndef NO_RECHECK
    if                                                /* the meta read again, under the lease */
    :: status == DONE -> release(); goto retire       /* ended between our read and our lease */
    :: else -> skip
    fi;
#endif
    update_meta(RUNNING);                             /* open.lua */
    if :: !ok -> goto start :: else -> skip fi;
    index(ARMED);                                     /* ZADD due <lease deadline> */
    d_step {                                          /* open.lua's reply: HGETALL, HKEYS */
      seen[WORK] = rec[WORK]; seen[NAP] = rec[NAP]; seen[SEND] = rec[SEND];
#ifdef EFFECTS_UNREAD
      unclaimed = 1                                   /* as if no effect had a claim */
#else
      unclaimed = (cf == 0)
#endif
    };

    /* run.step("work", ...) */
    if
    :: seen[WORK] -> skip                             /* replayed */
    :: else ->
       heartbeat();                                   /* check_lease */
       record(WORK);
       if :: !ok -> goto start :: else -> skip fi
    fi;

#if SLEEP
    /* run.sleep("nap", ...): the wake-up time is recorded once */
    if
    :: seen[NAP] -> skip
    :: else ->
       heartbeat();
       record(NAP);
       if :: !ok -> goto start :: else -> skip fi
    fi;
    if
    :: !woke && seen[NAP] && early < EARLY -> early++  /* a delivery before the wake-up */
    :: !woke && seen[NAP] -> woke                     /* the next one comes when it is due */
    :: else -> skip
    fi;
    if
    :: !woke ->                                       /* Suspend -> Journal._suspend */
       update_meta(WAITING);
       if :: !ok -> goto start :: else -> skip fi;
       index(ARMED);                                  /* ZADD due <wake-up> */
#ifndef NO_RELEASE
       release();
#endif
       goto start
    :: else -> skip
    fi;
#endif

#if EFFECT
    /* run.effect("send", mailer.send): Run.effect (journal/steps.py) -> run_effect
       (journal/_effects.py) -> SmtpMailer.send (tasks/mail/smtp.py) */
    if
    :: seen[SEND] -> skip
    :: else ->
       /* check_lease, and ensure() after a wait: their loss is the claim's {-1}/{-2} */
       if
       :: unclaimed ->                                /* claimed by its confirmation */
          lage[id] = 0;                               /* Effect.claim: claimed_at */
          goto deliver
       :: else -> skip
       fi;
claim:
       atomic {                                       /* Effect.claim */
         if                                           /* the claimant proved gone (holder.py)? */
         :: proved = cdead
         :: proved = 0                                /* another host: nothing proved */
         fi;
#ifndef STAMP_AFTER_REPLY
         lage[id] = 0;                                /* claimed_at, before the request */
#endif
         effect_claim();
         proved = 0
       };
#ifdef STAMP_AFTER_REPLY
       lage[id] = 0;                                  /* claimed_at, after the reply */
#endif
       if
       :: ok == 0 -> goto start
       :: ok == 2 -> goto claim                       /* sleep(remaining); ensure(); again */
       :: ok == 4 ->                                  /* EffectAmbiguous: Suspend(decision) */
          update_meta(WAITING);
          if :: !ok -> goto start :: else -> skip fi;
          release();
end_decided: cstate != AMBIGUOUS;                       /* the decision wakes it (make_due) */
          goto start
       :: ok == 3 -> skip                             /* effect.earlier: sent, not again */
       :: ok == 1 ->
deliver:
          /* SmtpMailer._deliver: connect, MAIL, RCPT; then effect.confirm(): the timeout
             check, then Heartbeat.confirm: renew.lua checks the lease, renews it and marks
             the claim confirmed in one script, one step here as it is one on the server.
             Unclaimed, the confirmation takes the claim, confirmed, with claimed_at stamped
             again before its request: the claim's deadline runs from there. */
          la = lage[id];
          d_step {
            if
            :: unclaimed -> lage[id] = 0              /* claimed_at, before the request */
            :: else -> skip
            fi;
            if
            :: lease == my && la < TIMEOUT && cf == my && cstate == CLAIMED ->
               cstate = CONFIRMED; ok = 1
#ifdef CLAIM_OVERWRITTEN
            :: lease == my && la < TIMEOUT && unclaimed ->   /* whatever claim stands */
#else
            :: lease == my && la < TIMEOUT && unclaimed && cf == 0 ->
#endif
               cf = my; cstate = CONFIRMED; sage = 0; cdead = 0; ok = 1
            :: else -> ok = 0                         /* LeaseLost, EffectLate, -3 */
            fi;
            la = 0
          };
          if
          :: !ok -> settle(RELEASED); leave()         /* not confirmed: run_effect releases */
          :: else -> skip
          fi;
          /* DATA, the content; effect.last_moment(), no I/O; the end-of-data marker. The
             timeout bounds every SMTP operation: the message is taken within the timeout of
             claimed_at or not at all (the assumption the effect's timeout stands on), so
             last_moment and the server's taking it are one step. */
          if
          :: d_step {
               lage[id] < TIMEOUT ->                  /* the server takes the message */
               assert(cf == my && cstate == CONFIRMED || E1);   /* under the current claim */
               assert(!known || E3);                  /* never once known done */
#if REPEATABLE
               assert(acts <= crashes + expiries + failures || E2);   /* each repeat paid */
#ifdef RESUMED_TOLD
               assert(acts == 0 || resumed || RESUMED);   /* a repeat is told it is one */
#endif
#else
               assert(acts < licence || E2);          /* once, plus one per resend */
#endif
#ifdef EFFECT_LEASE
               assert(fence == my || EFFECT_UNDER_LEASE);
#endif
               acts++
             };
             if
             :: settle(SETTLED);                      /* the 250: effect.accepted(receipt) */
                if :: ok == 1 -> skip :: else -> leave() fi   /* Fenced, or LeaseLost */
             :: d_step { failures < FAILURES -> failures++ };   /* the answer lost: */
                settle(AMBIGUOUS); unsure()           /* MailUnavailable, run_effect */
             fi
          :: lage[id] >= TIMEOUT ->                   /* last_moment: EffectLate, dropped */
             settle(RELEASED); leave()
          :: d_step { failures < FAILURES -> failures++ };   /* refused before the marker */
             settle(RELEASED); unsure()               /* (a 4xx, the link): released */
          fi
       fi;
       record(SEND);
       if :: !ok -> goto start :: else -> skip fi
    fi;
#endif

    /* Journal._finish -> _close: close.lua */
    heartbeat();
    update_meta(DONE);
    if :: !ok -> goto start :: else -> skip fi;
    index(ABSENT);                                    /* ZREM due */
    release();
    goto retire
  } unless {
    kill[id] ->                                       /* SIGKILL, OOM: the process is gone */
    d_step {
      kill[id] = 0;
      if
      :: my != 0 && lease == my -> dead = my
      :: else -> skip
      fi;
      if
      :: my != 0 && cf == my && (cstate == CLAIMED || cstate == CONFIRMED) -> cdead = 1
      :: else -> skip
      fi;
      proved = 0; resumed = 0; la = 0
    };
    goto start
  };
retire:
  skip
}

proctype Sweeper(byte k) {
end:
  do
  ::
#ifdef SPLIT_CLAIM
     d_step { due == DUE -> fresh[k] = 1 };           /* ZRANGEBYSCORE */
     d_step {                                         /* ZADD XX <rearm> */
       assert(fresh[k] || S1);
       fresh[0] = 0; fresh[1] = 0;
       if :: due != ABSENT -> due = ARMED :: else -> skip fi
     }
#else
     d_step {                                         /* claim_due.lua */
       due == DUE -> fresh[k] = 1;
       assert(fresh[k] || S1);
       fresh[0] = 0; fresh[1] = 0;
       due = ARMED
     }
#endif
     /* Durable.sweep: apply_async; deliveries keep arriving in this model anyway */
  od
}

#if !DISPATCH
/* The adversary, one process per kind of event: weak fairness is per process, so an event
   that stays possible (the wake-up time passing, a dead holder's lease running out) happens. */
active proctype Clock() {
  woke = 1                                            /* the sleep's wake-up time passes */
}

active proctype DueTime() {
end:
  do
  :: due == ARMED -> due = DUE                        /* a scored time passes */
  od
}

active proctype Expiry() {
end:
  do
  :: d_step { expiries < EXPIRIES && lease != 0 -> lease = 0; dead = 0; expiries++ }
  :: d_step { lease != 0 && lease == dead -> lease = 0; dead = 0 }   /* a dead holder's */
  od
}

active proctype Ticks() {                            /* time, for the effect's timeout */
end:
  do
  :: d_step {
       ACTING && sage < TIMEOUT || lage[0] < TIMEOUT || lage[WORKERS - 1] < TIMEOUT ->
       if :: ACTING && sage < TIMEOUT -> sage++ :: else -> skip fi;
       if :: lage[0] < TIMEOUT -> lage[0]++ :: else -> skip fi;
       if :: lage[WORKERS - 1] < TIMEOUT -> lage[WORKERS - 1]++ :: else -> skip fi
     }
  od
}

#if EFFECT
/* An operator's decision on an effect that may have happened (journal.control.decide,
   effect_decide.lua): on an ambiguous one, or a confirmed one whose deadline has passed and
   whose run nobody holds. The operator may be wrong either way: the model lets them choose. */
active proctype Operator() {
end:
  do
  :: atomic {
       decisions < DECISIONS &&
       (cstate == AMBIGUOUS || cstate == CONFIRMED && sage >= TIMEOUT && lease == 0) ->
       decisions++;
       if
       :: cstate = SETTLED; known = 1                 /* digest mark-sent: it happened */
       :: cstate = RESEND; licence++                  /* digest resend: repeat it */
       fi
     }
  od
}
#endif

active proctype Killer() {
end:
  do
  :: d_step { crashes < CRASHES -> crashes++; kill[0] = 1 }
  :: d_step { crashes < CRASHES -> crashes++; kill[WORKERS - 1] = 1 }
  od
}

init {
  byte i = 0;
  atomic {
#if EFFECT
    licence = 1;
#endif
    do
    :: i < WORKERS -> run Worker(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < SWEEPERS -> run Sweeper(i); i++
    :: else -> break
    od
  }
}

ltl done { <> (status == DONE) }
#endif

/* The dispatcher (tasks/worker/dispatch.py): a check of its own, -DDISPATCH=1 (nothing above runs in
   it). Two beats' dispatchers, each calling dispatch_due again and again (beat's hourly
   catch-up); the schedule reaching WEEKS weeks one after another; a dispatcher that may die for
   good anywhere (provably gone on its host, or on another host where only its claim's TTL frees
   the week: both are tried); a live dispatcher's claim expiring under it (a pause past
   CLAIM_TTL_S, STALLS); the broker refusing a publish (REFUSED).
   Abstractions:
   - A week's marker digest:dispatched:<run> is FREE, HELD ("claimed by <process>", with its
     TTL) or MARKED (the long-lived marker). "Published" is the run enqueued (a ghost, never
     undone); a week enqueued twice is two deliveries of one run, which the run's journal makes
     one email (the checks above).
   - The watermark key holds a week, 0 before the first: the model starts with one written; a
     first deployment, which writes the week before the latest, owes nothing before it.
   - catch_up_weeks covers every week the model reaches: a beat down for longer than it skips
     weeks by design, outside the property.
   - Each Redis command is one step; what the dispatcher computes from its answer (the next
     week, gap, upto) goes in the same step: no other process reads it. The clock's `now` and
     the watermark's GET are one step: a clock read earlier only makes `now` older, and a
     watermark beyond it finds no week to look at.
   - WEEKS is 2 (3 is over 20M states): two weeks already give a gap before a published week.
   Map: SET NX EX, GET, SET XX EX ........ _claim; enqueue / DEL and raise / SET EX ........
   the body of dispatch_due's loop; gap, upto ........ `gap`, `published`; SET the watermark
   ........ its last lines. */
#if DISPATCH
#ifndef WEEKS
#define WEEKS 2                                     /* 2 or 3: TTL(x) and Stall below */
#endif
#ifndef DEATHS
#define DEATHS 1
#endif
#ifndef STALLS
#define STALLS 1
#endif
#ifndef REFUSED
#define REFUSED 1
#endif

#define FREE 0                                      /* the week's marker: none */
#define HELD 1                                      /* "claimed by <process>", CLAIM_TTL_S */
#define MARKED 2                                    /* the long-lived marker: published */

#define OURS 1                                      /* Held, as one dispatch found the week */
#define PUBLISHED 2
#define ELSEWHERE 3
#define CLAIMANT 4                                  /* a claim: whose process may be gone */

byte reached;                 /* weeks the schedule has reached: weeks 1..reached are due */
byte marker[WEEKS + 1];       /* digest:dispatched:<week>; [0] unused */
byte owner[WEEKS + 1];        /* the dispatcher a HELD marker names, k + 1; 0: none */
bool gone[WEEKS + 1];         /* ... whose process is gone: provably so on its host */
byte watermark;               /* digest:dispatch_watermark; 0: before week 1 */
bool published[WEEKS + 1];    /* ghost: the week's run was enqueued, at least once */
byte npublished;              /* ghost: how many weeks were */
byte deaths, stalls, refused;
bool dkill[2];

#define FREED(x) marker[x] = FREE; owner[x] = 0; gone[x] = 0

proctype Dispatcher(byte k) {
  byte now, raw, upto, w, held, i;
  bool gap;
end:
  do
  :: {
       atomic {
         now = reached;                               /* run_ids_due(now): weeks 1..now */
         raw = watermark;                             /* GET the watermark */
         upto = raw; gap = 0; w = raw + 1
       };
       do
       :: atomic { w > now -> w = 0 }; break
       :: else ->
          atomic {                                    /* _claim: SET NX EX */
            if
            :: marker[w] == FREE -> marker[w] = HELD; owner[w] = k + 1; held = OURS
            :: else -> held = 0
            fi
          };
          if
          :: held == 0 ->
             atomic {                                 /* GET */
               if
               :: marker[w] == FREE -> held = ELSEWHERE   /* expired since: look again */
               :: marker[w] == MARKED -> held = PUBLISHED
               :: marker[w] == HELD && gone[w] -> held = CLAIMANT   /* provably gone */
               :: marker[w] == HELD -> held = ELSEWHERE   /* alive, or gone elsewhere */
               fi
             };
             if
             :: held == CLAIMANT ->                   /* SET XX EX: takes it over */
                atomic {
                  if
                  :: marker[w] != FREE -> marker[w] = HELD; owner[w] = k + 1; gone[w] = 0; held = OURS
                  :: else -> held = ELSEWHERE
                  fi
                }
             :: else -> skip
             fi
          :: else -> skip
          fi;
          if
          :: held == OURS ->
             if
             :: atomic {                              /* enqueue */
                  if
                  :: !published[w] -> published[w] = 1; npublished++
                  :: else -> skip                     /* twice: two deliveries of one run */
                  fi
                }
             :: atomic { refused < REFUSED -> refused++ };   /* the broker refused it: */
                atomic { FREED(w); goto over }              /* DEL the marker, and raise */
             fi;
             atomic { marker[w] = MARKED; owner[w] = 0; gone[w] = 0 }   /* SET EX 400 days */
          :: else -> skip
          fi;
          atomic {
#ifndef WATERMARK_PAST_CLAIM
            gap = gap || held == ELSEWHERE;
#endif
            if :: !gap -> upto = w :: else -> skip fi;
            held = 0; w++
          }
       od;
       if
       :: atomic { upto != raw ->
            i = 1;                                    /* SET the watermark */
            do
            :: i <= upto -> assert(published[i] || D1); i++
            :: else -> break
            od;
            i = 0;
            watermark = upto
          }
       :: else -> skip
       fi;
over:  atomic { now = 0; raw = 0; upto = 0; w = 0; held = 0; gap = 0 }
     } unless {
       dkill[k] ->                                    /* SIGKILL, the host gone: for good */
       d_step {
         i = 1;
         do
         :: i <= WEEKS -> if :: marker[i] == HELD && owner[i] == k + 1 -> gone[i] = 1 :: else -> skip fi; i++
         :: else -> break
         od;
         i = 0
       };
       goto died
     }
  od;
died:
  skip
}

active proctype Schedule() {                         /* a Monday comes */
  do
  :: reached < WEEKS -> reached++
  :: else -> break
  od
}

/* A claim runs out: a dead dispatcher's always does (fair, unbounded), a live one's when it
   pauses past CLAIM_TTL_S (STALLS). */
#ifdef CLAIM_NEVER_EXPIRES
#define TTL(x) :: false
#else
#define TTL(x) :: d_step { marker[x] == HELD && gone[x] -> FREED(x) }
#endif
active proctype ClaimTTL() {
end:
  do
  TTL(1)
  TTL(2)
#if WEEKS > 2
  TTL(3)
#endif
  od
}

#ifdef CLAIM_NEVER_EXPIRES
#define STALL(x)
#else
#define STALL(x) :: d_step { stalls < STALLS && marker[x] == HELD && !gone[x] -> FREED(x); stalls++ }
#endif
active proctype Stall() {
  do
  STALL(1)
  STALL(2)
#if WEEKS > 2
  STALL(3)
#endif
  :: break
  od
}

active proctype Reaper() {
  do
  :: d_step { deaths < DEATHS -> deaths++; dkill[0] = 1 }
  :: d_step { deaths < DEATHS -> deaths++; dkill[1] = 1 }
  :: break
  od
}

init {
  atomic { run Dispatcher(0); run Dispatcher(1) }
}

ltl published { <> (npublished == WEEKS) }
#endif

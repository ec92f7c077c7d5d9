/*
 * The run protocol of journal/, checked exhaustively with SPIN.
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
 *   Two checks (tests/journal/test_model.py): the journal one (-DSLEEP=1, the default: sleep
 *   and sweep, no effect) and the effect one (-DSLEEP=0 -DEFFECT=1 -DSWEEPERS=0): the effect
 *   reads nothing of the due index or the sleep, and together they are 36M states.
 * - Time for the effect is discrete ticks: `sage` counts them since the claim on the server's
 *   clock (the claim's deadline is TIMEOUT ticks later), `lage[w]` since the worker's own
 *   claimed_at (time.monotonic(), taken before the claim request, so it is never younger).
 * - The effect's one assumption (journal/effects.py, tasks/mail.py): the irreversible moment
 *   (the server accepting DATA) happens within the effect's timeout of claimed_at or not at
 *   all; the timeout is the SMTP timeout, so a sender frozen past it finds its session gone.
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
 *   update_meta(WAITING), index, release
 *                                    Journal._suspend -> Journal._close: journal/lua/close.lua
 *                                    (status, ZADD due at the wake-up, DEL lease)
 *   update_meta(DONE), index(ABSENT), release
 *                                    Journal._finish -> Journal._close: close.lua (status,
 *                                    ZREM due, DEL lease)
 *   claim .......................... journal/lua/claim_due.lua via Journal.claim_due and
 *                                    Durable.sweep (durable.py)
 *   effect_claim ................... journal/lua/effect_claim.lua via Effect.claim (effects.py),
 *                                    with its wait for a live earlier claim and the proof that
 *                                    the claimant's process is gone (ARGV[6])
 *   la = lage[id]; renew ........... Effect.confirm -> Heartbeat.confirm: renew.lua, `asked`
 *                                    read before the request; the timeout check
 *   the act ........................ SmtpMailer._deliver: DATA answered (envelope.transmit)
 *   settle(SETTLED) ................ effect.accepted: journal/lua/effect_settle.lua "done"
 *   settle(RELEASED) ............... run_effect -> Effect.release: effect_settle.lua "released"
 *
 * Safety (assertions; pan -DNOCLAIM):
 *   R1  a step is recorded only by the holder whose acquisition is the latest (fence == my)
 *   R2  a recorded step is never overwritten; a run is done only with every step recorded
 *   M1  a meta transition is written only by the latest holder
 *   M2  a done run stays done
 *   I1  an index write lands only for the latest holder
 *   S1  a sweeper claims only the due entry it read: two sweepers never claim one entry
 *   E1  the irreversible moment is passed only under the current claim: after a newer
 *       holder claims the effect, no older one acts
 *   E2  no act after a receipt; at most one act, plus one per window (a claim superseded
 *       after its act, its receipt never saved); every window costs a crash or an expiry;
 *       a repeat is a resumed claim (it carries the same Message-ID)
 * Liveness (ltl `done`, pan -a -f: weak fairness), in the journal check: while deliveries
 *   keep arriving, the run ends done. (The effect check's liveness search is ten times its
 *   4.1M safety states: over the test's time budget.)
 * A known limit, checked to fail (tests/journal/test_model.py keeps it honest):
 *   -DEFFECT_LEASE "no effect start by a holder after another's acquisition": a holder that
 *                  confirmed, then paused before DATA, acts after a newer holder acquired;
 *                  the lease cannot serialize an act outside Redis, the claim does (E1).
 * Mutants (each must be refuted with a trail):
 *   -DNO_RECORD_FENCE   record.lua without the lease comparison            -> R1
 *   -DOVERWRITE         record.lua with HSET for HSETNX and no comparison  -> R2
 *   -DNO_META_FENCE     close.lua without the lease comparison             -> M1
 *   -DUNFENCED_INDEX    index writes as plain commands after the fenced script (as they
 *                       were before open.lua and close.lua took them in): a paused holder's ZADD/ZREM lands after
 *                       a newer holder's acquisition                        -> I1
 *   -DSPLIT_CLAIM       claim_due as ZRANGEBYSCORE then ZADD, not a script -> S1
 *   -DNO_RECHECK        Journal.execute trusts the meta it read before acquiring: a delivery
 *                       that read `running` before another finished re-opens the done run -> M2
 *   -DCLAIM_SKIPPED     effect_claim.lua ignores a live claim of an older fence -> E1
 *   -DSTAMP_AFTER_REPLY claimed_at taken after the claim's reply: confirm trusts a claim
 *                       older than it thinks, and acts past its deadline    -> E1
 *   -DRECEIPT_IGNORED   the mailer sends although effect.earlier holds a receipt -> E2
 *   -DNO_RELEASE        a suspending run keeps its lease: once expiries run out, no later
 *                       delivery can take the run                      -> ltl done
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
   effect's safety does not read the due index, and together they are 36M states). */
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

/* the effect: its claim's state in the effects hash, and its timeout in ticks */
#define CLAIMED 1
#define SETTLED 2
#define RELEASED 3
#ifndef TIMEOUT
#define TIMEOUT 2
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
hidden byte R1, R2, M1, M2, I1, S1, E1, E2, EFFECT_UNDER_LEASE;

/* Redis */
byte lease;          /* journal:{RUN}:lease, as its fence; 0: no key */
byte fence;          /* journal:{RUN}:fence */
bool rec[STEPS];     /* journal:{RUN}:steps: whether each step is recorded */
byte status;         /* journal:{RUN}:meta status */
byte due;            /* the run's entry in journal:due */
bool fresh[2];       /* ghost: sweeper k read the entry and no sweeper claimed it since */

byte cf;             /* journal:{RUN}:effects "send": the claimant's fence; 0: no claim */
byte cstate;         /* ... and its state: CLAIMED, SETTLED (done) or RELEASED */
bool receipt;        /* "send:receipt" */
byte sage;           /* ticks since the claim, by the server's clock (saturates at TIMEOUT) */
bool cdead;          /* the claimant's process crashed: provably gone on its host */

/* ghosts of the outside world */
byte lage[WORKERS];  /* ticks since each worker's claimed_at (time.monotonic()), saturating */
byte acts;           /* emails the SMTP server accepted */
byte windows;        /* claims superseded after their act, with no receipt: the window */
bool acted;          /* the current claim's holder passed its irreversible moment */

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

inline settle(state) {                               /* effect_settle.lua */
  d_step {
    if
    :: lease == my && cf == my ->
       cstate = state; ok = 1;
       if :: state == SETTLED -> receipt = 1 :: else -> skip fi
    :: else -> ok = 0                                  /* -1 / -2 / -3 */
    fi
  }
}

/* The delivery ends with an exception while its lease may still be live: the heartbeat stops
   and the lease runs out, one of the EXPIRIES (no process is gone: no takeover before that). */
inline leave() {
  goto start
}

inline heartbeat() {
  if
  :: skip                                             /* no renewal due before this step */
  :: d_step { if :: lease == my -> ok = 1 :: else -> ok = 0 fi };   /* renew.lua */
     if
#if SWEEPERS
     :: ok ->                                         /* on_renew: ZADD due, fenced */
        index(ARMED)                                  /* renew.lua */
#else
     :: ok -> skip
#endif
     :: else -> goto start                            /* lost: ensure() raises LeaseLost */
     fi
  fi
}

proctype Worker(byte id) {
  byte my;
  byte ok;
  bool seen[STEPS];
  bool proved, resumed, earlier;
  byte la;
start:
  atomic { my = 0; ok = 0; seen[WORK] = 0; seen[NAP] = 0; seen[SEND] = 0; lage[id] = TIMEOUT };
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
    d_step { seen[WORK] = rec[WORK]; seen[NAP] = rec[NAP]; seen[SEND] = rec[SEND] };   /* _open */

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
    /* run.effect("send", mailer.send): journal/effects.py, tasks/mail.py SmtpMailer */
    if
    :: seen[SEND] -> skip
    :: else ->
       heartbeat();                                   /* check_lease */
claim:
       if                                             /* the claimant proved gone (holder.py)? */
       :: proved = cdead
       :: proved = 0                                  /* another host: nothing proved */
       fi;
#ifndef STAMP_AFTER_REPLY
       lage[id] = 0;                                  /* Effect.claim: claimed_at, before */
#endif
       d_step {                                       /* effect_claim.lua */
         if
         :: lease != my -> ok = 0                     /* {-1} / {-2}: LeaseLost */
#ifndef CLAIM_SKIPPED
         :: lease == my && cstate == CLAIMED && cf != my && sage < TIMEOUT && !proved ->
            ok = 2                                    /* {3, remaining}: it may still act */
#endif
         :: else ->
            if
            :: acted && !receipt -> windows++         /* superseded after its act, no receipt */
            :: else -> skip
            fi;
            assert(windows <= crashes + expiries || E2);   /* each window costs a loss */
            resumed = (cstate != 0); earlier = receipt;
            cf = my; cstate = CLAIMED; sage = 0; cdead = 0; acted = 0;
            ok = 1
         fi
       };
#ifdef STAMP_AFTER_REPLY
       lage[id] = 0;                                  /* claimed_at, after the reply */
#endif
       if
       :: ok == 0 -> goto start
       :: ok == 2 -> heartbeat(); goto claim          /* sleep(remaining); ensure(); again */
       :: else -> skip
       fi;
       if
#ifndef RECEIPT_IGNORED
       :: earlier -> skip                             /* effect.earlier: sent, not again */
#endif
       :: else ->
          /* SmtpMailer._deliver: connect, MAIL, RCPT; then effect.confirm() */
          la = lage[id];                              /* asked: before the renew request */
          d_step { if :: lease == my -> ok = 1 :: else -> ok = 0 fi };   /* renew.lua */
          if
          :: !ok || la >= TIMEOUT ->                  /* LeaseLost: no DATA; run_effect */
             settle(RELEASED);                        /* releases the claim if it still can */
             leave()
          :: else -> skip
          fi;
          /* DATA. The timeout bounds every SMTP operation: a sender frozen past it after
             confirm finds its session gone (the assumption the effect's timeout stands on). */
          if
          :: d_step {
               lage[id] < TIMEOUT ->                  /* the server accepts DATA */
               assert(cf == my || E1);                /* only under the current claim */
               assert(!receipt || E2);                /* never after a receipt */
               assert(acts <= windows || E2);         /* once, plus one per window */
               assert(acts == 0 || resumed || E2);    /* a repeat keeps the Message-ID */
#ifdef EFFECT_LEASE
               assert(fence == my || EFFECT_UNDER_LEASE);
#endif
               acts++; acted = 1
             }
          :: lage[id] >= TIMEOUT ->                   /* MailUnavailable: timed out */
             settle(RELEASED); leave()
          fi;
          settle(SETTLED);                            /* effect.accepted(receipt) */
          if :: !ok -> goto start :: else -> skip fi
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
      :: my != 0 && cf == my && cstate == CLAIMED -> cdead = 1
      :: else -> skip
      fi;
      proved = 0; resumed = 0; earlier = 0; la = 0
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
       cstate == CLAIMED && sage < TIMEOUT || lage[0] < TIMEOUT || lage[WORKERS - 1] < TIMEOUT ->
       if :: cstate == CLAIMED && sage < TIMEOUT -> sage++ :: else -> skip fi;
       if :: lage[0] < TIMEOUT -> lage[0]++ :: else -> skip fi;
       if :: lage[WORKERS - 1] < TIMEOUT -> lage[WORKERS - 1]++ :: else -> skip fi
     }
  od
}

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

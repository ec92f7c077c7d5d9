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
 * - The workflow: one step ("work"), a durable sleep ("sleep:nap"), then finish. `woke` is
 *   the sleep's wake-up time having passed.
 * - Not modelled: cancel (cancel.lua), parking, signals and retry waits: each is one more
 *   fenced field of the same scripts, and adds states without adding an interleaving kind.
 *
 * Map of model steps to the code they stand for:
 *   meta read ...................... Journal.execute: self.meta(keys), TERMINAL check (store.py)
 *   meta read again ................ Journal.execute: the TERMINAL check under the lease
 *   acquire ........................ journal/lua/acquire.lua via Lease.acquire (lease.py),
 *                                    including the dead-holder takeover (ARGV[5], holder.py)
 *   update_meta(RUNNING) ........... journal/lua/update_meta.lua via Journal._announce
 *   index(ARMED) after announce .... the pipeline ZADD runs / ZADD due in Journal._announce
 *   snapshot ....................... Journal._open: HGETALL steps
 *   heartbeat ...................... Heartbeat._renew: journal/lua/renew.lua, then the
 *                                    on_renew hook Journal._push_due (ZADD XX due)
 *   record(s) ...................... Run._record -> Run._write: journal/lua/record.lua
 *   update_meta(WAITING), index, release
 *                                    Journal._suspend: update_meta.lua, pipeline ZADD due
 *                                    (wake-up), journal/lua/release.lua
 *   update_meta(DONE), index(ABSENT), release
 *                                    Journal._finish / _settle: update_meta.lua, ZREM due,
 *                                    release.lua
 *   claim .......................... journal/lua/claim_due.lua via Journal.claim_due and
 *                                    Durable.sweep (durable.py)
 *
 * Safety (assertions; pan -DNOCLAIM):
 *   R1  a step is recorded only by the holder whose acquisition is the latest (fence == my)
 *   R2  a recorded step is never overwritten; a run is done only with every step recorded
 *   M1  a meta transition is written only by the latest holder
 *   M2  a done run stays done
 *   S1  a sweeper claims only the due entry it read: two sweepers never claim one entry
 * Liveness (ltl `done`, pan -a -f: weak fairness): while deliveries keep arriving, the run
 *   ends done.
 * A known gap, checked to fail (tests/journal/test_model.py keeps it honest):
 *   -DINDEX_FENCE  "no index write by a holder after another's acquisition": the due index
 *                  writes are plain commands after the fenced meta write (the indexes are kept
 *                  out of per-run scripts for Redis Cluster), so a paused holder's ZADD/ZREM
 *                  can land after a newer holder's acquisition.
 * Mutants (each must be refuted with a trail):
 *   -DNO_RECORD_FENCE   record.lua without the lease comparison            -> R1
 *   -DOVERWRITE         record.lua with HSET for HSETNX and no comparison  -> R2
 *   -DNO_META_FENCE     update_meta.lua without the lease comparison       -> M1
 *   -DSPLIT_CLAIM       claim_due as ZRANGEBYSCORE then ZADD, not a script -> S1
 *   -DNO_RECHECK        Journal.execute trusts the meta it read before acquiring: a delivery
 *                       that read `running` before another finished re-opens the done run -> M2
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
#ifndef EARLY
#define EARLY 1
#endif

#define STEPS 2
#define WORK 0
#define NAP 1

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
hidden byte R1, R2, M1, M2, S1, INDEX_WRITES_FENCED;

/* Redis */
byte lease;          /* journal:{RUN}:lease, as its fence; 0: no key */
byte fence;          /* journal:{RUN}:fence */
bool rec[STEPS];     /* journal:{RUN}:steps: whether each step is recorded */
byte status;         /* journal:{RUN}:meta status */
byte due;            /* the run's entry in journal:due */
bool fresh[2];       /* ghost: sweeper k read the entry and no sweeper claimed it since */

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
       :: new == DONE -> assert(rec[WORK] && rec[NAP] || R2)   /* nothing lost */
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

/* A plain command on journal:due, after the fenced script that justified it. */
inline index(v) {
  d_step {
#ifdef INDEX_FENCE
    assert(fence == my || INDEX_WRITES_FENCED);
#endif
    due = v
  }
}

inline release() {
  d_step {
    if
    :: lease == my -> lease = 0                        /* compare-and-DEL */
    :: else -> skip
    fi
  }
}

inline heartbeat() {
  if
  :: skip                                             /* no renewal due before this step */
  :: d_step { if :: lease == my -> ok = 1 :: else -> ok = 0 fi };   /* renew.lua */
     if
     :: ok ->                                         /* on_renew: ZADD XX due */
        d_step {
#ifdef INDEX_FENCE
          assert(fence == my || INDEX_WRITES_FENCED);
#endif
          if
          :: due != ABSENT -> due = ARMED
          :: else -> skip
          fi
        }
     :: else -> goto start                            /* lost: ensure() raises LeaseLost */
     fi
  fi
}

proctype Worker(byte id) {
  byte my;
  bool ok;
  bool seen[STEPS];
start:
  atomic { my = 0; ok = 0; seen[WORK] = 0; seen[NAP] = 0 };
  {
    /* Journal.execute: the meta read; a terminal run is already-done */
    if
    :: status == DONE -> goto retire
    :: else -> skip
    fi;
    /* acquire.lua: SET NX, or take over a holder proved dead */
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
    update_meta(RUNNING);                             /* _announce */
    if :: !ok -> goto start :: else -> skip fi;
    index(ARMED);                                     /* ZADD due <lease deadline> */
    d_step { seen[WORK] = (rec[WORK] != 0); seen[NAP] = (rec[NAP] != 0) };   /* _open */

    /* run.step("work", ...) */
    if
    :: seen[WORK] -> skip                             /* replayed */
    :: else ->
       heartbeat();                                   /* check_lease */
       record(WORK);
       if :: !ok -> goto start :: else -> skip fi
    fi;

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

    /* Journal._finish, _settle */
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
      fi
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

"""Start the ranks of a CPU test job and wait for rank 0's report (shared by the harnesses)."""

import multiprocessing as mp
import queue


def rank0_report(target, world, args):
    """Run `target(rank, *args, out_q)` in `world` spawned processes; return what rank 0 puts on
    `out_q`. A rank that dies stops the others (its traceback is on stderr) with SystemExit."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r,) + tuple(args) + (q,)) for r in range(world)]
    for p in procs:
        p.start()
    while True:
        try:
            seen = q.get(timeout=5)
            break
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit("a rank exited with %s" % dead[0])
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit("rank exited with %s" % p.exitcode)
    return seen

"""How many threads a parallel kernel can use now: its thread count, at most the CPUs that the
machine's other runnable threads leave free, and at least one.

A parallel region ends when its slowest thread does.  When the machine has more runnable
threads than CPUs (other processes, or another pool's workers spinning between their own
regions: torch's OpenMP threads, OpenBLAS's), a thread of the region waits for a core, up to a
scheduler time slice, and the whole region waits for it.  On a loaded 2-CPU machine, 2-thread
kernels inside a torch training step ran 10-30x slower than the same kernels on one thread,
which only wait for their own core.  So before a parallel call (jit.call) the number of
runnable threads on the machine is read from the kernel (Linux: the fourth field of
/proc/loadavg, an instant count that includes the calling thread), at most once every
INTERVAL seconds, and the call runs on `min(threads, CPUs - other runnable threads)`.  The
thread count never changes a result (schedule.py's plans do not depend on it), only how fast
it comes.  The process's own pool is not counted against itself: numba's TBB workers stay
runnable (spinning, then yielding) for 2-5 ms after a parallel call (a 2-thread kernel on
2 CPUs: its worker was runnable 0.1 ms after the call in 100% of 40 tries, 2 ms after in 78%,
5 ms after in 12%), so a reading taken within OWN_SPIN seconds of the end of a call on m
threads counts m - 1 fewer other threads.  Under the torch frontend torch's intra-op workers
(torch.get_num_threads() - 1; jit.thread_budget's `pool`) are not counted either: they spin
after each torch op (libgomp's default wait policy), the calls of a model run between torch
ops, and counted they sent a 2-thread kernel to one thread right after a torch op (an `exp`
statement over 4096x512: 3.3 ms, against 2.25 ms on 2 threads and 1.9 ms on an idle
machine).

`TULLIO_LOAD_AWARE=0` in the environment turns this off (every call uses its thread count),
for measurements that must use a fixed number of threads; where /proc/loadavg cannot be read
it is off too.
"""
from __future__ import annotations

import os
import time

INTERVAL = 0.005        # seconds a reading of the runnable count is used for
OWN_SPIN = 0.005        # seconds the pool's workers may stay runnable after a parallel call
PATH = "/proc/loadavg"


def free_cpus(cpus: int, running: int, own: int = 0) -> int:
    """CPUs not taken by other threads when `running` threads are runnable on the machine,
    the caller's own included, `own` of them the caller's pool's workers (at least 1)."""
    return max(1, cpus - max(running - 1 - own, 0))


def parse_running(text: str) -> int | None:
    """The runnable count in a /proc/loadavg line ('0.52 0.58 0.59 3/467 1234'), else None."""
    parts = text.split()
    if len(parts) < 4 or "/" not in parts[3]:
        return None
    head = parts[3].split("/", 1)[0]
    return int(head) if head.isdigit() else None


class Load:
    """The machine's runnable-thread count, read from `path` at most every `interval` seconds
    (`clock`: a monotonic clock), and the thread limit it implies."""
    __slots__ = ("path", "interval", "clock", "enabled", "cpus", "at", "running", "ended",
                 "threads")

    def __init__(self, path: str = PATH, interval: float = INTERVAL, clock=time.monotonic,
                 enabled: bool | None = None, cpus: int | None = None):
        self.path, self.interval, self.clock = path, interval, clock
        if enabled is None:
            enabled = os.environ.get("TULLIO_LOAD_AWARE", "1").strip() != "0"
        self.enabled = enabled
        self.cpus = cpus if cpus is not None else _cpus()
        self.at, self.running = None, None
        self.ended, self.threads = None, 1     # end and threads of the last parallel call

    def ran(self, threads: int):
        """A parallel call on `threads` threads has just ended.  A call on one thread wakes no
        worker, so it leaves the record of the last call on more: that call's workers spin
        from its end whatever ran after it (recording the one-thread call instead counted
        them as other threads, and the next call went to one thread too: 1.6% of bench_suite's
        calls on 2 threads)."""
        if threads > 1:
            self.ended, self.threads = self.clock(), threads

    def read(self) -> int | None:
        """The runnable threads now, the caller included (a reading at most `interval` old),
        None where unknown."""
        now = self.clock()
        if self.at is not None and now - self.at < self.interval:
            return self.running
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                text = os.read(fd, 128).decode("ascii", "replace")
            finally:
                os.close(fd)
            running = parse_running(text)
        except OSError:
            running = None
        if running is None:
            self.enabled = False        # no such count here: stop looking
        self.at, self.running = now, running
        return running

    def limit(self, threads: int, pool: int = 0) -> int:
        """The threads a parallel call asking for `threads` runs on now; `pool`: workers of
        the caller's own other pool (torch's intra-op threads) not counted as other threads."""
        if threads <= 1 or not self.enabled:
            return threads
        running = self.read()
        if running is None:
            return threads
        recent = self.ended is not None and self.clock() - self.ended < OWN_SPIN
        own = (self.threads - 1 if recent else 0) + pool
        return min(threads, free_cpus(self.cpus, running, own))


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


machine = Load()        # the process's reader (jit.call asks it)

"""Measure where threads start to pay on this machine: a numba prange loop against a serial
loop over the same trivial body (one read, one multiply-add, one write per iteration).

schedule.PARALLEL_WORK_THRESHOLD (iterations x body cost) is set from the crossover this prints.

    python benchmarks/threshold.py
"""
import timeit

import numpy as np
from numba import njit, prange


@njit(parallel=True)
def par(a, b):
    for i in prange(a.shape[0]):
        b[i] = a[i] * 2.0 + 1.0


@njit
def ser(a, b):
    for i in range(a.shape[0]):
        b[i] = a[i] * 2.0 + 1.0


def main():
    cross = None
    for n in [256, 1024, 4096, 8192, 16384, 32768, 65536, 262144]:
        a, b = np.ones(n), np.empty(n)
        par(a, b)
        ser(a, b)
        num = max(10, 200000 // n)
        tp = min(timeit.repeat(lambda: par(a, b), number=num, repeat=7)) / num * 1e6
        ts = min(timeit.repeat(lambda: ser(a, b), number=num, repeat=7)) / num * 1e6
        print(f"{n:8d} iterations: threads {tp:8.2f} us, serial {ts:8.2f} us")
        if cross is None and tp < ts:
            cross = n
    print(f"threads pay from about {cross} iterations")


if __name__ == "__main__":
    main()

"""Running a variant of a kernel's plan (blocking or lanes switched off) on the same inputs,
so a test can compare a specialised form with the plain loops it replaces."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tullio_py import codegen, jit


def run_variant(k, given: dict, got: np.ndarray, inputs: dict, out: np.ndarray, **changes):
    """`k.plan_for` the call with arrays `given` and result `got` (its dtype and shape), with
    `changes` applied (`jam=()`, `lanes=0`), compiled and run into `out` reading `inputs`;
    returns the plan (the unchanged one)."""
    plan, key, low = k.plan_for(given, k.ranges(**given), got.dtype, got.shape)
    src = codegen.render(replace(plan, **changes))
    fn = jit.load(src, "cpu", signature="plain " + repr(key))
    args = []
    for a in src.args:
        if a == k.equation.output:
            args.append(out)
        elif a.startswith(("_start_", "_stop_")):
            args.append(codegen.range_argument(a, low.ranges))
        elif a in low.bound_params:
            args.append(low.bound_params[a])
        else:
            args.append(inputs[a])
    fn(*args)
    return plan

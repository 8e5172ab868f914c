"""Command line: `python -m tullio_py "EXPR" [--grad] [--target cpu|cuda|python]` prints the
parsed equation, the gradient equations and the generated code; `python -m tullio_py demo` runs
a short tour."""
from __future__ import annotations

import argparse
import sys

from .errors import TullioError


def show(expr: str, grad: bool, target: str) -> int:
    from .kernel import kernel
    k = kernel(expr)
    print(f"equation:  {k.equation}")
    eq = k.equation
    print(f"indices:   left {', '.join(eq.lhs_indices) or '(scalar)'}; "
          f"reduced {', '.join(eq.reduction_indices) or '(none)'}")
    if grad:
        print("\ngradient equations:")
        lines = [line for eqs in k.gradient_equations.values() for line in eqs]
        for line in lines:
            print(f"  {line}")
        import re
        text = " ".join(lines)
        bounds = sorted(set(re.findall(r"\b(?:lo|hi)_\w+", text)))
        lengths = sorted(set(re.findall(r"\blen_\w+", text)))
        if bounds:
            print(f"  ({', '.join(bounds)}: the forward's range of that index, which depends on "
                  "the array shapes; after a call, kernel.gradient_equations shows the numbers)")
        if lengths:
            print(f"  ({', '.join(lengths)}: the length of that index's forward range -- a term "
                  "that no longer mentions the index was summed over it; after a call, "
                  "kernel.gradient_equations shows the numbers)")
    print(f"\n{target} code:\n")
    print(k.source(target=target))
    if grad:
        print(f"\n{target} gradient code:\n")
        print(k.source(target=target, grad=True))
    return 0


def demo() -> int:
    import time

    import numpy as np

    from . import kernel, tullio
    rng = np.random.default_rng(0)
    print("tullio_py demo: one-line index notation compiled with numba\n")
    A, B = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    C = tullio("C[i,k] := A[i,j] * B[j,k]", A=A, B=B)
    print(f'1. matmul   C[i,k] := A[i,j] * B[j,k]        max |C - A@B| = {abs(C - A @ B).max():.2e}')
    M = tullio("(max) M[i] := A[i,j]", A=A)
    print(f'2. row max  (max) M[i] := A[i,j]            equal to A.max(1): {np.array_equal(M, A.max(1))}')
    x, h = rng.standard_normal(10), rng.standard_normal(3)
    y = tullio("y[i+j] := x[i] * h[j]", x=x, h=h)
    print(f'3. full convolution  y[i+j] := x[i] * h[j]  max |y - np.convolve| = '
          f'{abs(y - np.convolve(x, h)).max():.2e}')
    n = tullio("n[i] := A[i,j]**2 |> sqrt", A=A)
    print(f'4. finaliser  n[i] := A[i,j]**2 |> sqrt     max |n - norm| = '
          f'{abs(n - np.linalg.norm(A, axis=1)).max():.2e}')
    x4 = rng.standard_normal((16, 16, 4, 8)).astype(np.float32)
    W = rng.standard_normal((16, 16, 3, 3, 4, 8)).astype(np.float32)
    expr = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
    k = kernel(expr)
    t0 = time.perf_counter()
    out = k(x=x4, W=W)
    t1 = time.perf_counter()
    out = k(x=x4, W=W)
    t2 = time.perf_counter()
    print(f"5. local convolution {expr}\n   out {out.shape}: first call {t1 - t0:.2f} s "
          f"(compile or disk cache), second call {1e3 * (t2 - t1):.2f} ms")
    if hasattr(k, "vjp"):
        g = k.vjp(np.ones_like(out), x=x4, W=W)
        print(f"   gradients: {', '.join(f'd{n} {v.shape}' for n, v in g.items())}")
        for name, eqs in k.gradient_equations.items():
            for line in eqs:
                print(f"     {line}")
    print("\n   generated forward code:\n")
    print("\n".join("     " + ln for ln in k.forward_code.splitlines()))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        return demo()
    p = argparse.ArgumentParser(prog="python -m tullio_py", description=__doc__)
    p.add_argument("expr", help='a statement, e.g. "C[i,k] := A[i,j] * B[j,k]", or "demo"')
    p.add_argument("--grad", action="store_true", help="also print gradient equations and code")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda", "python"])
    args = p.parse_args(argv)
    try:
        return show(args.expr, args.grad, args.target)
    except TullioError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

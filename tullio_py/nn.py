"""torch layers built on one tullio_py expression.  torch is imported when a layer is first
used (`tullio_py.nn.LocallyConnected2d`), not by `import tullio_py.nn`.

LocallyConnected2d is a convolution whose weights differ at every output position (no weight
sharing), "valid" (no padding), stride 1:

    out[s, t, c2, b] := x[s+i, t+j, c1, b] * W[s, t, i, j, c1, c2]      (+ bias[c2, s, t])

The layer takes and returns torch's (batch, channels, H, W) tensors; inside, the input is
copied once to (H, W, channels, batch) so that the batch index runs innermost and contiguous in
the forward and in both gradients, with the weight read hoisted out of that loop.

Weight layout W[s, t, i, j, c1, c2]: the weights of one output position are one contiguous
block of kh*kw*c1*c2 values, and the part one window offset (i, j) reads is contiguous inside
it.  The forward reads each position's block whole; the input gradient, a gather
dx[p,q,c1,b] += dout[p-i,q-j,c2,b] * W[p-i,q-j,i,j,c1,c2], reads at each (p, q) the
c1*c2 values of offset (i, j) from nine blocks; the weight gradient writes each block whole.
In the layout W[c1, i, j, c2, s, t] one position's 1152 values (8 -> 16 channels, 3x3) lay on
1152 cache lines 3.6 KB apart.  LocallyConnected2d, batch 16, 8->16 channels, 32x32, 3x3,
float32, forward + backward under torch autograd, one thread, median of 21 (AMD Zen 4):
W[c1,i,j,c2,s,t] 8.8-10.7 ms, W[s,t,c1,i,j,c2] 6.5-7.6 ms, W[s,t,i,j,c1,c2] 4.8-5.6 ms
(benchmarks/bench_layers.py has the side-by-side run).  Permuted to (oh, ow, c1, kh, kw, c2)
and reshaped to (oh*ow, c1*kh*kw, c2) it is the operand of the same layer written as a batched
matmul over positions after `unfold` (einsum "bkl,lko->bol").

Initialisation follows torch's Conv2d: kaiming_uniform_(a=sqrt(5)) with fan_in = c1*kh*kw,
i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
"""
from __future__ import annotations

import math

EXPRESSION = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s,t,i,j,c1,c2]"
_CLASSES: dict = {}


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def _build():
    import torch
    from .kernel import kernel

    class LocallyConnected2d(torch.nn.Module):
        """Locally connected 2-d layer: input (batch, in_channels, H, W), output
        (batch, out_channels, H-kh+1, W-kw+1).  Weight (oh, ow, kh, kw, in_channels,
        out_channels); bias (out_channels, oh, ow) or None."""

        def __init__(self, in_channels: int, out_channels: int, in_size, kernel_size,
                     bias: bool = True, dtype=None, device=None):
            super().__init__()
            h, w = _pair(in_size)
            kh, kw = _pair(kernel_size)
            if not (0 < kh <= h and 0 < kw <= w):
                raise ValueError(f"kernel_size {(kh, kw)} does not fit in in_size {(h, w)}")
            self.in_channels, self.out_channels = in_channels, out_channels
            self.in_size, self.kernel_size = (h, w), (kh, kw)
            self.out_size = (h - kh + 1, w - kw + 1)
            oh, ow = self.out_size
            kw_ = dict(dtype=dtype, device=device)
            self.weight = torch.nn.Parameter(
                torch.empty(oh, ow, kh, kw, in_channels, out_channels, **kw_))
            self.bias = torch.nn.Parameter(torch.empty(out_channels, oh, ow, **kw_)) \
                if bias else None
            self._kernel = kernel(EXPRESSION)
            self.reset_parameters()

        def reset_parameters(self):
            # kaiming_uniform_(a=sqrt(5)) as in torch's Conv2d, with the fan-in of this layout
            fan_in = self.in_channels * self.kernel_size[0] * self.kernel_size[1]
            gain = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
            bound = gain * math.sqrt(3.0 / fan_in)
            with torch.no_grad():
                self.weight.uniform_(-bound, bound)
                if self.bias is not None:
                    b = 1 / math.sqrt(fan_in)
                    self.bias.uniform_(-b, b)

        def forward(self, x):
            if tuple(x.shape[-2:]) != self.in_size or x.shape[-3] != self.in_channels:
                raise ValueError(f"expected input (batch, {self.in_channels}, "
                                 f"{self.in_size[0]}, {self.in_size[1]}), got {tuple(x.shape)}")
            xs = x.permute(2, 3, 1, 0).contiguous()            # (H, W, C, batch)
            out = self._kernel(x=xs, W=self.weight).permute(3, 2, 0, 1)   # (batch, C2, S, T)
            return out.contiguous() if self.bias is None else out + self.bias

        def extra_repr(self):
            return (f"{self.in_channels}, {self.out_channels}, in_size={self.in_size}, "
                    f"kernel_size={self.kernel_size}, bias={self.bias is not None}")

    return {"LocallyConnected2d": LocallyConnected2d}


def __getattr__(name: str):
    if name in ("LocallyConnected2d",):
        if not _CLASSES:
            _CLASSES.update(_build())
        return _CLASSES[name]
    raise AttributeError(f"module 'tullio_py.nn' has no attribute {name!r}")

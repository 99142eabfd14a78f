"""DDP's gradient buckets in one layout from the first step on, so that a resumed run reduces as an uninterrupted one.

DistributedDataParallel reduces its first synchronised backward in its construction-time layout (every
parameter in one bucket, in definition order) and then rebuilds its buckets once, in the order gradients
became ready (reverse definition order for a model whose forward runs its modules in that order). Gloo and
NCCL sum each element of a bucket over the ranks in an order that depends on where the element lies in the
bucket (a ring starts each segment at another rank; NCCL splits a buffer likewise): on 3 or more ranks the same gradients reduced in two
layouts differ in their last bits (measured over gloo: the same values all-reduced at two offsets of one
buffer differ by up to 2.4e-7 on 3 ranks, 4.8e-7 on 4; 2 ranks add two numbers, whose order cannot matter).
A run resumed from a checkpoint wraps a new DDP, so its first step was reduced in the construction-time
layout where the uninterrupted run, long past its own first step, used the rebuilt one.
"""

from __future__ import annotations

from typing import Any

import torch


class _ReadyInReverse(torch.autograd.Function):
    """A backward that tells the reducer its parameters' gradients became ready, last parameter first."""

    @staticmethod
    def forward(ctx: Any, seed: torch.Tensor, reducer: Any, count: int) -> torch.Tensor:
        ctx.reducer, ctx.count = reducer, count
        return seed.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        # inside a backward: the reducer queues its end-of-backward work on the autograd engine
        for index in reversed(range(ctx.count)):
            ctx.reducer._autograd_hook(index)
        return grad, None, None


def fix_bucket_layout(ddp: Any) -> None:
    """Rebuild ``ddp``'s gradient buckets now, before its first backward, so no later step reduces in another layout.

    The layout is reverse parameter order (the order gradients become ready when the forward runs the
    modules in definition order, DDP's own first guess before it measures), cut into DDP's bucket sizes, so
    for such a model the gradient all-reduces still overlap the backward as after DDP's own rebuild. Getting there costs one all-reduce of zeros the size of
    the model (DDP's construction already broadcasts the whole model); the parameters' ``.grad`` are left as
    they were. Call it before registering a communication hook: the hook would see that all-reduce.

    Where DDP measures something in its first backward (``static_graph``) or reduces outside this path
    (sparse gradients, DDP's own mixed precision), the buckets are fixed in parameter order instead, as torch
    does for ranks that joined early (``Join``). With ``find_unused_parameters=True`` DDP never rebuilds: its
    layout is already fixed.
    """
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or getattr(ddp, "_use_python_reducer", False):
        return  # no C++ reducer (every parameter's all-reduce delayed, or compiled autograd's reducer)
    if ddp.find_unused_parameters and not ddp.static_graph:
        return
    params, sparse = ddp._build_params_for_reducer()
    if ddp.static_graph or any(sparse) or ddp.mixed_precision is not None:
        reducer._push_all_rebuilt_params()
    else:
        saved = [p.grad for p in params]
        for p in params:
            p.grad = None  # the reducer all-reduces what .grad holds: zeros here, whatever the user left there
        reducer.prepare_for_backward([])
        with torch.enable_grad():  # a module set up inside torch.no_grad() still needs this backward
            seed = torch.zeros((), requires_grad=True)
            _ReadyInReverse.apply(seed, reducer, len(params)).backward()
        for p, grad in zip(params, saved):
            p.grad = grad
    reducer._rebuild_buckets()

"""``Trainer(sync_batchnorm=True)``: BatchNorm layers whose training statistics cover every process's batch.

On CUDA (and the other devices torch supports) that is torch's SyncBatchNorm. torch's refuses the CPU,
so there ``CPUSyncBatchNorm`` does the same over gloo: the batch mean and variance are all-reduced
(differentiably, so the gradients are those of the whole batch) and the running statistics are
updated with the whole batch's values, as one process with the global batch would.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class CPUSyncBatchNorm(_BatchNorm):
    """BatchNorm over the batch of all processes (any input rank >= 2, channels in dimension 1), for gloo/CPU."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (N, C, ...), got {input.dim()}")

    def forward(self, input: Tensor) -> Tensor:
        import torch.distributed as dist

        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        self._check_input_dim(input)
        all_reduce = _SumOverProcesses.apply
        dims = [0, *range(2, input.dim())]
        channels = input.shape[1]
        count = torch.tensor([input.numel() / channels], dtype=input.dtype, device=input.device)
        # two passes (mean, then the mean squared deviation) for the accuracy of a one-process BatchNorm
        totals = all_reduce(torch.cat([input.sum(dims), count]))
        n = totals[-1]
        mean = totals[:channels] / n
        shape = [1, channels] + [1] * (input.dim() - 2)
        centred = input - mean.view(shape)
        var = all_reduce((centred * centred).sum(dims)) / n
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)  # type: ignore[union-attr,operator]
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        out = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


class _SumOverProcesses(torch.autograd.Function):
    """The sum of a tensor over all processes; its gradient is the sum of the processes' gradients."""

    @staticmethod
    def forward(ctx: object, tensor: Tensor) -> Tensor:  # type: ignore[override]
        import torch.distributed as dist

        out = tensor.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:  # type: ignore[override]
        import torch.distributed as dist

        out = grad.contiguous().clone()
        dist.all_reduce(out)
        return out


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` with its BatchNorm layers synchronised across processes (parameters and statistics kept)."""
    if not any(isinstance(m, _BatchNorm) and not _synced(m) for m in module.modules()):
        return module
    if device.type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _to_cpu_sync(module)


def _synced(module: nn.Module) -> bool:
    return isinstance(module, (nn.SyncBatchNorm, CPUSyncBatchNorm))


def _to_cpu_sync(module: nn.Module) -> nn.Module:
    out = module
    if isinstance(module, _BatchNorm) and not _synced(module):
        out = CPUSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, _to_cpu_sync(child))
    return out

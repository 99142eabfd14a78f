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


#: the class a converted layer had, kept on it so that ``revert_sync_batchnorm`` gives that class back
_ORIGINAL = "_torchfleet_batchnorm_class"


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` with its BatchNorm layers synchronised across processes (parameters and statistics kept).

    Children are replaced in place; the module itself is returned (a new one only when it is a BatchNorm).
    On CUDA the layers become torch's SyncBatchNorm, on the CPU ``CPUSyncBatchNorm``.
    """
    if not any(isinstance(m, _BatchNorm) and not is_synced(m) for m in module.modules()):
        return module
    return _replace(module, nn.SyncBatchNorm if device.type != "cpu" else CPUSyncBatchNorm, to_sync=True)


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Undo ``convert_sync_batchnorm``: each layer it converted is its original BatchNorm class again (same
    parameters and statistics); children in place, the module returned."""
    return _replace(module, None, to_sync=False)


def is_synced(module: nn.Module) -> bool:
    """Whether ``module`` is a synchronised BatchNorm layer (torch's or ours)."""
    return isinstance(module, (nn.SyncBatchNorm, CPUSyncBatchNorm))


def _replace(module: nn.Module, sync_class: type[_BatchNorm] | None, to_sync: bool) -> nn.Module:
    out = module
    if to_sync and isinstance(module, _BatchNorm) and not is_synced(module):
        assert sync_class is not None
        out = _copy_layer(module, sync_class)
        out.__dict__[_ORIGINAL] = type(module)
    elif not to_sync and _ORIGINAL in module.__dict__:
        out = _copy_layer(module, module.__dict__[_ORIGINAL])
    for name, child in module.named_children():
        out.add_module(name, _replace(child, sync_class, to_sync))
    return out


def _copy_layer(module: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """A ``cls`` layer holding ``module``'s parameters and statistics (the same tensors: optimizers keep theirs)."""
    assert isinstance(module, _BatchNorm)
    out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
    if module.affine:
        out.weight, out.bias = module.weight, module.bias
    out.running_mean, out.running_var = module.running_mean, module.running_var
    out.num_batches_tracked = module.num_batches_tracked
    out.training = module.training
    if hasattr(module, "qconfig"):  # quantisation-aware training's per-layer setting (torch's converter keeps it)
        out.qconfig = module.qconfig
    return out

"""A Module's exports: ``to_torchscript`` and ``to_onnx`` (split from module.py by job)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from torchfleet.compiled import jit_scan
from torchfleet.errors import ConfigurationError


class ModuleExport:
    """``to_torchscript`` and ``to_onnx``, a base of ``Module``: they use its ``nn.Module`` side (``eval``, ``train``,
    ``training``) and its ``example_input_array``. (No annotations here: TorchScript reads a class's.)"""

    def to_torchscript(self, file_path: str | os.PathLike | None = None, method: str = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """The module compiled by TorchScript (``method="script"``, or ``"trace"`` with ``example_inputs``, default
        ``example_input_array``), in eval mode; saved to ``file_path`` when given. The module's mode is kept."""
        if method not in ("script", "trace"):
            raise ConfigurationError(f"to_torchscript(method={method!r}): accepted are 'script' and 'trace'.")
        if method == "trace" and example_inputs is None and self.example_input_array is None:
            raise ConfigurationError(
                "to_torchscript(method='trace') needs example inputs: pass example_inputs=..., or set "
                "self.example_input_array."
            )
        training = self.training
        try:
            with torch.no_grad(), jit_scan():
                if method == "script":
                    compiled = torch.jit.script(self.eval(), **kwargs)
                else:
                    inputs = self.example_input_array if example_inputs is None else example_inputs
                    compiled = torch.jit.trace(self.eval(), example_inputs=inputs, **kwargs)
        finally:
            self.train(training)
        if file_path is not None:
            torch.jit.save(compiled, os.fspath(file_path))
        return compiled

    def to_onnx(self, file_path: str | os.PathLike | Any, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export the module (in eval mode) to ONNX with ``torch.onnx.export`` and ``input_sample`` (default
        ``example_input_array``); needs the onnx package (and onnxscript for torch's default exporter)."""
        if importlib.util.find_spec("onnx") is None:
            raise ModuleNotFoundError("to_onnx needs the onnx package, which is not installed: `pip install onnx "
                                      "onnxscript`.")
        if input_sample is None and self.example_input_array is None:
            raise ConfigurationError(
                "to_onnx needs an input to trace the model with: pass input_sample=..., or set "
                "self.example_input_array."
            )
        sample = self.example_input_array if input_sample is None else input_sample
        training = self.training
        try:
            return torch.onnx.export(self.eval(), sample if isinstance(sample, tuple) else (sample,), file_path,
                                     **kwargs)
        finally:
            self.train(training)


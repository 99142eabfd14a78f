"""The helpers Lightning programs import from ``lightning.pytorch.utilities``, under the same module names.

``torchfleet.utilities`` (rank-zero functions, ``CombinedLoader``, ``grad_norm``), ``.rank_zero``, ``.imports``
(``_TORCHVISION_AVAILABLE`` and the other ``_X_AVAILABLE`` flags), ``.seed``, ``.types``, ``.model_summary``,
``.combined_loader``, ``.model_helpers``, ``.grads``, ``.exceptions``, ``.parsing`` (``AttributeDict``,
``lightning_getattr``/``lightning_setattr``, ``is_picklable``), ``.enums`` (``GradClipAlgorithmType``) and ``.throughput``
(``measure_flops``, also here; ``get_available_flops``, ``Throughput``: Lightning's ``lightning.fabric.utilities.throughput``),
and Fabric's ``.apply_func`` (``move_data_to_device``), ``.data``, ``.memory``, ``.parameter_tying``, ``.compile`` and
``.warnings``. The rank-zero helpers themselves live in the leaf module ``torchfleet.rank_zero`` (every layer uses them);
this package sits above the leaves ``errors``, ``compiled``, ``seed`` and ``rank_zero`` and imports nothing else of
torchfleet, so any layer may import it.
"""

from __future__ import annotations

from torchfleet import rank_zero as _rank_zero
from torchfleet.rank_zero import *  # noqa: F403  (rank_zero_only, rank_zero_info/warn/debug/deprecation, cli_logo, ...)
from torchfleet.utilities.apply_func import move_data_to_device
from torchfleet.utilities.combined_loader import CombinedLoader
from torchfleet.utilities.data import suggested_max_num_workers
from torchfleet.utilities.enums import GradClipAlgorithmType, LightningEnum
from torchfleet.utilities.grads import grad_norm
from torchfleet.utilities.parameter_tying import find_shared_parameters, set_shared_parameters
from torchfleet.utilities.parsing import AttributeDict, is_picklable
from torchfleet.utilities.throughput import Throughput, ThroughputMonitor, measure_flops
from torchfleet.utilities.warnings import disable_possible_user_warnings

__all__ = [*_rank_zero.__all__, "AttributeDict", "CombinedLoader", "GradClipAlgorithmType", "LightningEnum", "Throughput",
           "ThroughputMonitor", "disable_possible_user_warnings", "find_shared_parameters", "grad_norm", "is_picklable",
           "measure_flops", "move_data_to_device", "set_shared_parameters", "suggested_max_num_workers"]

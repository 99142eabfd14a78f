"""``lightning.pytorch.utilities.model_summary.model_summary`` under torchfleet's name (docs/porting.md)."""

from torchfleet.utilities.model_summary import (
    LEFTOVER_PARAMS_NAME,
    NOT_APPLICABLE,
    PARAMETER_NUM_UNITS,
    UNKNOWN_SIZE,
    ModelSummary,
    get_formatted_model_size,
    get_human_readable_count,
    parse_batch_shape,
    summarize,
)

__all__ = ["LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "PARAMETER_NUM_UNITS", "UNKNOWN_SIZE", "ModelSummary",
           "get_formatted_model_size", "get_human_readable_count", "parse_batch_shape", "summarize"]

"""Lightning's ``utilities.enums``: string enums that compare equal to their values, case-insensitively."""

from __future__ import annotations

from enum import Enum
from typing import Any


class LightningEnum(str, Enum):
    """A str Enum: a member equals its value (``GradClipAlgorithmType.NORM == "norm"``), in any case."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> LightningEnum:
        """The member named ``value`` (``source="key"``) or whose value it is (``"value"``), in any case."""
        for member in cls:
            if (member.name if source == "key" else member.value).lower() == value.lower():
                return member
        raise ValueError(f"{value!r} is not a {source} of {cls.__name__}: "
                         f"{', '.join(m.name if source == 'key' else m.value for m in cls)}")

    @classmethod
    def _missing_(cls, value: object) -> Any:
        return next((m for m in cls if isinstance(value, str) and m.value.lower() == value.lower()), None)

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __str__(self) -> str:
        return self.value  # as Lightning's (a StrEnum): "value", not "GradClipAlgorithmType.VALUE"

    def __hash__(self) -> int:
        # equal members and strings hash alike, as in a dict keyed by either
        return hash(self.value.lower())


class GradClipAlgorithmType(LightningEnum):
    """How ``gradient_clip_val`` clips: by each gradient's value or by their total norm."""

    VALUE = "value"
    NORM = "norm"

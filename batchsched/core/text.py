"""Text from objects, made safe to put in messages."""
from __future__ import annotations


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (marked with "..."): a hostile
    value quoted in a condition, Event or log line stays short."""
    return text if len(text) <= limit else text[:limit] + "..."

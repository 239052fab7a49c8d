"""What the rest of the core needs of CEL selectors, without loading the
evaluator: ``compile_selector`` imports ``core/dra/cel.py`` (cel-python and
its parser, ~0.2 s to load and build) on first use, so a scheduler whose
cluster has no DeviceClass or claim selector never pays for it at start."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchsched.core.dra.cel import Selector


def compile_selector(expression: str) -> Selector:
    """The selector ``expression`` is, checked (``cel.compile_selector``);
    ``SelectorError`` says why not."""
    from batchsched.core.dra import cel
    return cel.compile_selector(expression)

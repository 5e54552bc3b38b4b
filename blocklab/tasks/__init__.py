"""The built-in toy tasks (docs/concepts.md#toy-tasks), by name: one module per task, one registry
(``TASKS``), and the vocabulary tokenizer they share.

May import: errors, files, nn.
"""

from __future__ import annotations

import inspect

from blocklab.tasks.base import ACCURACY_METRICS, IGNORE_INDEX, Task, TaskData, exact_match
from blocklab.tasks.digits import CopyTask, DigitTask, ReverseTask, SortTask
from blocklab.tasks.listops import ListOpsTask
from blocklab.tasks.listops_padded import PaddedListOpsTask
from blocklab.tasks.text import TextTask
from blocklab.tasks.tiny_lm import TinyLMTask
from blocklab.tasks.vocab import Tokenizer

TASKS: dict[str, type[Task]] = {
    "listops": ListOpsTask,
    "tiny-lm": TinyLMTask,
    "copy": CopyTask,
    "reverse": ReverseTask,
    "sort": SortTask,
    "text": TextTask,
    "listops-padded": PaddedListOpsTask,
}
DEFAULT_TASK = "listops"


def task_options(name: str) -> list[str]:
    """The option names task `name` accepts (its constructor's keyword arguments)."""
    return list(inspect.signature(get_task_class(name)).parameters)


def get_task_class(name: str) -> type[Task]:
    """The Task subclass registered as `name`; ValueError listing the known names."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def task_from_dict(d: dict) -> Task:
    """Inverse of ``Task.to_dict``: rebuild a task from its name and options."""
    if not isinstance(d, dict):
        raise ValueError(f"a task is an object with its name and options, not {type(d).__name__}")
    options = dict(d)
    name = options.pop("name", None)
    if name is None:
        raise ValueError(f"task dict needs a 'name'; got keys {sorted(d)}")
    return get_task(name, **options)


def get_task(name: str = DEFAULT_TASK, **options: object) -> Task:
    """Build task `name` with `options`; ValueError for an unknown task or option."""
    cls = get_task_class(name)
    allowed = task_options(name)
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise ValueError(f"task {name!r} has no option {unknown[0]!r}; its options are: {', '.join(allowed)}")
    return cls(**options)


__all__ = [
    "DEFAULT_TASK",
    "IGNORE_INDEX",
    "TASKS",
    "CopyTask",
    "DigitTask",
    "ListOpsTask",
    "PaddedListOpsTask",
    "ReverseTask",
    "SortTask",
    "Task",
    "TaskData",
    "TextTask",
    "TinyLMTask",
    "Tokenizer",
    "exact_match",
    "ACCURACY_METRICS",
    "get_task",
    "get_task_class",
    "task_from_dict",
    "task_options",
]

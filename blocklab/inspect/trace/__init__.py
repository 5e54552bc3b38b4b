"""The tracer: walk one input through a model and show every stage's numbers (docs/concepts.md#tracer-stages).

``collect_trace`` gathers the numbers (with each stage's operands, ``operands.py``: how its numbers
were computed, which the pages show on hover), ``render_text`` prints them, ``trace_to_dict`` is the
JSON (schema: ``schema.json``, ``SCHEMA_PATH``), ``write_html`` the self-contained page, whose heatmaps
``heatmap.js`` draws (the explore page's too).
"""

from pathlib import Path

from .collect import TRACE_VERSION, collect_trace, trace_to_dict
from .html import render_html, write_html
from .record import NormNumbers, Stage, Trace
from .text import render_text

SCHEMA_PATH = Path(__file__).with_name("schema.json")

__all__ = [
    "SCHEMA_PATH",
    "TRACE_VERSION",
    "NormNumbers",
    "Stage",
    "Trace",
    "collect_trace",
    "render_html",
    "render_text",
    "trace_to_dict",
    "write_html",
]

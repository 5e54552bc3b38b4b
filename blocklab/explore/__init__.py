"""``blocklab explore``: a local web app over the models named at start (docs/explore.md).

explore/session.py  the served models (each under its own lock) and what the page asks of them: the trace
                    (the tracer's JSON, as ``blocklab trace --json``), next-token distributions with a
                    temperature and top k, one generation step, ablations through the hook API, gradients
                    at every stage and each residual connection's identity and branch paths
explore/app.py      the Starlette app: routes, request checks (4xx JSON errors), the static page
explore/static/     the page: plain HTML, CSS and JavaScript, no build step, nothing fetched from elsewhere;
                    its heatmaps are drawn by inspect/trace/heatmap.js, the static trace page's script

Starlette and uvicorn (the optional extra ``blocklab[explore]``) are imported by app.py only, so that
importing blocklab never needs them.

May import: errors, device, files, nn, inspect, tasks, weights.
"""

from .session import Ablation, Explored, Request

__all__ = ["Ablation", "Explored", "Request"]

"""``blocklab claims``: what papers and tutorials say about the block, measured on this machine.

One module per claim (its statement, source, setups, measurement, verdict checks and plot);
``base`` holds what a claim is made of, ``shared`` what the claims share, ``registry`` the list,
``runner`` runs them, ``views`` shows a report.
"""

from .base import OVERALL, VERDICTS, Claim, Setup, Source, Test, Verdict, combine, from_tests
from .registry import CLAIMS, REGISTRY, claims_html, run_claims, select, with_seeds
from .runner import SCHEMA_VERSION, schema
from .views import (
    changelog_markdown,
    claims_details_markdown,
    claims_markdown,
    claims_summary_markdown,
    claims_table,
)

__all__ = [
    "CLAIMS",
    "OVERALL",
    "REGISTRY",
    "SCHEMA_VERSION",
    "VERDICTS",
    "Claim",
    "Setup",
    "Source",
    "Test",
    "Verdict",
    "changelog_markdown",
    "claims_details_markdown",
    "claims_html",
    "claims_markdown",
    "claims_summary_markdown",
    "claims_table",
    "combine",
    "from_tests",
    "run_claims",
    "schema",
    "select",
    "with_seeds",
]

"""Importers: one module per price source, each turning a payload into an ``ImportResult``.

``ImportResult`` (offers, unknown GPU names, rejected rows) lives in ``base``; the SkyPilot
``vms.csv`` parser in ``skypilot``; the bundled snapshot loader in ``snapshot``.
"""

from tuneplan.adapters.importers.base import ImportResult

__all__ = ["ImportResult"]

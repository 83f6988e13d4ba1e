"""Batch formation: pure policies (policies.py) and the scheduler process (process.py)."""

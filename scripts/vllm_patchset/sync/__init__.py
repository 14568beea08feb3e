"""Keeping the series in step with upstream: check, reports, the queue, the rebase."""

"""Placeholder: filled by the move of the run lifecycle out of workflow/runs.py."""

"""Tracked MLflow runs -> pandas -> medians, paper-style tables and figures. Needs no torch."""

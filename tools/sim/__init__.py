"""The deterministic simulation of fencelock (issue 22)."""

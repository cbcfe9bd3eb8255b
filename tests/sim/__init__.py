"""Tests of the simulation tools."""

"""Helpers the tests build things with (not fixtures): tiny models for the smoke harness."""

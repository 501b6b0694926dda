"""Benchmark support that needs no model: datasets, answer grading, statistics, reports.

The model-driving runner lives elsewhere; everything here is pure Python so it can be
tested and used (``bench report``) on any machine.
"""

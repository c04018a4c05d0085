"""Traces and the trace simulator: replay session events through the real decision core."""

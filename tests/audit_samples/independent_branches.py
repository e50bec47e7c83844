"""Found while re-running an in-sample tree: writes under two independent ``if``s (neither an else of
the other) are read as branch groups; which group the audit reports must not depend on the order a
set happens to give, so the same file gives the same finding on every run."""
import torch


def row_with_marker(width, marker, with_marker):
    row = torch.empty(width + (1 if with_marker else 0), dtype=torch.long)
    if width > 0:
        row[:width] = 7
    if with_marker:
        row[width] = marker
    return row.repeat(3)

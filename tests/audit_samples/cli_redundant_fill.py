"""Sample for tests/test_audit_cli.py: a zero fill that a whole copy then overwrites (one finding)."""
import torch


def scaled_copy(x):
    out = torch.zeros_like(x)
    out.copy_(x * 2)
    return out

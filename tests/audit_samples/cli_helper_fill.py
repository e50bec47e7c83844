"""Sample for tests/test_audit_cli.py: an allocation helper returns a zero fill that its caller
overwrites whole (followed through the caller, also across worker processes)."""
import torch


def new_buffer(n):
    return torch.zeros(n)


def fill_from(x):
    buf = new_buffer(x.numel())
    buf.copy_(x.flatten())
    return buf

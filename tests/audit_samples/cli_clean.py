"""Sample for tests/test_audit_cli.py: a zero fill that is then accumulated into (needed: no finding)."""
import torch


def running_sum(xs):
    acc = torch.zeros(4)
    for x in xs:
        acc += x
    return acc

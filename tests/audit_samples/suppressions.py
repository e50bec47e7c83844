"""Item 5: deliberate cases marked where they are allocated, with a reason (and one without)."""
import torch


def demo_redundant_fill(z):
    z_out = torch.empty_like(z)
    z_out.zero_()  # audit: ok -- the redundant fill this demo times
    z_out[:] = z
    return z_out


def demo_comment_above(z):
    # audit: ok -- kept to show the cost of a memset
    out = torch.zeros_like(z)
    out.copy_(z)
    return out


def no_reason(z):
    out = torch.zeros_like(z)  # audit: ok
    out.copy_(z)
    return out


def not_suppressed(z):
    out = torch.zeros_like(z)
    out.copy_(z)
    return out

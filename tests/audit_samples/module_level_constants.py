"""Sizes and bounds written with module-level names, written after the 16th out-of-sample check (a
block of 256 columns whose width is a constant of the module, written in eight slices that reach it).
A name the module assigns once, to an integer constant expression, means that integer in a size and in
a bound; one assigned twice, or again inside a function, stays a name."""
import torch

COLUMNS = 256            # once, to an integer: the width of each block
HALF = COLUMNS // 2      # once, from another constant
WIDER = COLUMNS + 64     # once, but past what the writes reach
TUNED = 256
TUNED = 512              # assigned twice: which value holds is not read
LATE = 256


def configure(width):
    global LATE
    LATE = width         # assigned again in a function: not a constant


def blocks_of_a_module_width(n, src):
    q = torch.empty(n, COLUMNS, dtype=torch.int16)
    q[:, 0:32] = src
    q[:, 32:64] = src
    q[:, 64:96] = src
    q[:, 96:HALF] = src
    q[:, HALF:160] = src
    q[:, 160:192] = src
    q[:, 192:224] = src
    q[:, 224:256] = src
    q -= 32
    return q


def blocks_short_of_a_wider_constant(n, src):
    q = torch.empty(n, WIDER, dtype=torch.int16)
    q[:, 0:128] = src
    q[:, 128:256] = src
    q -= 32
    return q


def blocks_of_a_width_assigned_twice(n, src):
    q = torch.empty(n, TUNED, dtype=torch.int16)
    q[:, 0:96] = src
    q[:, 96:256] = src
    q -= 32
    return q


def blocks_of_a_width_a_function_reassigns(n, src):
    q = torch.empty(n, LATE, dtype=torch.int16)
    q[:, 0:96] = src
    q[:, 96:256] = src
    q -= 32
    return q


def blocks_of_a_width_given_as_a_parameter(n, src, COLUMNS):
    q = torch.empty(n, COLUMNS, dtype=torch.int16)    # the parameter hides the module's constant
    q[:, 0:32] = src
    q[:, 32:64] = src
    q[:, 64:96] = src
    q[:, 96:256] = src
    q -= 32
    return q
